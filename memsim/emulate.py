"""Run a plan through the kernels, step after step, and gather a Report."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from itertools import chain
from typing import Any

import numpy as np

from memsim.device import Device
from memsim.errors import ConfigError
from memsim.kernels import step as k
from memsim.inputs import decode_from, device_from, model_from
from memsim.model import Model
from memsim.plan import Plan, SystemPlan, exchange_figures, handoff_link, plan_system
from memsim.routing import Router
from memsim.runtime import Runtime
from memsim.report import (ChipHoldings, OpGroups, Report, StepCounts, StepSummarizer,
                           StepSummary)
from memsim.workload import Decode, Prefill


class Residency:
    """The on-chip tier's state between steps: an exact LRU over tiles and the pinned tensors.

    Its arena starts with room for ``initial_runs`` runs of tiles (at most what the on-chip tier
    can hold, ``plan.max_lru_entries``) and grows, by doubling, only when a walk needs more:
    memory follows the runs actually held, never the model's size or the tier's capacity.
    """

    INITIAL_RUNS = 1 << 16      # 4 MiB of arena

    def __init__(self, plan: Plan, initial_runs: int = INITIAL_RUNS) -> None:
        self._start(plan.n_tensors, plan.max_lru_entries, plan.lru_capacity_bits, initial_runs)

    def _start(self, n_tensors: int, max_tiles: int, capacity_bits: int,
               initial_runs: int) -> None:
        self.max_runs = max_tiles + 2          # the LRU never holds more runs than tiles
        runs = max(2, min(self.max_runs, initial_runs))
        self.arena = k.new_arena(n_tensors, runs - 2, capacity_bits)

    @classmethod
    def shared(cls, first: Plan, second: Plan, initial_runs: int = INITIAL_RUNS) -> Residency:
        """One on-chip tier for two plans on the same chip (a target and its draft model): the
        second plan's tensors are numbered after the first's (see :func:`offset_tensors`), and
        the LRU gets what neither plan keeps resident or pinned."""
        resident = sum(plan.tensor_table.need()[0] for plan in (first, second))
        pinned = sum(plan.tensor_table.pinned_bytes() for plan in (first, second))
        capacity_bits = max(0, 8 * (first.device.tiers[0].capacity - resident - pinned))
        residency = cls.__new__(cls)
        residency._start(first.n_tensors + second.n_tensors,
                         first.max_lru_entries + second.max_lru_entries, capacity_bits,
                         initial_runs)
        return residency

    @property
    def used_bits(self) -> int:
        """Bits the LRU holds now."""
        return int(self.arena[0, k.S_USED_BITS])

    def grow(self) -> None:
        """Double the arena's run nodes (up to ``max_runs``), keeping the state."""
        runs = k.arena_runs(self.arena)
        self.arena = k.grow_arena(self.arena, min(self.max_runs, 2 * runs))


NO_ROUTES = np.zeros((1, 1), dtype=np.int64)


def run_step(plan: Plan, residency: Residency, step: int,
             routes: np.ndarray = NO_ROUTES, *, copy_layers: bool = True) -> StepCounts:
    """Emulate decode step ``step`` of the plan, updating ``residency``; ``routes`` is the
    step's MoE route table (:meth:`memsim.routing.Router.tally`). A layer that repeats the one
    before, on-chip state included, is copied (the same counts); ``copy_layers=False`` walks
    every layer tile by tile."""
    n_ops, n_tiers = plan.n_ops, len(plan.tier_names)
    counts = StepCounts(
        step=step,
        read_bits=np.zeros((n_ops, n_tiers), dtype=np.int64),
        written_bits=np.zeros((n_ops, n_tiers), dtype=np.int64),
        results=np.zeros((n_ops, k.N_RESULT_COLS), dtype=np.int64),
        times=np.zeros((n_ops, n_tiers + 4), dtype=np.float64),
    )
    dev = plan.device
    next_layer = (plan.tensor_table.next_layer if copy_layers
                  else np.full(plan.n_tensors, -1, dtype=np.int64))
    op = 0
    while True:     # the walk stops early when the arena may run short of run nodes
        op = k.walk_step(plan.op_int, plan.op_float, step, plan.workload.seed, dev.cores,
                         dev.vector_ops_per_s, plan.launch_s, plan.kernel_fixed_s,
                         plan.host_launch_s, plan.tier_bandwidth, plan.tier_latency_s,
                         plan.tier_granularity, routes, residency.arena, op,
                         residency.max_runs, next_layer, plan.tensor_base, counts.read_bits,
                         counts.written_bits, counts.results, counts.times)
        if op == n_ops:
            return counts
        residency.grow()


def peer_embedding_counts(plan: Plan, step: int) -> StepCounts:
    """What the other chips of a tensor-parallel group read for the embedding lookup.

    The table is split by vocabulary ranges; each token's row is read by the chip that owns it.
    The emulated chip is the first; the others' rows are counted here, read from their home tier
    (their own on-chip reuse of embedding rows across steps is not emulated: a row is a miss
    unless its home is on chip).
    """
    n_ops, n_tiers = plan.n_ops, len(plan.tier_names)
    counts = StepCounts(step=step, read_bits=np.zeros((n_ops, n_tiers), dtype=np.int64),
                        written_bits=np.zeros((n_ops, n_tiers), dtype=np.int64),
                        results=np.zeros((n_ops, k.N_RESULT_COLS), dtype=np.int64),
                        times=np.zeros((n_ops, n_tiers + 4)))
    if plan.workload.tp == 1:
        return counts
    for op in np.flatnonzero(plan.op_int[:, k.C_KIND] == k.OP_EMBED):
        row = plan.op_int[op]
        row_bits = int(k._tile_bits(0, row[k.C_K], 1, row[k.C_ELEM_BITS], row[k.C_GROUP],
                                    row[k.C_META_BITS], row[k.C_PADDED]))
        rows_here = int(row[k.C_ROWS_HERE])
        base = step * int(row[k.C_STEP_TOKENS]) + int(row[k.C_TOKEN_BASE])
        for r in range(int(row[k.C_M])):
            token = int(k.token_id(plan.workload.seed, base + r, int(row[k.C_N])))
            owner, local = divmod(token, rows_here)
            if owner == 0:
                continue
            home = int(row[k.C_HOME] if local < row[k.C_SPLIT] else row[k.C_HOME_HI])
            counts.read_bits[op, 0] += row_bits
            if home == 0:
                counts.results[op, k.R_HITS] += 1
                counts.results[op, k.R_HIT_BITS] += row_bits
            else:
                counts.read_bits[op, home] += row_bits
                counts.written_bits[op, 0] += row_bits
                counts.results[op, k.R_MISSES] += 1
    return counts


def offset_tensors(plan: Plan, offset: int) -> Plan:
    """The same plan with its tensor ids moved up by ``offset`` (to share an arena)."""
    op_int = plan.op_int.copy()
    has_tensor = op_int[:, k.C_TENSOR] >= 0
    op_int[has_tensor, k.C_TENSOR] += offset
    return replace(plan, op_int=op_int, tensor_base=plan.tensor_base + offset)


def host_time_per_step(stack: Runtime, stages: int = 1) -> float:
    """Host time a runtime adds to each step's critical path: its host work unless it overlaps
    it with the device (:func:`hidden_host_per_step`), and the replay of a captured graph (when
    a step of ``stages`` pipeline stages replays one, :meth:`memsim.runtime.Runtime.graphed`)."""
    return ((0.0 if stack.host_overlap else stack.host_per_step_s)
            + (stack.graph_launch_s if stack.graphed(stages) else 0.0))


def hidden_host_per_step(stack: Runtime) -> float:
    """Host work per step a runtime overlaps with the device (``host_overlap``): hidden behind
    a device step at least as long, the rest of it waited for (a step is never shorter)."""
    return stack.host_per_step_s if stack.host_overlap else 0.0


def workload_fields(workload: Decode) -> dict[str, Any]:
    """``workload.to_dict()``, worked out once per workload (a frozen value) and copied for
    each report, so that no two reports share a mutable dict or list."""
    fields, nested = _fields_of(workload)
    out = dict(fields)
    for key in nested:
        out[key] = _copied(out[key])
    return out


@functools.lru_cache(maxsize=256)
def _fields_of(workload: Decode) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The fields, and the keys whose values are dicts or lists (what a copy copies)."""
    fields = workload.to_dict()
    return fields, tuple(key for key, value in fields.items() if isinstance(value, (dict, list)))


def _copied(value: Any) -> Any:
    """``value`` with its dicts and lists copied, all the way down."""
    if isinstance(value, dict):
        return {key: _copied(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copied(item) for item in value]
    return value


def _concatenate(parts: list[StepCounts]) -> StepCounts:
    """One step of every stage, ops in stage order."""
    if len(parts) == 1:
        return parts[0]
    return StepCounts(
        step=parts[0].step,
        read_bits=np.concatenate([p.read_bits for p in parts]),
        written_bits=np.concatenate([p.written_bits for p in parts]),
        results=np.concatenate([p.results for p in parts]),
        times=np.concatenate([p.times for p in parts]),
    )


def resolve(device: Device | str, model: Model | str,
            workload: Decode | None = None) -> tuple[Device, Model]:
    """The device and model of a call, through the one builder (:mod:`memsim.inputs`): names
    and files load, and a workload's policy is the device's ``layout.policy`` what-if."""
    policy = workload.policy if workload is not None else "auto"
    dev = device_from(device, policy=policy) if isinstance(device, (str, Device)) else device
    mod = model_from(model) if isinstance(model, (str, Model)) else model
    if not isinstance(dev, Device):
        raise ConfigError(f"expected a Device or a device name, got {type(device).__name__}",
                          field="device")
    if not isinstance(mod, Model):
        raise ConfigError(f"expected a Model or a model name, got {type(model).__name__}",
                          field="model")
    return dev, mod


def emulate(device: Device | str, model: Model | str, workload: Decode | Prefill | None = None,
            **fields: Any) -> Report:
    """Emulate ``workload.steps`` consecutive decode steps and report the cold and warm step.

    Parameters
    ----------
    device, model : catalog names or loaded objects.
    workload : a :class:`Decode`; keyword ``fields`` build one (``batch=8, context=8192``,
        ``tp=8``, ``placement={"kv": "cxl"}``).
    """
    if workload is None:
        workload = decode_from(fields)
    elif fields:
        raise ConfigError("give either a Decode workload or its fields, not both", field="workload")
    dev, mod = resolve(device, model, workload)
    if isinstance(workload, Prefill):     # a prefill is one step (memsim.workload.Prefill)
        workload = workload.step()
    return run_system(plan_system(dev, mod, workload))


def run_system(system: SystemPlan) -> Report:
    """Walk every stage of a system plan, step after step, each with its own on-chip tier."""
    run = SystemRun(system)
    for step in range(system.workload.steps):
        run.step(step)
    return run.report()


def link_energy_per_op(system: SystemPlan, may_cross: bool | None = None) -> float | np.ndarray:
    """Energy per byte of the link each op's link bytes cross, J/B: a collective of a group
    larger than one link domain, and a hand-off between stages in different domains, cross the
    scale-out network (``scale_out.energy``); an expert-parallel exchange pays each link's
    energy for its share of the bytes (:func:`memsim.plan.exchange_figures`); the rest the
    domain's ``link.energy``.
    One figure when every op's is the same. ``may_cross``: whether any op is of a kind that
    may cross it (:attr:`OpFrame.may_cross`; worked out here when None)."""
    dev = system.device
    link_j_per_byte = dev.link.energy_j_per_byte if dev.link else 0.0
    if dev.link is None or dev.scale_out is None or not (
            any(map(_may_cross, system.stages)) if may_cross is None else may_cross):
        return float(link_j_per_byte)           # no op's bytes may cross the scale-out network
    out = []
    for plan in system.stages:
        energy = np.full(plan.n_ops, link_j_per_byte)
        if dev.link is not None and dev.scale_out is not None:
            kinds = plan.op_int[:, k.C_KIND]
            energy[(kinds == k.OP_COLLECTIVE)
                   & (plan.op_int[:, k.C_CHIPS] > dev.link.max_chips)] = (
                dev.scale_out.energy_j_per_byte)
            if system.parallel_stages:                # expert groups' exchanges
                energy[kinds == k.OP_ALL_TO_ALL] = exchange_figures(
                    dev, system.shard.tp, system.workload.ep, plan.stage)[2]
            for op in np.flatnonzero(kinds == k.OP_SEND):
                energy[op] = handoff_link(
                    dev, system.shard.tp, plan.stage, plan.stages,
                    to_first=plan.op_names[op] == "send_tokens").energy_j_per_byte
        out.append(energy)
    energies = np.concatenate(out)
    return float(energies[0]) if (energies == energies[0]).all() else energies


def _may_cross(plan: Plan) -> bool:
    """Whether any op of the plan is of a kind whose bytes may cross the scale-out network."""
    kinds = plan.op_int[:, k.C_KIND]
    return bool(((kinds == k.OP_COLLECTIVE) | (kinds == k.OP_ALL_TO_ALL)
                 | (kinds == k.OP_SEND)).any())


@dataclass(frozen=True)
class OpFrame:
    """What a run needs of a system's ops that neither a step nor the batch and context change:
    each op's stage, microbatch, kind and layer, which ops read weights or are looked up by the
    peer chips, whether any op's link bytes may cross the scale-out network
    (:func:`link_energy_per_op`), the summaries' :class:`OpGroups` and the report's per-op
    tuples. Shared by the
    runs of a process: its arrays are read-only but for ``op_stage`` and ``weight_ops``, which
    the summaries' Numba pass takes (a read-only array is another Numba type)."""

    op_stage: np.ndarray
    op_micro: np.ndarray
    kind: np.ndarray
    layer: np.ndarray
    weight_ops: np.ndarray
    peer_ops: np.ndarray
    groups: OpGroups
    op_names: tuple[str, ...]
    op_layers: tuple[int, ...]
    op_stages: tuple[int, ...]
    op_microbatches: tuple[int, ...]
    may_cross: bool

    @classmethod
    def of(cls, system: SystemPlan) -> OpFrame:
        stages = system.stages
        op_stage = np.concatenate([np.full(p.n_ops, p.stage, dtype=np.int64) for p in stages])
        op_micro = np.concatenate([p.op_microbatch for p in stages])
        op_int = np.concatenate([p.op_int for p in stages])
        kind, layer = op_int[:, k.C_KIND].copy(), op_int[:, k.C_LAYER].copy()
        weight_ops = (kind == k.OP_EMBED) | (kind == k.OP_NORM) | (kind == k.OP_MATMUL)
        peer_ops = (kind == k.OP_EMBED) & (system.workload.tp > 1)
        for array in (op_micro, kind, layer, peer_ops):
            array.flags.writeable = False
        fixed_launches = np.where(kind < k.OP_COLLECTIVE, op_int[:, k.C_LAUNCHES], 0)
        return cls(op_stage, op_micro, kind, layer, weight_ops, peer_ops,
                   OpGroups(len(stages[0].tier_names), op_stage, op_micro, weight_ops, kind,
                            fixed_launches),
                   tuple(chain.from_iterable(p.op_names for p in stages)),
                   tuple(layer.tolist()), tuple(op_stage.tolist()), tuple(op_micro.tolist()),
                   any(map(_may_cross, stages)))


def op_frame(system: SystemPlan) -> OpFrame:
    """The system's :class:`OpFrame`, kept per process for the stages' op rows as the plan
    caches them (the same ``op_names`` and ``op_microbatch`` objects: one frame for every batch
    and context of a device, model and workload shape)."""
    key = _SameObjects(tuple(obj for p in system.stages for obj in (p.op_names, p.op_microbatch)))
    key.build = lambda: OpFrame.of(system)
    return _op_frame(key, system.workload.tp > 1, len(system.stages[0].tier_names))


class _SameObjects:
    """A cache key equal to another only when it names the very same objects; the cache keeps
    them alive, so no id is reused while an entry lasts. Carries the builder of a miss."""

    __slots__ = ("objects", "hash", "build")

    def __init__(self, objects: tuple) -> None:
        self.objects = objects
        self.hash = hash(tuple(map(id, objects)))
        self.build = None

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, _SameObjects) and len(other.objects) == len(self.objects)
                and all(a is b for a, b in zip(self.objects, other.objects)))


@functools.lru_cache(maxsize=32)
def _op_frame(key: _SameObjects, peers: bool, n_tiers: int) -> OpFrame:
    build, key.build = key.build, None
    return build()


class SystemRun:
    """A system plan's chips between steps: each stage's on-chip tier and the steps so far.

    ``residencies`` replaces the stages' own on-chip tiers (a draft model sharing stage 0's).
    """

    def __init__(self, system: SystemPlan, residencies: list[Residency] | None = None) -> None:
        self.system = system
        stages = system.stages
        self.residencies = residencies or [Residency(plan) for plan in stages]
        self.ops = op_frame(system)
        self.energy = tuple(float(e) for e in stages[0].tier_energy_j_per_byte)
        self.link_energy = link_energy_per_op(system, self.ops.may_cross)
        self.host_s = host_time_per_step(stages[0].runtime,
                                         1 if system.parallel_stages else len(stages))
        self.static_power_w = (system.device.idle_power_w or 0.0) * system.chips
        ops = self.ops
        self.summarize = StepSummarizer(
            stages[0].tier_names, self.energy, system.device.energy_j_per_flop,
            op_stage=ops.op_stage, op_micro=ops.op_micro, weight_ops=ops.weight_ops,
            tp=system.workload.tp, link_energy_j_per_byte=self.link_energy,
            peer_ops=ops.peer_ops, op_layer=ops.layer if system.parallel_stages else None,
            op_kind=ops.kind, host_s=self.host_s, hidden_host_s=hidden_host_per_step(
                stages[0].runtime), static_power_w=self.static_power_w,
            groups=ops.groups, kernel_fixed_s=stages[0].kernel_fixed_s)
        self.summaries: list[StepSummary] = []
        self.cold: StepCounts | None = None
        self.warm: StepCounts | None = None
        workload, model = system.workload, system.model
        self.router = (Router(model, workload.routing, workload.seed,
                              workload.batch * workload.new_tokens, workload.microbatches,
                              workload.ep) if model.is_moe else None)

    def step(self, step: int) -> StepSummary:
        """Emulate step ``step`` on every stage; returns its summary."""
        system = self.system
        routes = self.router.tally(step) if self.router else NO_ROUTES
        counts = _concatenate([run_step(plan, res, step, routes)
                               for plan, res in zip(system.stages, self.residencies)])
        peers = (_concatenate([peer_embedding_counts(plan, step) for plan in system.stages])
                 if system.workload.tp > 1 else None)       # one chip per stage: no peers
        summary = self.summarize(counts, peers)
        self.summaries.append(summary)
        self.cold = counts if self.cold is None else self.cold
        self.warm = counts
        return summary

    def report(self) -> Report:
        """The Report of the steps emulated so far."""
        system = self.system
        dev, workload, stages = system.device, system.workload, system.stages
        holdings = tuple(ChipHoldings(stage=p.stage, layers=p.layers,
                                      weights=p.bytes_by_tier("weight"), kv=p.bytes_by_tier("kv"),
                                      spilled=p.spilled) for p in stages)
        return Report(
            device=dev.name, model=system.model.name, workload=workload_fields(workload),
            tier_names=stages[0].tier_names, clock_hz=dev.clock_hz,
            tokens_per_step=workload.batch * workload.new_tokens,
            new_tokens=workload.new_tokens,
            op_names=self.ops.op_names, op_layers=self.ops.op_layers,
            op_stages=self.ops.op_stages, op_microbatches=self.ops.op_microbatches,
            energy_j_per_byte=self.energy, energy_j_per_flop=dev.energy_j_per_flop,
            steps=tuple(self.summaries), cold_counts=self.cold, warm_counts=self.warm,
            policy=system.policy, tp=workload.tp,
            pp=1 if system.parallel_stages else len(stages), ep=workload.ep,
            microbatches=workload.microbatches, holdings=holdings,
            weights_held=sum(system.bytes_by_tier("weight").values()),
            runtime=stages[0].runtime.name,
            padding=system.shard.describe(system.model) if system.shard.padded else "",
        )
