"""A runtime's tensor-core GEMM kernel for a weight format: its CTA tile rows and split-K.

Some stacks run a format's matmuls through a library kernel whose CTA tile has a fixed number of
activation rows and no split-K at any M: cuBLAS's sm90 FP8 kernels, e.g.
``sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128_..._segment_k_off`` (the token
side of the tile is 128 rows; ``segment_k_off``: the K loop is not split across CTAs). A runtime
says so with ``[gemm.FORMAT]``::

    [gemm.fp8-e4m3]
    rows = 128        # activation rows per CTA tile: M is padded to (and tiled by) this
    split_k = false   # false: one CTA per output tile, so only N / tile_n x M tiles run

The plan then pads M to ``rows`` (the matrix units compute the padded rows: at M = 1 a CTA
issues 128 rows of MMAs per weight it reads), tiles M by ``rows``, runs the matmul on the
matrix path (no CUDA-core GEMV) and, with ``split_k = false``, never splits K.

A kernel without split-K may also say what its CTAs keep in flight (``in_flight``, the shape of
a GEMV's: threads per CTA, output columns per CTA, weight bytes each thread keeps requested, the
activation rows up to which one CTA row covers M): its N / columns CTAs (at most the device's
``[occupancy]`` allows per core) then stream weights no faster than Little's law lets them,
bytes in flight over the tier's latency. That is what a shard with few output tiles costs on a
kernel that does not split K (AITER's a8w8 GEMMs on the MI300X: validation/kernels.toml).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memsim.datafile import check_keys, require_bool, require_int, require_table
from memsim.errors import ConfigError
from memsim.formats import FORMATS
from memsim.instructions import InFlight, parse_in_flight


@dataclass(frozen=True)
class GemmTile:
    """A runtime's GEMM kernel shape for one weight format."""

    rows: int          # activation rows per CTA tile (M padding and M tile)
    split_k: bool      # False: the kernel never splits K across CTAs
    in_flight: InFlight | None = None   # what each CTA keeps requested (split_k false only)


def parse_gemm_tiles(table: Any, *, file: str,
                     field: str = "gemm") -> tuple[tuple[str, GemmTile], ...]:
    """A runtime's ``[gemm]`` table: ``gemm.FORMAT = {rows = N, split_k = BOOL}``, with an
    optional ``in_flight`` table where ``split_k`` is false."""
    table = require_table(table, file=file, field=field)
    out = []
    for name, spec in table.items():
        where = f"{field}.{name}"
        if name not in FORMATS:
            raise ConfigError(f"unknown format {name!r}; expected a format name",
                              file=file, field=where)
        spec = require_table(spec, file=file, field=where)
        check_keys(spec, required=("rows", "split_k"), optional=("in_flight",), file=file,
                   prefix=where + ".")
        split_k = require_bool(spec["split_k"], file=file, field=f"{where}.split_k")
        in_flight = None
        if "in_flight" in spec:
            if split_k:
                raise ConfigError("in_flight bounds a kernel whose CTAs each cover whole output "
                                  "columns; it needs split_k = false", file=file,
                                  field=f"{where}.in_flight")
            in_flight = parse_in_flight(spec["in_flight"], file=file, field=f"{where}.in_flight")
        out.append((str(name), GemmTile(
            rows=require_int(spec["rows"], file=file, field=f"{where}.rows"),
            split_k=split_k, in_flight=in_flight)))
    return tuple(out)
