"""Instruction mixes of small-batch GEMV kernels and the issue rates of the cores that run them.

A low-bit GEMV (llama.cpp's ``mul_mat_vec_q``, its Metal ``kernel_mul_mv_*``, gpt-fast's compiled
int8 matvec, tinygemm) spends instructions on every weight: unpacking, integer dot products,
conversions, FP32 accumulation and loads. A runtime file counts them per weight by class
(``[gemv.FORMAT]``: ``per_weight``, shared by every activation row of the batch, and
``per_weight_row``, paid once per row); a device file gives, per core and clock, the rate of
each pipe that executes them and the total issue rate (``[issue]``). A GEMV work unit of ``w``
weights and ``m`` rows on one core then takes ``w * max over pipes of (sum of its classes'
instructions) / (pipe rate x clock)``; memory is the wave's other bound (kernels/step.py).

Classes (one instruction = one thread's instruction; a warp or SIMD-group instruction is 32):

=========  =====================================================================================
int        integer add, compare, logic, byte permute (IADD3, LOP3, PRMT, ISETP; Apple BITWISE32)
shift      bit shifts and bit-field extracts (SHF, BFE; Apple LSHIFT32, BITEXTRACT32)
imad       integer multiply-add and dot products (IMAD, IDP4A; Apple IMAD32)
fp32       FP32 FFMA, FMUL, FADD
fp16       16-bit FP (HFMA2, HADD2, and HADD2.F32, the half-to-float conversion nvcc emits)
convert    type conversions on the conversion pipe (I2F, F2I, F2F; Apple CONVERT)
load       loads from global, shared or threadgroup memory, one per thread and instruction
mma        tensor-core multiply-adds (a warp's m16n8k16 MMA is 2,048); not issue slots: the MMA
           instruction's own issue slot is counted under ``fp16``
=========  =====================================================================================

The issue limit (``[issue] per_clock``) bounds every class but ``mma``.

Memory-level parallelism: a ``[gemv.FORMAT]`` table may also say how the kernel keeps weight
bytes in flight (``in_flight``: threads per block, output rows per block, the weight bytes one
thread has requested and not yet used, the most activation rows it runs at). With a device's
``[occupancy]`` limits (resident threads and blocks per core, from the CUDA guide) this bounds
the kernel's bandwidth by Little's law: bytes in flight over the tier's latency
(:func:`mlp_columns`; kernels/step.py applies it per wave).

A device with no ``[issue]`` table gets :func:`default_pipes`: every instruction at the rate of
its vector unit's FMAs (``compute.vector`` / 2 FLOP per FMA), the only figure every file has.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memsim.datafile import check_keys, require_str, require_table
from memsim.errors import ConfigError
from memsim.formats import FORMATS

CLASSES = ("int", "shift", "imad", "fp32", "fp16", "convert", "load", "mma")
#: Classes that take issue slots (an MMA's multiply-adds run on the tensor pipe).
ISSUED = CLASSES[:-1]
#: Pipes one device may list, the issue limit included (the kernels' op table has two columns
#: per pipe: ``kernels.step.N_GEMV_PIPES``).
MAX_PIPES = 8
ISSUE = "issue"


@dataclass(frozen=True)
class Pipe:
    """One execution limit of a core: ``per_clock`` instructions of ``classes`` per clock."""

    name: str
    per_clock: float
    classes: tuple[str, ...]


@dataclass(frozen=True)
class InFlight:
    """Weight bytes a GEMV kernel keeps requested per thread, and the block shape it runs."""

    threads_per_block: int
    rows_per_block: int
    bytes_per_thread: float
    max_rows: int


@dataclass(frozen=True)
class Occupancy:
    """Resident threads and blocks one core holds at most (CUDA guide, per compute capability)."""

    threads_per_core: int
    blocks_per_core: int


@dataclass(frozen=True)
class InstructionMix:
    """Instructions per stored weight, by class (in :data:`CLASSES` order).

    ``per_weight`` is paid once per weight whatever the batch; ``per_weight_row`` once per
    weight and activation row.
    """

    per_weight: tuple[float, ...]
    per_weight_row: tuple[float, ...]
    in_flight: InFlight | None = None

    def total(self, rows: int) -> float:
        """Issued instructions per weight at ``rows`` activation rows (``mma`` excluded)."""
        issued = len(ISSUED)
        return sum(self.per_weight[:issued]) + rows * sum(self.per_weight_row[:issued])


def _positive(value: Any, *, file: str, field: str, allow_zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise ConfigError(f"expected a number, got {value!r}", file=file, field=field)
    if value < 0 or (value == 0 and not allow_zero) or value > 1e6:
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"expected a number {bound} and at most 1e6, got {value!r}",
                          file=file, field=field)
    return float(value)


def parse_pipes(table: Any, *, file: str, field: str = "issue") -> tuple[Pipe, ...]:
    """A device's ``[issue]`` table: ``per_clock`` (all classes) and ``pipes.NAME`` =
    ``{per_clock = N, classes = [...]}``; rates are per core and clock."""
    table = require_table(table, file=file, field=field)
    check_keys(table, required=("per_clock",), optional=("pipes",), file=file,
               prefix=field + ".")
    pipes = [Pipe(ISSUE, _positive(table["per_clock"], file=file, field=f"{field}.per_clock",
                                   allow_zero=False), ISSUED)]
    raw = require_table(table.get("pipes", {}), file=file, field=f"{field}.pipes")
    for name, spec in raw.items():
        where = f"{field}.pipes.{name}"
        spec = require_table(spec, file=file, field=where)
        check_keys(spec, required=("per_clock", "classes"), file=file, prefix=where + ".")
        classes = spec["classes"]
        if not isinstance(classes, list) or not classes:
            raise ConfigError(f"expected a non-empty list of classes ({', '.join(CLASSES)})",
                              file=file, field=f"{where}.classes")
        for cls in classes:
            require_str(cls, file=file, field=f"{where}.classes", choices=CLASSES)
        rate = _positive(spec["per_clock"], file=file, field=f"{where}.per_clock",
                         allow_zero=False)
        pipes.append(Pipe(str(name), rate, tuple(str(c) for c in classes)))
    if len(pipes) > MAX_PIPES:
        raise ConfigError(f"{len(pipes) - 1} pipes listed; at most {MAX_PIPES - 1}",
                          file=file, field=f"{field}.pipes")
    return tuple(pipes)


def default_pipes(vector_ops_per_s: float, cores: int, clock_hz: float) -> tuple[Pipe, ...]:
    """One issue limit at the vector unit's FMA rate: ``vector`` FLOP/s over 2 FLOP per FMA,
    per core and clock [D]: a device file without ``[issue]`` gives no other rate."""
    return (Pipe(ISSUE, vector_ops_per_s / 2.0 / cores / clock_hz, ISSUED),)


def _class_counts(table: Any, *, file: str, field: str) -> tuple[float, ...]:
    table = require_table(table, file=file, field=field)
    check_keys(table, required=(), optional=CLASSES, file=file, prefix=field + ".")
    return tuple(_positive(table.get(c, 0), file=file, field=f"{field}.{c}", allow_zero=True)
                 for c in CLASSES)


def parse_mixes(table: Any, *, file: str,
                field: str = "gemv") -> tuple[tuple[str, InstructionMix], ...]:
    """A runtime's ``[gemv]`` table: ``gemv.FORMAT`` = ``{per_weight = {...},
    per_weight_row = {...}}`` with instruction counts by class; ``FORMAT`` is a format name,
    or ``int4`` for every ``int4-gN``."""
    table = require_table(table, file=file, field=field)
    out = []
    for name, spec in table.items():
        where = f"{field}.{name}"
        if name not in FORMATS and name != "int4":
            raise ConfigError(f"unknown format {name!r}; expected a format name or 'int4'",
                              file=file, field=where)
        spec = require_table(spec, file=file, field=where)
        check_keys(spec, required=("per_weight", "per_weight_row"), optional=("in_flight",),
                   file=file, prefix=where + ".")
        in_flight = (parse_in_flight(spec["in_flight"], file=file, field=f"{where}.in_flight")
                     if "in_flight" in spec else None)
        mix = InstructionMix(_class_counts(spec["per_weight"], file=file,
                                           field=f"{where}.per_weight"),
                             _class_counts(spec["per_weight_row"], file=file,
                                           field=f"{where}.per_weight_row"), in_flight)
        if sum(mix.per_weight) + sum(mix.per_weight_row) == 0:
            raise ConfigError("a GEMV runs at least one instruction per weight", file=file,
                              field=where)
        out.append((str(name), mix))
    return tuple(out)


def _count(value: Any, *, file: str, field: str, limit: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
        raise ConfigError(f"expected a whole number from 1 to {limit}, got {value!r}",
                          file=file, field=field)
    return value


def parse_in_flight(table: Any, *, file: str, field: str) -> InFlight:
    """An ``in_flight`` table: a kernel's block shape and the weight bytes a thread keeps
    requested (a GEMV's, or a GEMM CTA's K step: ``[gemm.FORMAT]``)."""
    table = require_table(table, file=file, field=field)
    keys = ("threads_per_block", "rows_per_block", "bytes_per_thread", "max_rows")
    check_keys(table, required=keys, file=file, prefix=field + ".")
    return InFlight(
        _count(table["threads_per_block"], file=file, field=f"{field}.threads_per_block",
               limit=1024),
        _count(table["rows_per_block"], file=file, field=f"{field}.rows_per_block", limit=1024),
        _positive(table["bytes_per_thread"], file=file, field=f"{field}.bytes_per_thread",
                  allow_zero=False),
        _count(table["max_rows"], file=file, field=f"{field}.max_rows", limit=1024))


def parse_occupancy(table: Any, *, file: str, field: str = "occupancy") -> Occupancy:
    """A device's ``[occupancy]`` table: ``threads_per_core`` and ``blocks_per_core``."""
    table = require_table(table, file=file, field=field)
    check_keys(table, required=("threads_per_core", "blocks_per_core"), file=file,
               prefix=field + ".")
    return Occupancy(
        _count(table["threads_per_core"], file=file, field=f"{field}.threads_per_core",
               limit=65536),
        _count(table["blocks_per_core"], file=file, field=f"{field}.blocks_per_core",
               limit=1024))


#: Op-table columns of the in-flight bound (``kernels.step.N_MLP_COLS``): bytes in flight per
#: block, resident blocks per core, output rows per block, most activation rows.
MLP_COLUMNS = 4


def mlp_columns(occupancy: Occupancy | None, mix: InstructionMix | None) -> tuple[float, ...]:
    """The in-flight bound's op-table columns for a GEMV's instruction mix; zeros when the
    kernel or the device gives none (see :func:`in_flight_columns`)."""
    return in_flight_columns(occupancy, mix.in_flight if mix is not None else None)


def in_flight_columns(occupancy: Occupancy | None, f: InFlight | None) -> tuple[float, ...]:
    """The in-flight bound's op-table columns; zeros when the kernel or the device gives none.

    Resident blocks per core are the fewer of the block limit and the thread limit over the
    block's threads [V: CUDA guide]; registers and shared memory are not counted (their use by
    the kernels named here is not published), so the bound is the largest the block shape
    allows."""
    if occupancy is None or f is None:
        return (0.0,) * MLP_COLUMNS
    blocks = min(occupancy.blocks_per_core, occupancy.threads_per_core // f.threads_per_block)
    return (f.threads_per_block * f.bytes_per_thread, float(blocks), float(f.rows_per_block),
            float(f.max_rows))


def mix_for(mixes: Mapping[str, InstructionMix], fmt_name: str) -> InstructionMix | None:
    """The runtime's mix for a format (``int4`` covers every ``int4-gN``), or None."""
    if fmt_name in mixes:
        return mixes[fmt_name]
    if fmt_name.startswith("int4-g"):
        return mixes.get("int4")
    return None


def gemv_seconds(pipes: tuple[Pipe, ...], clock_hz: float,
                 mix: InstructionMix) -> tuple[float, ...]:
    """Per pipe, seconds per weight on one core: ``MAX_PIPES`` fixed parts then ``MAX_PIPES``
    per-row parts (zeros for pipes not listed). A unit's time is ``weights * max over pipes of
    (fixed + rows * per_row)``."""
    fixed = [0.0] * MAX_PIPES
    per_row = [0.0] * MAX_PIPES
    for i, pipe in enumerate(pipes):
        seconds_per_instruction = 1.0 / (pipe.per_clock * clock_hz)
        for c, cls in enumerate(CLASSES):
            if cls in pipe.classes:
                fixed[i] += mix.per_weight[c] * seconds_per_instruction
                per_row[i] += mix.per_weight_row[c] * seconds_per_instruction
    return tuple(fixed + per_row)
