"""The plan's tensors as a table (``memsim.plan.TensorTable``): the columns the op table and the
residency read agree with the Tensor objects built from them, whatever the layer shapes."""

from __future__ import annotations

import numpy as np
import pytest
from memsim.kernels import step as k

import memsim
from memsim.plan import TENSOR_COLUMNS, layer_name, plan_system
from memsim.workload import Decode

POINTS = {
    "llama-70b": ("llama-3-70b", Decode(batch=1, context=4096, weights="int8")),
    "q4_k_m": ("llama-3-8b", Decode(batch=1, context=512, weights="q4_k_m")),
    "microbatches": ("llama-3-8b", Decode(batch=8, context=256, pp=2, microbatches=2)),
    "mixtral": ("mixtral-8x7b", Decode(batch=2, context=1024, tp=2)),
}


@pytest.mark.parametrize("point", sorted(POINTS))
def test_table_matches_its_tensors(point):
    name, workload = POINTS[point]
    system = plan_system(memsim.device("h200"), memsim.model(name), workload)
    for plan in system.stages:
        table, tensors = plan.tensor_table, plan.tensors
        assert plan.n_tensors == len(tensors) == len(table)
        placed = np.array([(t.home, t.home_hi, t.split, int(t.pinned)) for t in tensors])
        np.testing.assert_array_equal(table.placed(), placed)
        assert len({t.name for t in tensors}) == len(tensors)
        for i in np.flatnonzero(plan.op_int[:, k.C_TENSOR] >= 0)[:50]:
            tensor = tensors[plan.op_int[i, k.C_TENSOR]]
            assert tensor.layer == plan.op_int[i, k.C_LAYER]
            np.testing.assert_array_equal(plan.op_int[i, list(TENSOR_COLUMNS)], placed[
                plan.op_int[i, k.C_TENSOR]])
        for kind in ("weight", "kv"):
            held = dict.fromkeys(plan.tier_names, 0)
            for t in tensors:
                if t.kind == kind and not t.aliased:
                    for tier, nbytes in t.tier_bytes:
                        held[plan.tier_names[tier]] += nbytes
            assert plan.bytes_by_tier(kind) == held


def test_layer_name_moves_the_layer_only():
    assert layer_name("kv.3", 7) == "kv.7"
    assert layer_name("kv.3.mb1", 7) == "kv.7.mb1"
    assert layer_name("expert_gate.3.17", 9) == "expert_gate.9.17"
