"""The limits memsim enforces, in one place: figure ranges and the largest count a plan can make.

Two kinds of limit (``docs/limits.md`` lists them with their reasons):

- **Figure ranges** (:data:`FIGURE_RANGES`): every device figure must lie in a physically
  meaningful range, so that no figure makes an infinity or a zero downstream (``clock = "1e-30
  Hz"``, ``per_flop = "1e300 J/FLOP"``). :func:`check_figure` refuses the rest, naming the range.
- **Sizes** (:func:`check_sizes`): counts are exact int64 integers, so before planning the
  largest count one step can reach (weight bits, the KV cache's bits at the final context,
  FLOPs, tiles) is computed from the model's shape, the workload and the device, with Python
  integers that cannot wrap, and a workload that could pass ``2**63 - 1`` is refused. A model's
  shape is held to the limits a model file is read with (:func:`memsim.model.check_model`), so a
  million layers are refused before they plan for hours, whether they came from a file or Python.

Example::

    >>> check_sizes(memsim.device("h100-sxm"), memsim.model("llama-3-8b"), Decode())  # no error
"""

from __future__ import annotations

import math
from functools import lru_cache
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from memsim.errors import ConfigError
from memsim.checkpoints import ROLES, weight_formats
from memsim.formats import Format, get_format
from memsim.model import check_model
from memsim.units import format_quantity

if TYPE_CHECKING:  # the data floor: limits is imported by device.py, so no runtime import back
    from memsim.device import Device
    from memsim.model import Model
    from memsim.workload import Decode

__all__ = ["FIGURE_RANGES", "INT64_MAX", "MAX_STEPS", "MAX_DRAFT_HEADS", "MAX_TILE_ELEMENTS",
           "MAX_SAMPLES", "MAX_GAMMA", "FigureRange", "check_figure", "check_int64", "check_samples",
           "check_sizes", "largest_counts"]

#: The largest value of a signed 64-bit counter: every byte, bit, FLOP and tile count of a plan
#: and of the kernels is an int64.
INT64_MAX = 2**63 - 1

#: Workload and tile limits below which planning stays fast (a model's shape limits are
#: memsim.model.LIMITS, the ones its files are read with).
MAX_STEPS = 4096               # decode steps emulated in one run
MAX_DRAFT_HEADS = 64           # self-drafting heads (Medusa: 5; Hydra: 4; EAGLE: one layer)
MAX_TILE_ELEMENTS = 2**32      # tile_k x tile_n of one weight tile
MAX_TILE_SIDE = 2**24          # tile_k or tile_n alone
#: Monte Carlo draws of a speculative run (``--samples``): 10^7 draws take seconds.
MAX_SAMPLES = 10**7
#: Draft tokens per speculative iteration: a verification of gamma + 1 tokens per sequence, far
#: past any published draft length (EAGLE-2's trees verify ~60 tokens).
MAX_GAMMA = 4096


@dataclass(frozen=True)
class FigureRange:
    """A closed range ``[low, high]`` of one kind of figure, in base SI units.

    ``low_open`` makes the low end exclusive (a clock must be above 0, not at it).
    """

    dimension: str
    low: float
    high: float
    low_open: bool = False
    why: str = ""

    def contains(self, value: float) -> bool:
        """True when ``value`` lies in the range."""
        above = value > self.low if self.low_open else value >= self.low
        return above and value <= self.high

    def text(self) -> str:
        """The range as a reader writes it: ``1 MHz to 100 GHz``, ``1 B to 64 PiB``."""
        return (f"{'above ' if self.low_open else ''}{self.show(self.low)} to "
                f"{self.show(self.high)}")

    def show(self, value: float) -> str:
        """A value of this range's dimension, as the range writes it."""
        if self.dimension == "count":
            return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"
        return format_quantity(value, self.dimension, binary=self.dimension == "capacity")


#: Range of each kind of device figure. Keys are what ``check_figure`` takes; docs/limits.md
#: gives each one's reason.
FIGURE_RANGES = MappingProxyType({
    "clock": FigureRange("frequency", 1e6, 1e11, why="1 MHz to 100 GHz: any digital chip"),
    "compute": FigureRange("compute_rate", 1e6, 1e19,
                           why="1 MFLOPS (a microcontroller) to 10 EFLOPS (80x WSE-3's "
                               "sparse 125 PFLOPS)"),
    "capacity": FigureRange("capacity", 1, 2**56,
                            why="1 B to 64 PiB per tier per chip: 8 x 2^56 bits leave room in "
                                "an int64 bit counter (MemoryX, the largest tier, is 1.2 PB)"),
    "granularity": FigureRange("capacity", 1, 2**20,
                               why="1 B to 1 MiB, a whole number of bytes (DRAM bursts are "
                                   "32-64 B, NVMe pages 4-16 KiB)"),
    "core_memory": FigureRange("capacity", 1, 2**34, why="1 B to 16 GiB, a whole number of "
                                                         "bytes"),
    "bandwidth": FigureRange("bandwidth", 1e3, 1e18,
                             why="1 kB/s to 1 EB/s (WSE-3's on-wafer SRAM: 21 PB/s)"),
    "latency": FigureRange("time", 0.0, 1e-2,
                           why="0 to 10 ms: NVMe reads take ~100 us, network hops a few us"),
    "energy_per_bit": FigureRange("energy_per_bit", 0.0, 1e-9,
                                  why="0 to 1 nJ/bit (NVMe at system level: ~0.1 nJ/bit)"),
    "energy_per_op": FigureRange("energy_per_op", 0.0, 1e-9,
                                 why="0 to 1 nJ/FLOP (2010s GPUs: ~10-100 pJ/FLOP)"),
    "power": FigureRange("power", 0.0, 1e5, low_open=True,
                         why="above 0 W to 100 kW (a CS-3 system: ~23 kW)"),
    "cores": FigureRange("count", 1, 10**7, why="1 to 10 million (WSE-3: 900,000)"),
    "matrix_unit": FigureRange("count", 1, 65536, why="1 to 65,536 per side (Groq: 320)"),
    "tile": FigureRange("count", 1, MAX_TILE_SIDE, why="1 to 2^24 elements per side"),
    "chips": FigureRange("count", 1, 2**24, why="1 to 16.7 million chips"),
    "ranks_per_chip": FigureRange("count", 1, 1024,
                                  why="1 to 1,024 tensor-parallel ranks per chip (one per core: "
                                      "Inferentia2 runs 2, Trainium2 8)"),
})


def check_figure(value: float, kind: str, *, file: str | None, field: str) -> float:
    """``value`` if it lies in ``FIGURE_RANGES[kind]``, else a ConfigError naming the range.

    Raises
    ------
    ConfigError
        ``"outside memsim's range for ...: LOW to HIGH (docs/limits.md)"``.
    """
    limit = FIGURE_RANGES[kind]
    if not (isinstance(value, (int, float)) and math.isfinite(value) and limit.contains(value)):
        finite = isinstance(value, (int, float)) and math.isfinite(value)
        shown = limit.show(value) if finite and abs(value) < 1e300 else repr(value)
        raise ConfigError(f"{shown} is outside memsim's range for {kind.replace('_', ' ')}: "
                          f"{limit.text()} (docs/limits.md)", file=file, field=field)
    return value


def check_int64(value: int, *, field: str, file: str | None = None) -> int:
    """``value`` if it fits a signed 64-bit integer, else a ConfigError naming the limit."""
    if not -INT64_MAX - 1 <= value <= INT64_MAX:
        raise ConfigError(f"{value} does not fit a 64-bit integer (largest {INT64_MAX})",
                          file=file, field=field)
    return value


def check_samples(samples: int) -> int:
    """``samples`` if it is at most :data:`MAX_SAMPLES` Monte Carlo draws."""
    if samples > MAX_SAMPLES:
        raise ConfigError(f"at most {MAX_SAMPLES:,} Monte Carlo draws, got {samples:,}",
                          field="samples")
    return samples


def _check_shape(model: Model, workload: Decode) -> None:
    """The model's shape within a model file's limits; steps and draft heads within theirs."""
    check_model(model)
    for name, value, largest in (("steps", workload.steps, MAX_STEPS),
                                 ("draft_heads", workload.draft_heads, MAX_DRAFT_HEADS)):
        if value > largest:
            raise ConfigError(f"the workload's {name} = {value:,} is above memsim's limit of "
                              f"{largest:,} (docs/limits.md)", field=name)


def _widest_weight_format(model: Model, weights: str) -> Format:
    """The checkpoint's widest weight format (an upper bound for every role's bits)."""
    return _widest_format(model.layers, weights)


@lru_cache(maxsize=256)
def _widest_format(layers: int, weights: str) -> Format:
    formats = weight_formats(weights)
    found = [formats.for_tensor(role, layer, layers) for role in ROLES
             for layer in range(min(layers, 8)) if role not in ("embedding", "lm_head")]
    found += [formats.for_tensor(role, -1, layers) for role in ("embedding", "lm_head")]
    return max(found, key=lambda f: f.tensor_bits((1, 4096)))


@lru_cache(maxsize=256)
def _model_figures(model: Model, weights: str, kv: str,
                   draft_heads: int) -> tuple[int, int, int, int, int]:
    """What :func:`largest_counts` takes of the model alone, worked out once per model and
    formats: its parameters with the draft heads', their bits in the widest weight format
    (metadata included), a KV row's bits, the active parameters, the widest element's bits."""
    wfmt, kvfmt = _widest_weight_format(model, weights), get_format(kv)
    # each self-drafting head: a hidden x hidden residual block and a vocabulary projection
    params = max(model.total_params, 1) + draft_heads * model.hidden * (
        model.hidden + model.vocab)
    k = max(model.hidden, 1)
    weights_bits = wfmt.tensor_bits((-(-params // k) + model.layers * 16, k))
    kv_row = kvfmt.tensor_bits((1, model.head_dim)) + kvfmt.tensor_meta_bits
    return params, weights_bits, kv_row, model.active_params, wfmt.element_bits


def largest_counts(device: Device, model: Model, workload: Decode) -> dict[str, int]:
    """Upper bounds of the largest counts one decode step can reach, as Python ints.

    The kernels count per op and per step in int64, and a step's counters are summed over its
    ops; so each bound is a whole step's total on one chip (no sharding assumed), at the last
    step, where the context is longest.

    Returns
    -------
    dict
        ``weights_bits`` (every weight of the model once, metadata included),
        ``kv_bits`` (the KV cache of the whole batch at the final context, whole blocks),
        ``flops`` (the step's matmul and attention operations, the batch padded to the matrix
        unit), ``tile_bits`` (one weight tile), ``tiles`` (the step's weight tiles).
    """
    tile_k = workload.tile_k or device.tile_k
    tile_n = workload.tile_n or device.tile_n
    steps, new = workload.steps, workload.new_tokens
    try:
        figures = _model_figures(model, workload.weights, workload.kv, workload.draft_heads)
    except TypeError:                  # a Model built in Python with unhashable fields
        figures = _model_figures.__wrapped__(model, workload.weights, workload.kv,
                                             workload.draft_heads)
    params, weights_bits, kv_row, active_params, element_bits = figures
    final_tokens = workload.context + steps * new
    block = workload.kv_block
    kv_tokens = -(-final_tokens // block) * block
    kv_bits = workload.batch * kv_tokens * model.kv_parts * model.layers * model.kv_heads * kv_row
    rows = max(workload.step_tokens, device.matrix_unit[0])
    rows = -(-rows // device.matrix_unit[0]) * device.matrix_unit[0]
    attention = (4 * model.layers * model.heads * model.head_dim
                 * (final_tokens * workload.batch * new
                    + (workload.prefill_context + 2 * workload.prefill_chunk * steps)
                    * workload.prefill_chunk))
    flops = 2 * active_params * rows + attention
    tile_bits = tile_k * tile_n * max(element_bits, 16)
    tiles = params // max(tile_k * tile_n, 1) + model.layers * (16 + model.experts)
    return {"weights_bits": weights_bits, "kv_bits": kv_bits, "flops": flops,
            "tile_bits": tile_bits, "tiles": tiles * max(rows // device.matrix_unit[0], 1)}


def check_sizes(device: Device, model: Model, workload: Decode) -> None:
    """Refuse, before planning, a workload whose counts could wrap int64 or take hours to plan.

    Checks the model's shape against a model file's limits (:func:`memsim.model.check_model`),
    the workload's steps against :data:`MAX_STEPS`, the tile against
    :data:`MAX_TILE_SIDE` and :data:`MAX_TILE_ELEMENTS`, and every count of
    :func:`largest_counts` against ``INT64_MAX / SIZE_HEADROOM``.

    Raises
    ------
    ConfigError
        Naming the field and the limit it passes.
    """
    _check_shape(model, workload)
    for name in ("tile_k", "tile_n"):
        side = getattr(workload, name) or getattr(device, name)
        if side > MAX_TILE_SIDE:
            raise ConfigError(f"{side:,} elements is above memsim's tile limit of "
                              f"{MAX_TILE_SIDE:,} per side (docs/limits.md)", field=name)
    tile_k = workload.tile_k or device.tile_k
    tile_n = workload.tile_n or device.tile_n
    if tile_k * tile_n > MAX_TILE_ELEMENTS:
        raise ConfigError(f"a {tile_k:,} x {tile_n:,} tile is above memsim's limit of "
                          f"{MAX_TILE_ELEMENTS:,} elements (docs/limits.md)", field="tile_n")
    fields = {"weights_bits": ("weights", "the model's weight bits"),
              "kv_bits": ("context", "the KV cache's bits at the final context x batch"),
              "flops": ("batch", "one step's FLOPs"),
              "tile_bits": ("tile_n", "one weight tile's bits"),
              "tiles": ("tile_n", "one step's weight tiles")}
    for name, count in largest_counts(device, model, workload).items():
        if count > INT64_MAX:
            field, what = fields[name]
            raise ConfigError(f"{what} could reach {count:.3e}, past the exact int64 counters' "
                              f"limit of 2^63 - 1 = {INT64_MAX:.3e} (docs/limits.md); reduce "
                              f"batch, context or the model", field=field)
