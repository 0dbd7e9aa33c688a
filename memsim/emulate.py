"""Run a plan through the kernels, step after step, and gather a Report."""

from __future__ import annotations

from typing import Any

import numpy as np

from memsim.device import Device, device as catalog_device
from memsim.errors import ConfigError
from memsim.kernels import step as k
from memsim.model import Model, model as catalog_model
from memsim.plan import Plan, make_plan
from memsim.report import Report, StepCounts, summarize
from memsim.workload import Decode


class Residency:
    """The on-chip tier's state between steps: an exact LRU over tiles and the pinned tensors.

    Its arena is sized by what the on-chip tier can hold (``plan.max_lru_entries``), never by the
    model's size.
    """

    def __init__(self, plan: Plan) -> None:
        self.arena = k.new_arena(len(plan.tensors), plan.max_lru_entries, plan.lru_capacity_bits)

    @property
    def used_bits(self) -> int:
        """Bits the LRU holds now."""
        return int(self.arena[0, k.S_USED_BITS])


def run_step(plan: Plan, residency: Residency, step: int) -> StepCounts:
    """Emulate decode step ``step`` of the plan, updating ``residency``."""
    n_ops, n_tiers = plan.n_ops, len(plan.tier_names)
    counts = StepCounts(
        step=step,
        read_bits=np.zeros((n_ops, n_tiers), dtype=np.int64),
        written_bits=np.zeros((n_ops, n_tiers), dtype=np.int64),
        results=np.zeros((n_ops, k.N_RESULT_COLS), dtype=np.int64),
        times=np.zeros((n_ops, n_tiers + 3), dtype=np.float64),
    )
    dev = plan.device
    k.walk_step(plan.op_int, plan.op_float, step, plan.workload.seed, dev.cores,
                dev.vector_ops_per_s, dev.op_launch_s, plan.tier_bandwidth, plan.tier_latency_s,
                plan.tier_granularity, residency.arena, counts.read_bits, counts.written_bits, counts.results, counts.times)
    return counts


def _resolve(device: Device | str, model: Model | str) -> tuple[Device, Model]:
    dev = catalog_device(device) if isinstance(device, str) else device
    mod = catalog_model(model) if isinstance(model, str) else model
    if not isinstance(dev, Device):
        raise ConfigError(f"expected a Device or a device name, got {type(device).__name__}",
                          field="device")
    if not isinstance(mod, Model):
        raise ConfigError(f"expected a Model or a model name, got {type(model).__name__}",
                          field="model")
    return dev, mod


def emulate(device: Device | str, model: Model | str, workload: Decode | None = None,
            **fields: Any) -> Report:
    """Emulate ``workload.steps`` consecutive decode steps and report the cold and warm step.

    Parameters
    ----------
    device, model : catalog names or loaded objects.
    workload : a :class:`Decode`; keyword ``fields`` build one (``batch=8, context=8192``).
    """
    if workload is None:
        workload = Decode(**fields)
    elif fields:
        raise ConfigError("give either a Decode workload or its fields, not both", field="workload")
    dev, mod = _resolve(device, model)
    plan = make_plan(dev, mod, workload)
    residency = Residency(plan)
    tier_names = plan.tier_names
    energy = tuple(float(e) for e in plan.tier_energy_j_per_byte)
    summaries = []
    cold = warm = None
    for step in range(workload.steps):
        counts = run_step(plan, residency, step)
        summaries.append(summarize(counts, tier_names, energy, dev.energy_j_per_flop))
        if step == 0:
            cold = counts
        warm = counts
    return Report(
        device=dev.name, model=mod.name, workload=workload.to_dict(), tier_names=tier_names,
        clock_hz=dev.clock_hz, tokens_per_step=workload.batch * workload.new_tokens,
        new_tokens=workload.new_tokens, op_names=plan.op_names,
        op_layers=tuple(int(x) for x in plan.op_int[:, k.C_LAYER]),
        energy_j_per_byte=energy, energy_j_per_flop=dev.energy_j_per_flop,
        steps=tuple(summaries), cold_counts=cold, warm_counts=warm,
    )
