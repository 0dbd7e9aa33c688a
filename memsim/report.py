"""The result of an emulation: exact per-tier bytes, hits, flops, time, energy, per op and in total."""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memsim.kernels import step as k
from memsim.kernels.summary import group_totals, time_sums
from memsim.units import format_quantity


@dataclass(frozen=True)
class StepCounts:
    """Raw counters of one emulated step, as the kernel wrote them (bits and seconds)."""

    step: int
    read_bits: np.ndarray      # [op, tier]
    written_bits: np.ndarray   # [op, tier]
    results: np.ndarray        # [op, k.R_*]
    times: np.ndarray          # [op, tiers..., link, compute, latency, launch]


@dataclass(frozen=True)
class ChipHoldings:
    """What one chip of a pipeline stage holds, per tier, and what the tiered policy spilled."""

    stage: int
    layers: tuple[int, ...]
    weights: dict[str, int]
    kv: dict[str, int]
    spilled: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain data."""
        return {"stage": self.stage, "layers": list(self.layers), "weights": dict(self.weights),
                "kv": dict(self.kv), "spilled": list(self.spilled)}


@dataclass(frozen=True)
class OpRow:
    """One op of a step: bytes through each tier, tiles, work, time and what bound it."""

    index: int
    layer: int
    name: str
    bytes_read: dict[str, int]
    bytes_written: dict[str, int]
    link_bytes: int
    stage: int
    microbatch: int
    hits: int
    misses: int
    flops: int
    vector_ops: int
    waves: int
    time_s: float
    cycles: float
    bound_by: str

    def to_dict(self) -> dict[str, Any]:
        """Plain data."""
        return {
            "index": self.index, "stage": self.stage, "microbatch": self.microbatch,
            "layer": self.layer, "op": self.name,
            "bytes_read": dict(self.bytes_read), "bytes_written": dict(self.bytes_written),
            "link_bytes": self.link_bytes,
            "hits": self.hits, "misses": self.misses, "flops": self.flops,
            "vector_ops": self.vector_ops, "waves": self.waves, "time_s": self.time_s,
            "cycles": self.cycles, "bound_by": self.bound_by,
        }


def _bytes(bits: np.ndarray) -> np.ndarray:
    """Bits to whole bytes, per op (an op's tensor rounds up to its last byte)."""
    return (bits + 7) // 8


@dataclass(frozen=True)
class StepSummary:
    """Totals of one step over the whole system (every chip), and per chip of each stage.

    ``time_s`` is the step's critical path through the pipeline: the longer of one
    microbatch's way through every stage and the busiest stage's work for all microbatches
    (equal to the sum of every op's time on one chip without pipelining), plus the runtime's
    host time per step where it is not overlapped. ``time_by_bound`` splits that time by what
    bound each op (``host``: the runtime's host work); ``time_split`` by what the time was
    spent on: ``weights`` (embedding, norms, matmuls), ``kv`` (attention and KV appends),
    ``collectives`` (collectives, pipeline hand-offs, all-to-all), ``kernel_fixed`` (each
    kernel's own time that streams nothing, when the device has a ``kernel_fixed``),
    ``launch`` (kernel launches), ``host`` and ``pipeline_idle`` (the step less the average
    chip's own work: bubbles).
    ``energy_j`` is the dynamic energy of bytes and operations plus ``static_energy_j``, every
    chip's static power over the step.
    """

    step: int
    bytes_read: dict[str, int]
    bytes_written: dict[str, int]
    weight_bytes_read: dict[str, int]
    link_bytes: int
    chip_bytes_read: tuple[dict[str, int], ...]       # one chip of each stage
    chip_bytes_written: tuple[dict[str, int], ...]
    chip_weight_bytes_read: tuple[dict[str, int], ...]
    chip_link_bytes: tuple[int, ...]
    chip_busy_s: tuple[float, ...]                    # each stage's work per step
    activation_bytes_read: int
    activation_bytes_written: int
    hits: int
    misses: int
    hit_bytes: int
    flops: int
    vector_ops: int
    time_s: float
    time_by_bound: dict[str, float]
    energy_j: float
    time_split: dict[str, float] = field(default_factory=dict)
    static_energy_j: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain data."""
        def plain(value: Any) -> Any:
            if isinstance(value, dict):
                return dict(value)
            if isinstance(value, tuple):
                return [plain(v) for v in value]
            return value
        return {key: plain(value) for key, value in self.__dict__.items()}


@dataclass(frozen=True)
class Report:
    """What one emulated decode run moved, and how long it took.

    The headline figures (``bytes_read``, ``time_per_token``, ...) are those of the warm step, the
    last one emulated, over the whole system (every chip); ``cold`` is the first step, when the
    on-chip tiers start empty. ``chip(stage)`` gives one chip's share; on one chip both agree.
    """

    device: str
    model: str
    workload: dict[str, Any]
    tier_names: tuple[str, ...]
    clock_hz: float
    tokens_per_step: int                # batch x new tokens per sequence
    new_tokens: int
    op_names: tuple[str, ...]
    op_layers: tuple[int, ...]
    energy_j_per_byte: tuple[float, ...]
    energy_j_per_flop: float
    steps: tuple[StepSummary, ...]
    cold_counts: StepCounts = field(repr=False)
    warm_counts: StepCounts = field(repr=False)
    op_stages: tuple[int, ...] = ()
    op_microbatches: tuple[int, ...] = ()
    policy: str = ""
    tp: int = 1
    pp: int = 1
    microbatches: int = 1
    holdings: tuple[ChipHoldings, ...] = ()
    ep: int = 1
    weights_held: int = 0              # weight bytes stored over the whole system
    runtime: str = ""                  # the software stack the step ran under
    padding: str = ""                  # what tensor parallelism padded, in words

    @property
    def watts_per_chip(self) -> float:
        """Average power of one chip over the warm step: static plus dynamic energy, W."""
        return self.warm.energy_j / self.warm.time_s / self.chips

    @property
    def chips(self) -> int:
        """Chips in the system: tensor parallel x pipeline stages x expert parallel."""
        return self.tp * self.pp * self.ep

    @property
    def weight_bytes_read(self) -> int:
        """Weight bytes the warm step read from their homes, all tiers and chips (on-chip
        homes included: what the compute consumed of weights it did not find cached)."""
        return sum(self.warm.weight_bytes_read[t] for t in self.tier_names[1:])

    @property
    def link_bytes(self) -> int:
        """Bytes all chips sent over chip-to-chip links in the warm step."""
        return self.warm.link_bytes

    def chip(self, stage: int = 0) -> dict[str, Any]:
        """One chip of pipeline stage ``stage`` (under expert parallel: chip ``stage``) in the
        warm step: bytes read and written per tier, weight bytes read per tier, link bytes sent,
        busy time, and what it holds."""
        warm = self.warm
        return {
            "stage": stage,
            "bytes_read": dict(warm.chip_bytes_read[stage]),
            "bytes_written": dict(warm.chip_bytes_written[stage]),
            "weight_bytes_read": dict(warm.chip_weight_bytes_read[stage]),
            "link_bytes": warm.chip_link_bytes[stage],
            "busy_s": warm.chip_busy_s[stage],
            "holds": self.holdings[stage].to_dict() if self.holdings else {},
        }

    # headline figures -------------------------------------------------------------------
    @property
    def cold(self) -> StepSummary:
        """The first emulated step."""
        return self.steps[0]

    @property
    def warm(self) -> StepSummary:
        """The last emulated step (the steady state)."""
        return self.steps[-1]

    @property
    def bytes_read(self) -> dict[str, int]:
        """Bytes read from each tier in the warm step (on chip: everything the compute consumed)."""
        return self.warm.bytes_read

    @property
    def bytes_written(self) -> dict[str, int]:
        """Bytes written to each tier in the warm step (on chip: fills of missed tiles)."""
        return self.warm.bytes_written

    @property
    def hits(self) -> int:
        """On-chip tile hits in the warm step."""
        return self.warm.hits

    @property
    def misses(self) -> int:
        """On-chip tile misses in the warm step."""
        return self.warm.misses

    @property
    def flops(self) -> int:
        """Matrix operations (2 per multiply-add) of the warm step."""
        return self.warm.flops

    @property
    def time_per_step(self) -> float:
        """Seconds of one warm step."""
        return self.warm.time_s

    @property
    def time_per_token(self) -> float:
        """Seconds between two tokens of one sequence."""
        return self.warm.time_s / self.new_tokens

    @property
    def tokens_per_s(self) -> float:
        """Tokens per second of one sequence."""
        return 1.0 / self.time_per_token

    @property
    def tokens_per_s_total(self) -> float:
        """Tokens per second of the whole batch."""
        return self.tokens_per_step / self.warm.time_s

    @property
    def cycles(self) -> float:
        """Warm step time in device clock cycles."""
        return self.warm.time_s * self.clock_hz

    @property
    def energy_per_token(self) -> float:
        """Joules per generated token (warm step energy over the tokens it made)."""
        return self.warm.energy_j / self.tokens_per_step

    def warm_spread(self) -> dict[str, tuple[float, float]]:
        """Mean and standard deviation over the warm steps (all but the first) of the step
        time and the weight bytes read: routed experts make them vary from step to step."""
        warm = self.steps[1:] or self.steps
        out = {}
        for name, values in (
                ("time_s", [s.time_s for s in warm]),
                ("weight_bytes_read", [sum(s.weight_bytes_read[t] for t in self.tier_names[1:])
                                       for s in warm])):
            array = np.array(values, dtype=np.float64)
            out[name] = (float(array.mean()), float(array.std(ddof=1)) if len(array) > 1 else 0.0)
        return out

    @property
    def off_chip_weight_bytes(self) -> int:
        """Weight bytes read from every tier but the on-chip one, warm step, all chips."""
        return sum(self.warm.weight_bytes_read[t] for t in self.tier_names[1:])

    @property
    def off_chip_bytes(self) -> int:
        """Bytes read from and written to every tier but the on-chip one, warm step."""
        warm = self.warm
        return sum(warm.bytes_read[t] + warm.bytes_written[t] for t in self.tier_names[1:])

    @property
    def arithmetic_intensity(self) -> float:
        """Matrix operations per off-chip byte (inf when nothing crossed the chip edge)."""
        moved = self.off_chip_bytes
        return self.flops / moved if moved else float("inf")

    @property
    def bottleneck(self) -> str:
        """What bound most of the warm step's critical path: a tier's name, 'link', 'compute',
        'latency' (exposed load latency, and each kernel's fixed time on a device with a
        ``kernel_fixed``) or 'launch'."""
        by_bound = self.warm.time_by_bound
        return max(by_bound, key=by_bound.__getitem__)

    @property
    def ops(self) -> tuple[OpRow, ...]:
        """Per-op rows of the warm step."""
        return self.op_rows("warm")

    def op_rows(self, which: str = "warm") -> tuple[OpRow, ...]:
        """Per-op rows of the ``"warm"`` or ``"cold"`` step."""
        counts = self.warm_counts if which == "warm" else self.cold_counts
        read = _bytes(counts.read_bits)
        written = _bytes(counts.written_bits)
        times = counts.times
        labels = _bound_labels(self.tier_names)
        link = _bytes(counts.results[:, k.R_LINK_BITS])
        stages = self.op_stages or (0,) * len(self.op_names)
        micro = self.op_microbatches or (0,) * len(self.op_names)
        rows = []
        for op, name in enumerate(self.op_names):
            rows.append(OpRow(
                index=op, layer=self.op_layers[op], name=name,
                bytes_read={t: int(read[op, i]) for i, t in enumerate(self.tier_names)},
                bytes_written={t: int(written[op, i]) for i, t in enumerate(self.tier_names)},
                link_bytes=int(link[op]), stage=stages[op], microbatch=micro[op],
                hits=int(counts.results[op, k.R_HITS]),
                misses=int(counts.results[op, k.R_MISSES]),
                flops=int(counts.results[op, k.R_FLOPS]),
                vector_ops=int(counts.results[op, k.R_VECTOR_OPS]),
                waves=int(counts.results[op, k.R_WAVES]),
                time_s=float(times[op].sum()),
                cycles=float(times[op].sum() * self.clock_hz),
                bound_by=labels[int(np.argmax(times[op]))],
            ))
        return tuple(rows)

    # output ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Everything, as plain data (JSON-ready)."""
        return {
            "device": self.device, "model": self.model, "workload": dict(self.workload),
            "tiers": list(self.tier_names),
            "policy": self.policy, "chips": self.chips, "tp": self.tp, "pp": self.pp,
            "ep": self.ep, "microbatches": self.microbatches,
            "weights_held": self.weights_held, "weight_bytes_read": self.weight_bytes_read,
            "warm_spread": {key: list(value) for key, value in self.warm_spread().items()},
            "per_chip": [self.chip(s) for s in range(max(self.pp, self.ep))],
            "link_bytes": self.link_bytes,
            "time_per_token_s": self.time_per_token,
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_total": self.tokens_per_s_total,
            "cycles": self.cycles,
            "energy_per_token_j": self.energy_per_token,
            "arithmetic_intensity": _finite(self.arithmetic_intensity),
            "unbounded": self.unbounded(),
            "bottleneck": self.bottleneck,
            "runtime": self.runtime, "padding": self.padding,
            "watts_per_chip": self.watts_per_chip,
            "bytes_read": dict(self.bytes_read),
            "bytes_written": dict(self.bytes_written),
            "hits": self.hits, "misses": self.misses, "flops": self.flops,
            "cold": self.cold.to_dict(),
            "warm": self.warm.to_dict(),
            "steps": [s.to_dict() for s in self.steps],
            "ops": [row.to_dict() for row in self.ops],
        }

    def unbounded(self) -> dict[str, str]:
        """Figures with no finite value, each with the reason: JSON and CSV give them as null
        (empty) and say why here, instead of Infinity, which JSON cannot carry."""
        if math.isfinite(self.arithmetic_intensity):
            return {}
        return {"arithmetic_intensity": "no byte crossed the chip edge (weights and KV cache "
                                        "on chip): FLOPs per off-chip byte is unbounded"}

    def to_json(self, indent: int | None = 2, extra: dict[str, Any] | None = None) -> str:
        """JSON text of :meth:`to_dict`, with ``extra`` top-level entries."""
        return json.dumps({**self.to_dict(), **(extra or {})}, indent=indent, allow_nan=False,
                          default=_json_default)

    def to_csv(self) -> str:
        """One CSV row per op of the warm step, bytes per tier in columns."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["index", "stage" if self.ep == 1 else "chip", "microbatch", "layer", "op"]
                        + [f"bytes_read_{t}" for t in self.tier_names]
                        + [f"bytes_written_{t}" for t in self.tier_names]
                        + ["link_bytes", "hits", "misses", "flops", "vector_ops", "waves",
                           "time_s", "cycles", "bound_by"])
        for row in self.ops:
            writer.writerow([row.index, row.stage, row.microbatch, row.layer, row.name]
                            + [row.bytes_read[t] for t in self.tier_names]
                            + [row.bytes_written[t] for t in self.tier_names]
                            + [row.link_bytes, row.hits, row.misses, row.flops, row.vector_ops, row.waves,
                               repr(row.time_s), repr(row.cycles), row.bound_by])
        return out.getvalue()

    def table(self, *, per_op: bool = False) -> str:
        """A readable summary, then per-op rows (summed over layers unless ``per_op``)."""
        lines = [
            f"{self.model} on {self.device}: batch {self.workload['batch']}, context "
            f"{self.workload['context']}, weights {self.workload['weights']}, kv "
            f"{self.workload['kv']}",
            ("  inter-token latency " if self.workload.get("prefill_chunk") else
             "  time per token   ") + f"{format_quantity(self.time_per_token, 'time')}  "
            f"({self.tokens_per_s:.1f} tokens/s per sequence, "
            f"{self.tokens_per_s_total:.1f} in aggregate)",
            f"  cycles           {self.cycles:,.0f} at {format_quantity(self.clock_hz, 'frequency')}",
            f"  bottleneck       {self.bottleneck}",
            "  time split       " + ", ".join(
                f"{name} {format_quantity(seconds, 'time')}"
                for name, seconds in self.warm.time_split.items() if seconds > 0),
            f"  runtime          {self.runtime}",
            f"  energy per token {format_quantity(self.energy_per_token, 'energy')} "
            f"({self.watts_per_chip:.0f} W per chip, static "
            f"{format_quantity(self.warm.static_energy_j / self.tokens_per_step, 'energy')})",
            f"  intensity        {self.arithmetic_intensity:.2f} FLOP per off-chip byte",
            f"  on-chip tiles    {self.hits:,} hits, {self.misses:,} misses (warm); cold step "
            f"{self.cold.misses:,} misses, {format_quantity(self.cold.time_s, 'time')}",
            f"  system           {self.chips} chip(s): tp {self.tp} x pp {self.pp}"
            + (f" x ep {self.ep}" if self.ep > 1 else "")
            + f", {self.microbatches} microbatch(es), policy {self.policy}; link "
            f"{self.link_bytes:,} B per step",
            f"  weights read     {self.weight_bytes_read:,} B off chip of {self.weights_held:,} B"
            f" held ({100 * self.weight_bytes_read / max(self.weights_held, 1):.1f}%)",
        ] + ([f"  padding          {self.padding}"] if self.padding else [])
        if len(self.steps) > 2:
            spread = self.warm_spread()
            (t_mean, t_sd), (w_mean, w_sd) = spread["time_s"], spread["weight_bytes_read"]
            lines.append(f"  over {len(self.steps) - 1} warm steps: time "
                         f"{format_quantity(t_mean, 'time')} +- {format_quantity(t_sd, 'time')}, "
                         f"weights read {w_mean:,.0f} +- {w_sd:,.0f} B")
        lines.append("  whole system, warm step:")
        for tier in self.tier_names:
            lines.append(f"    {tier:<6} read {self.bytes_read[tier]:>20,} B (weights "
                         f"{self.warm.weight_bytes_read[tier]:>18,} B)   written "
                         f"{self.bytes_written[tier]:>16,} B")
        if self.chips > 1:
            lines.append("  one chip of each stage, warm step:" if self.ep == 1
                         else "  each chip, warm step:")
            for stage in range(max(self.pp, self.ep)):
                chip = self.chip(stage)
                layers = self.holdings[stage].layers if self.holdings else ()
                span = f"layers {layers[0]}-{layers[-1]}" if layers else "no layers"
                reads = ", ".join(f"{t} {chip['bytes_read'][t]:,} B" for t in self.tier_names)
                label = "stage" if self.ep == 1 else "chip"
                lines.append(f"    {label} {stage} ({span}): read {reads}; link "
                             f"{chip['link_bytes']:,} B; busy "
                             f"{format_quantity(chip['busy_s'], 'time')}")
        for holding in self.holdings:
            for note in holding.spilled:
                lines.append(f"  spilled (stage {holding.stage}): {note}")
        lines.append("")
        chip_column = self.ep > 1             # expert-parallel chips' rows side by side
        rows = self.ops if per_op else _group_rows(self.ops, by_chip=chip_column)
        header = (("  chip" if chip_column else "") + f"  {'layer':>5} {'op':<12}"
                  + "".join(f" {t + ' read B':>18}" for t in self.tier_names)
                  + f" {'time':>11} {'bound by':>9}")
        lines.append(header)
        for row in rows:
            layer = "all" if row.layer == -2 else ("-" if row.layer < 0 else str(row.layer))
            lines.append((f"  {row.stage:>4}" if chip_column else "")
                         + f"  {layer:>5} {row.name:<12}"
                         + "".join(f" {row.bytes_read[t]:>18,}" for t in self.tier_names)
                         + f" {format_quantity(row.time_s, 'time', digits=4):>11}"
                         + f" {row.bound_by:>9}")
        return "\n".join(lines)


# Counters kept as whole bytes per op (the rest of the results are counts, summed as they are).
_BYTE_RESULTS = (k.R_LINK_BITS, k.R_ACT_READ_BITS, k.R_ACT_WRITTEN_BITS, k.R_HIT_BITS)
_BYTE_RESULT_COLUMNS = np.array(_BYTE_RESULTS, dtype=np.int64)


class _Columns:
    """Where each counter sits in a row of :func:`_totals`, for ``n_tiers`` tiers: the bytes read
    and written per tier, the link, activation and hit bytes (whole bytes per op), then the raw
    results."""

    def __init__(self, n_tiers: int) -> None:
        self.read = slice(0, n_tiers)
        self.written = slice(n_tiers, 2 * n_tiers)
        self.link, self.act_read, self.act_written, self.hit = range(2 * n_tiers,
                                                                     2 * n_tiers + 4)
        self.results = slice(2 * n_tiers + 4, None)


def _totals(counts: StepCounts, group: np.ndarray, n_groups: int,
            weight_ops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[group, column] each group's totals (:class:`_Columns`), and [group, tier] the bytes its
    ``weight_ops`` read (:func:`memsim.kernels.summary.group_totals`)."""
    return group_totals(counts.read_bits, counts.written_bits, counts.results,
                        _BYTE_RESULT_COLUMNS, group, n_groups, weight_ops)


def _bound_labels(tier_names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(tier_names) + ("link", "compute", "latency", "launch")


class OpGroups:
    """What :func:`summarize` needs of a system's ops that no step changes (their stage,
    microbatch, kind, which read weights), worked out once per run instead of once per step."""

    def __init__(self, n_tiers: int, op_stage: np.ndarray, op_micro: np.ndarray,
                 weight_ops: np.ndarray, op_kind: np.ndarray | None,
                 fixed_launches: np.ndarray | None = None) -> None:
        self.col = _Columns(n_tiers)
        self.stages = int(op_stage.max()) + 1
        self.micros = int(op_micro.max()) + 1
        self.op_stage = np.ascontiguousarray(op_stage, dtype=np.int64)
        self.weight_ops = np.ascontiguousarray(weight_ops, dtype=np.bool_)
        self.every_op = np.ones(len(op_stage), dtype=bool)
        # per op, the index in _SPENT_ON_NAMES of what its time is spent on (no kinds: weights)
        self.spent_class = (np.zeros(len(op_stage), dtype=np.int64) if op_kind is None
                            else np.ascontiguousarray(_SPENT_ON[op_kind]))
        # per op, its kernels that pay the device's kernel_fixed (the link ops' do not)
        self.fixed_launches = (None if fixed_launches is None
                               else np.ascontiguousarray(fixed_launches, dtype=np.int64))


def summarize(counts: StepCounts, tier_names: tuple[str, ...], energy_j_per_byte: tuple[float, ...],
              energy_j_per_flop: float, *, op_stage: np.ndarray, op_micro: np.ndarray,
              weight_ops: np.ndarray, tp: int = 1,
              link_energy_j_per_byte: float | np.ndarray = 0.0,
              peers: StepCounts | None = None,
              peer_ops: np.ndarray | None = None,
              op_layer: np.ndarray | None = None, op_kind: np.ndarray | None = None,
              host_s: float = 0.0, static_power_w: float = 0.0,
              groups: OpGroups | None = None, kernel_fixed_s: float = 0.0,
              hidden_host_s: float = 0.0) -> StepSummary:
    """Totals of one step's counters (:func:`_summarize`)."""
    return _summarize(counts, tier_names, energy_j_per_byte, energy_j_per_flop,
                      op_stage=op_stage, op_micro=op_micro, weight_ops=weight_ops, tp=tp,
                      link_energy_j_per_byte=link_energy_j_per_byte, peers=peers,
                      peer_ops=peer_ops, op_layer=op_layer, op_kind=op_kind, host_s=host_s,
                      static_power_w=static_power_w, groups=groups,
                      kernel_fixed_s=kernel_fixed_s, hidden_host_s=hidden_host_s)[0]


def _summarize(counts: StepCounts, tier_names: tuple[str, ...],
               energy_j_per_byte: tuple[float, ...], energy_j_per_flop: float, *,
               op_stage: np.ndarray, op_micro: np.ndarray, weight_ops: np.ndarray, tp: int,
               link_energy_j_per_byte: float | np.ndarray, peers: StepCounts | None,
               peer_ops: np.ndarray | None, op_layer: np.ndarray | None,
               op_kind: np.ndarray | None, host_s: float, static_power_w: float,
               groups: OpGroups | None, kernel_fixed_s: float = 0.0,
               hidden_host_s: float = 0.0) -> tuple[StepSummary, float]:
    """Totals of one step's counters: per chip of each stage, and over the system (``tp``
    chips per stage); bytes summed from per-op whole bytes.

    The chips of a tensor-parallel group do the same work, so the system is ``tp`` times the
    emulated chip, except for the ops whose rows in ``peers`` are non-zero (the vocabulary-
    parallel embedding lookup): the ops in ``peer_ops`` count the emulated chip once plus what
    ``peers`` says the other chips did.

    With ``op_layer`` the stages are chips working side by side (expert parallel) that wait for
    each other at every layer: the step is the sum over layers of the slowest chip's time.
    ``host_s`` is the runtime's host time on the critical path per step, and ``hidden_host_s``
    the host work it overlaps with the device, which the device hides only up to its own step
    (a step shorter than it waits for the host); ``static_power_w`` the
    whole system's static power, W. ``link_energy_j_per_byte`` is one figure for every op, or
    one per op (the link each op's bytes cross). ``groups`` is :class:`OpGroups` of these ops,
    when the caller keeps one across steps. Returns the summary and the energy of its bytes
    alone, J (the dynamic energy less the flops' and vector operations')."""
    if groups is None:
        groups = OpGroups(len(tier_names), op_stage, op_micro, weight_ops, op_kind)
    col = groups.col
    stages, micros = groups.stages, groups.micros

    def per_tier(values: np.ndarray) -> dict[str, int]:
        return dict(zip(tier_names, values.tolist()))

    chip, chip_weight = _totals(counts, groups.op_stage, stages, groups.weight_ops)
    chip_read = tuple(per_tier(c[col.read]) for c in chip)
    chip_written = tuple(per_tier(c[col.written]) for c in chip)
    if op_layer is None and stages == 1 and micros == 1:   # one chip's ops, in order
        critical, work = groups.every_op, None
    else:
        op_time = counts.times.sum(axis=1)
        if op_layer is not None:
            buckets = op_layer + 1
            per_layer = np.zeros((stages, int(buckets.max()) + 1))
            np.add.at(per_layer, (op_stage, buckets), op_time)
            slowest = per_layer.argmax(axis=0)
            critical = op_stage == slowest[buckets]
            work = per_layer.sum(axis=1)
            step_time = float(per_layer.max(axis=0).sum())
        else:
            busy = np.zeros((stages, micros))
            np.add.at(busy, (op_stage, op_micro), op_time)
            path = busy.sum(axis=0)
            work = busy.sum(axis=1)
            if path.max() >= work.max():
                critical = op_micro == int(np.argmax(path))
            else:
                critical = op_stage == int(np.argmax(work))
            step_time = float(max(path.max(), work.max()))
    with_fixed = groups.fixed_launches is not None and kernel_fixed_s != 0.0
    running, by_column, launch, kernel_fixed, spent_on = time_sums(
        counts.times, critical, groups.spent_class, len(_SPENT_ON_NAMES),
        groups.fixed_launches if with_fixed else _NO_FIXED, kernel_fixed_s)
    if work is None:            # one chip: the running sum of its ops, as add.at adds them
        work = np.array([running])
        step_time = running
    # the host work the device cannot hide: a step is never shorter than it
    step_time, host_s = (max(step_time, hidden_host_s) + host_s,
                         host_s + max(0.0, hidden_host_s - step_time))
    labels = _bound_labels(tier_names)
    time_split = _time_split(spent_on, kernel_fixed if with_fixed else None, launch, host_s,
                             step_time, float(work[0]) if len(work) == 1 else float(work.mean()))

    # The system's totals are Python integers: one chip's counts fit int64 (limits.check_sizes),
    # but summed over stages and multiplied by the tensor-parallel chips they may not.
    total = _column_sums(chip)
    weight_total = _column_sums(chip_weight)
    if peers is None or peer_ops is None or not peer_ops.any():
        every_list = [value * tp for value in total]
        weight_read = [value * tp for value in weight_total]
    else:         # the peer ops count the emulated chip once, plus what the peers did
        peer_group = np.where(peer_ops, 0, -1)
        own, own_weight = (a[0].tolist() for a in
                           _totals(counts, peer_group, 1, groups.weight_ops))
        peer_total, peer_weight = (a[0].tolist() for a in      # the peers count no other op
                                   _totals(peers, peer_group, 1, groups.weight_ops))
        every_list = [(t - o) * tp + o + p for t, o, p in zip(total, own, peer_total)]
        weight_read = [(t - o) * tp + o + p
                       for t, o, p in zip(weight_total, own_weight, peer_weight)]
    read, written = every_list[col.read], every_list[col.written]
    results = every_list[col.results]
    act_read = total[col.act_read] * tp
    act_written = total[col.act_written] * tp
    link = total[col.link] * tp
    energy = sum((read[i] + written[i]) * energy_j_per_byte[i]
                 for i in range(len(tier_names)))
    energy += (act_read + act_written) * energy_j_per_byte[0]
    energy += (link * link_energy_j_per_byte if not isinstance(link_energy_j_per_byte, np.ndarray)
               else float(_bytes(counts.results[:, k.R_LINK_BITS]) @ link_energy_j_per_byte)
               * tp)
    bytes_energy = energy
    energy += (results[k.R_FLOPS] + results[k.R_VECTOR_OPS]) * energy_j_per_flop
    static_energy = static_power_w * step_time
    return StepSummary(
        step=counts.step,
        bytes_read=dict(zip(tier_names, read)), bytes_written=dict(zip(tier_names, written)),
        weight_bytes_read=dict(zip(tier_names, weight_read)),
        link_bytes=link,
        chip_bytes_read=chip_read, chip_bytes_written=chip_written,
        chip_weight_bytes_read=tuple(per_tier(c) for c in chip_weight),
        chip_link_bytes=tuple(int(c[col.link]) for c in chip),
        chip_busy_s=tuple(work.tolist()),
        activation_bytes_read=act_read, activation_bytes_written=act_written,
        hits=results[k.R_HITS], misses=results[k.R_MISSES],
        hit_bytes=every_list[col.hit],
        flops=results[k.R_FLOPS], vector_ops=results[k.R_VECTOR_OPS],
        time_s=step_time,
        time_by_bound={**dict(zip(labels, by_column.tolist())), "host": host_s},
        energy_j=float(energy + static_energy), time_split=time_split,
        static_energy_j=float(static_energy),
    ), bytes_energy


def _column_sums(rows: np.ndarray) -> list[int]:
    """Each column's sum over ``rows`` as a Python integer (exact whatever its size; what an
    object array's sum gives, without the object array)."""
    return [sum(column) for column in zip(*rows.tolist())]


class StepSummarizer:
    """:func:`summarize` for the steps of one run, the arguments no step changes kept.

    A step whose counters equal the step before's in every bit but its flops and vector
    operations (a decode step's attention over one more token of context, every byte and time
    the same) takes that step's summary with its flops, vector operations and energy worked out
    again: what :func:`summarize` gives, figure for figure, without its float sums and dicts.
    """

    def __init__(self, tier_names: tuple[str, ...], energy_j_per_byte: tuple[float, ...],
                 energy_j_per_flop: float, *, groups: OpGroups, tp: int,
                 link_energy_j_per_byte: float | np.ndarray, peer_ops: np.ndarray | None,
                 op_layer: np.ndarray | None, op_kind: np.ndarray | None, host_s: float,
                 static_power_w: float, op_stage: np.ndarray, op_micro: np.ndarray,
                 weight_ops: np.ndarray, kernel_fixed_s: float = 0.0,
                 hidden_host_s: float = 0.0) -> None:
        self.tier_names, self.tp = tier_names, tp
        self.energy_j_per_flop = energy_j_per_flop
        self._fields = dict(energy_j_per_byte=energy_j_per_byte,
                            energy_j_per_flop=energy_j_per_flop, op_stage=op_stage,
                            op_micro=op_micro, weight_ops=weight_ops, tp=tp,
                            link_energy_j_per_byte=link_energy_j_per_byte, peer_ops=peer_ops,
                            op_layer=op_layer, op_kind=op_kind, host_s=host_s,
                            static_power_w=static_power_w, groups=groups,
                            kernel_fixed_s=kernel_fixed_s, hidden_host_s=hidden_host_s)
        self._before: tuple[StepCounts, StepSummary, float] | None = None

    def __call__(self, counts: StepCounts, peers: StepCounts | None = None) -> StepSummary:
        """The summary of ``counts``, ``peers`` the other chips' counts (None: none)."""
        if peers is None and self._before is not None:
            summary = self._like_before(counts)
            if summary is not None:
                return summary
        summary, bytes_energy = _summarize(counts, self.tier_names, peers=peers, **self._fields)
        self._before = None if peers is not None else (counts, summary, bytes_energy)
        return summary

    def _like_before(self, counts: StepCounts) -> StepSummary | None:
        before, summary, bytes_energy = self._before
        if (counts.read_bits.shape != before.read_bits.shape
                or counts.read_bits.tobytes() != before.read_bits.tobytes()
                or counts.written_bits.tobytes() != before.written_bits.tobytes()
                or counts.times.tobytes() != before.times.tobytes()):       # bit for bit
            return None
        results = counts.results.copy()
        results[:, _OPERATION_RESULTS] = before.results[:, _OPERATION_RESULTS]
        if results.tobytes() != before.results.tobytes():
            return None
        # the exact sum over the ops: what summarize's per-stage int64 sums (no chip's count
        # overflows, memsim.limits) added as Python integers give
        flops, vector_ops = (sum(column) * self.tp
                             for column in counts.results[:, _OPERATION_RESULTS].T.tolist())
        energy = bytes_energy + (flops + vector_ops) * self.energy_j_per_flop
        again = object.__new__(StepSummary)   # a copy with new fields (a frozen dataclass)
        again.__dict__.update(
            summary.__dict__, step=counts.step, flops=flops, vector_ops=vector_ops,
            energy_j=float(energy + summary.static_energy_j),
            bytes_read=dict(summary.bytes_read), bytes_written=dict(summary.bytes_written),
            weight_bytes_read=dict(summary.weight_bytes_read),
            chip_bytes_read=tuple(map(dict, summary.chip_bytes_read)),
            chip_bytes_written=tuple(map(dict, summary.chip_bytes_written)),
            chip_weight_bytes_read=tuple(map(dict, summary.chip_weight_bytes_read)),
            time_by_bound=dict(summary.time_by_bound), time_split=dict(summary.time_split))
        return again


# The results columns a decode step's one more token of context changes (adjacent columns).
_OPERATION_RESULTS = slice(k.R_FLOPS, k.R_VECTOR_OPS + 1)


def _time_split(spent_on: np.ndarray, kernel_fixed_s: float | None, launch_s: float,
                host_s: float, step_time: float, mean_work_s: float) -> dict[str, float]:
    """What the critical path's time went to (see :class:`StepSummary`), from its sums
    (:func:`memsim.kernels.summary.time_sums`): the work per _SPENT_ON_NAMES, the kernels'
    fixed time when the device's ``kernel_fixed`` is split out (else None), the launches."""
    split = dict(zip(_SPENT_ON_NAMES, spent_on.tolist()))
    if kernel_fixed_s is not None:
        split["kernel_fixed"] = kernel_fixed_s
    split.update(launch=launch_s, host=host_s,
                 pipeline_idle=max(0.0, step_time - host_s - mean_work_s))
    return split


# What an op's time is spent on (StepSummary.time_split), by op kind.
_SPENT_ON_KINDS = (("weights", (k.OP_EMBED, k.OP_NORM, k.OP_MATMUL)),
                   ("kv", (k.OP_ATTENTION, k.OP_KV_APPEND)),
                   ("collectives", (k.OP_COLLECTIVE, k.OP_SEND, k.OP_ALL_TO_ALL)))
_SPENT_ON_NAMES = tuple(name for name, _ in _SPENT_ON_KINDS)


def _spent_on_table() -> np.ndarray:
    """[op kind]: the index in _SPENT_ON_NAMES of what its time is spent on."""
    kinds = [kind for _, group in _SPENT_ON_KINDS for kind in group]
    table = np.full(max(kinds) + 1, -1, dtype=np.int64)
    for i, (_, group) in enumerate(_SPENT_ON_KINDS):
        table[list(group)] = i
    return table


_SPENT_ON = _spent_on_table()
_NO_FIXED = np.zeros(0, dtype=np.int64)     # no op's kernel fixed time split out


def _group_rows(rows: tuple[OpRow, ...], *, by_chip: bool = False) -> list[OpRow]:
    """Sum per-layer rows of the same op into one row (layer -2 means 'all layers'), one per
    chip when ``by_chip`` (expert-parallel chips side by side)."""
    order: list[str] = []
    groups: dict[str, list[OpRow]] = {}
    for row in rows:
        key = row.name if row.layer >= 0 else f"{row.name}@{row.index}"
        key = f"{row.stage}:{key}" if by_chip else key
        if key not in groups:
            order.append(key)
            groups[key] = []
        groups[key].append(row)
    out = []
    for key in order:
        members = groups[key]
        if len(members) == 1:
            out.append(members[0])
            continue
        first = members[0]
        by_bound: dict[str, float] = {}
        for m in members:
            by_bound[m.bound_by] = by_bound.get(m.bound_by, 0.0) + m.time_s
        out.append(OpRow(
            index=first.index, layer=-2, name=first.name,
            bytes_read={t: sum(m.bytes_read[t] for m in members) for t in first.bytes_read},
            bytes_written={t: sum(m.bytes_written[t] for m in members) for t in first.bytes_written},
            link_bytes=sum(m.link_bytes for m in members), stage=first.stage,
            microbatch=first.microbatch, hits=sum(m.hits for m in members), misses=sum(m.misses for m in members),
            flops=sum(m.flops for m in members), vector_ops=sum(m.vector_ops for m in members),
            waves=sum(m.waves for m in members), time_s=sum(m.time_s for m in members),
            cycles=sum(m.cycles for m in members), bound_by=max(by_bound, key=by_bound.__getitem__),
        ))
    return out


def _finite(value: float) -> float | None:
    """A figure for JSON: None where it is unbounded (see :meth:`Report.unbounded`)."""
    return value if math.isfinite(value) else None


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
