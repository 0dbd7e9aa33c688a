"""A run's step summaries (memsim.report.StepSummarizer, which takes the step before's summary
when only flops and vector operations changed) equal :func:`memsim.report.summarize` of each
step's counters, figure for figure and bit for bit, and share no mutable dict."""

from __future__ import annotations

import math

import pytest

import memsim
from memsim.emulate import SystemRun, _concatenate, peer_embedding_counts
from memsim.plan import plan_system
from memsim.report import summarize
from tests.test_plan_cache import POINTS, _device


def _bits(value):
    """``value`` with every float as its bit pattern (so -0.0 differs from 0.0)."""
    if isinstance(value, float):
        return ("float", math.copysign(1.0, value), value.hex())
    if isinstance(value, dict):
        return {key: _bits(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_bits(item) for item in value]
    return value


def _direct(run: SystemRun, counts, peers) -> memsim.report.StepSummary:
    system, ops = run.system, run.ops
    return summarize(counts, system.stages[0].tier_names, run.energy,
                     system.device.energy_j_per_flop, op_stage=ops.op_stage,
                     op_micro=ops.op_micro, weight_ops=ops.weight_ops, tp=system.workload.tp,
                     link_energy_j_per_byte=run.link_energy, peers=peers,
                     peer_ops=ops.peer_ops,
                     op_layer=ops.layer if system.parallel_stages else None,
                     op_kind=ops.kind, host_s=run.host_s, static_power_w=run.static_power_w,
                     groups=ops.groups, kernel_fixed_s=system.stages[0].kernel_fixed_s)


@pytest.mark.parametrize("point", POINTS[:27], ids=lambda p: f"{p[0]}-{p[1]}-{p[2]}")
def test_each_step_summary_is_summarize_of_its_counts(point):
    device, model, fields = point
    fields = {**fields, "steps": max(3, fields.get("steps", 2))}
    system = plan_system(_device(device), memsim.model(model), memsim.Decode(**fields))
    run = SystemRun(system)
    for step in range(system.workload.steps):
        summary = run.step(step)
        peers = None
        if system.workload.tp > 1:
            peers = _concatenate([peer_embedding_counts(plan, step) for plan in system.stages])
        assert _bits(summary.to_dict()) == _bits(_direct(run, run.warm, peers).to_dict())


def test_a_reused_summary_shares_no_dict():
    system = plan_system(memsim.device("h100-sxm"), memsim.model("llama-3.2-1b"),
                         memsim.Decode(weights="int8"))
    run = SystemRun(system)
    cold, warm = run.step(0), run.step(1)
    assert cold.time_s == warm.time_s and cold.flops != warm.flops   # the reused path
    for name in ("bytes_read", "bytes_written", "weight_bytes_read", "time_by_bound",
                 "time_split"):
        assert getattr(cold, name) is not getattr(warm, name)
    for name in ("chip_bytes_read", "chip_bytes_written", "chip_weight_bytes_read"):
        assert all(a is not b for a, b in zip(getattr(cold, name), getattr(warm, name)))


TP_POINTS = [p for p in POINTS if p[2].get("tp", 1) > 1]


def test_the_other_chips_count_the_peer_ops_alone():
    """summarize adds the other chips' counts over the peer ops alone (the vocabulary-parallel
    embedding lookup): no other op's row of theirs may hold a count."""
    counted = 0
    for device, model, fields in TP_POINTS:
        system = plan_system(_device(device), memsim.model(model),
                             memsim.Decode(**{**fields, "steps": 3}))
        outside = ~SystemRun(system).ops.peer_ops
        for step in range(3):
            peers = _concatenate([peer_embedding_counts(plan, step) for plan in system.stages])
            for counts in (peers.read_bits, peers.written_bits, peers.results, peers.times):
                assert not counts[outside].any(), (device, model, fields, step)
                counted += int(counts.any())
    assert TP_POINTS and counted
