"""memsim.compare.spill_cost: the all-in-main-memory baseline holds what the fullest chip holds."""

from __future__ import annotations

from memsim.compare import spill_cost
from memsim.inputs import decode_from, device_from, model_from
from memsim.plan import plan_system

SPILLED_70B = device_from("h100-sxm", add_tiers=("cxl-gen5-x16",))


def _chip_bytes(system) -> list[int]:
    """Weight and KV bytes one chip of each stage holds, over every tier."""
    return [sum(plan.bytes_by_tier("weight").values()) + sum(plan.bytes_by_tier("kv").values())
            for plan in system.stages]


def test_the_baseline_of_uneven_stages_reads_nothing_from_the_slower_tier():
    """Two uneven tiered stages: the baseline's main tier was the average chip's bytes, so the
    fuller stage still spilled to CXL and the slowdown read 20x instead of 37x."""
    model = model_from("llama-3-70b")
    workload = decode_from(policy="tiered", pp=2, batch=64, context=8192)
    held = _chip_bytes(plan_system(SPILLED_70B, model, workload))
    assert max(held) > sum(held) // len(held) > SPILLED_70B.tier("hbm").capacity   # uneven, spilled
    cost = spill_cost(SPILLED_70B, model, workload)
    assert cost.bytes_read["cxl"] > 0 and cost.baseline_bytes_read["cxl"] == 0
    assert cost.baseline_capacity == max(held)
    assert cost.baseline_bytes_read["hbm"] == sum(cost.bytes_read.values()) - cost.bytes_read["sram"]


def test_a_single_stage_baseline_is_its_chips_bytes_as_before():
    """One stage (on two tensor-parallel chips): the largest chip is the average one."""
    model = model_from("llama-3-70b")
    workload = decode_from(tp=2, batch=8, context=8192, policy="tiered")
    system = plan_system(SPILLED_70B, model, workload)
    total = sum(sum(system.bytes_by_tier(kind).values()) for kind in ("weight", "kv"))
    cost = spill_cost(SPILLED_70B, model, workload)
    assert len(system.stages) == 1 and cost.bytes_read["cxl"] > 0
    assert cost.baseline_capacity == total // system.chips == _chip_bytes(system)[0]
    assert cost.baseline_bytes_read["cxl"] == 0
