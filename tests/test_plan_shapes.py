"""Planning one layer per shape: the replicated plan equals the plan built row by row.

``memsim.plan`` builds the first layer of each shape (and microbatch) row by row and copies it to
the other layers of that shape, changing only ``REPLICATED_COLUMNS`` and reading the placement
columns off the tensors. These tests keep the row-by-row plan (``replicate=False``, every layer
its own template) and the old op-table loop of ``_max_lru_entries`` as the references it is
checked against (STYLE.md pattern 15).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
from memsim.kernels import step as k

import memsim
from memsim import plan as plan_module
from memsim.plan import kv_block_bytes, plan_system
from memsim.workload import Decode, Prefill

TINY = memsim.Model(name="tiny", display_name="tiny", layers=5, hidden=256, heads=4,
                    kv_heads=2, head_dim=64, ffn=512, vocab=1000, tied_embeddings=True)
TINY_MOE = memsim.Model(name="moe", display_name="moe", layers=4, hidden=256, heads=4,
                        kv_heads=2, head_dim=64, ffn=512, vocab=1000, tied_embeddings=False,
                        experts=8, experts_per_token=2, dense_layers=1, shared_experts=1)

CASES = {
    "dense": ("h100-sxm", TINY, Decode(batch=2, context=100)),
    "llama-70b-int8": ("h100-sxm", "llama-3-70b", Decode(batch=1, context=4096, weights="int8")),
    "q4_k_m-mixture": ("h100-sxm", "llama-3-8b", Decode(batch=1, context=512, weights="q4_k_m")),
    "tp": ("h100-sxm", "llama-3-70b", Decode(batch=4, context=1024, tp=4)),
    "pp-microbatches": ("h100-sxm", TINY, Decode(batch=4, context=64, pp=2, microbatches=2)),
    "pp-llama": ("h100-sxm", "llama-3-8b", Decode(batch=8, context=256, pp=4)),
    "moe": ("h100-sxm", TINY_MOE, Decode(batch=4, context=64)),
    "mixtral": ("h200", "mixtral-8x7b", Decode(batch=2, context=1024)),
    "ep": ("h100-sxm", TINY_MOE, Decode(batch=4, context=64, ep=2)),
    "ep-tp": ("h100-sxm", TINY_MOE, Decode(batch=4, context=64, ep=2, tp=2)),
    "prefill": ("h100-sxm", TINY, Prefill(batch=2, prompt=100).step()),
    "mixed-step": ("h100-sxm", TINY, Decode(batch=4, context=40, prefill_chunk=48)),
    "draft-heads": ("h100-sxm", TINY, Decode(batch=1, context=64, draft_heads=3)),
    "placement": ("h100-sxm", "llama-3-8b",
                  Decode(batch=1, context=512, placement={"kv": "sram:0.5"})),
    "layer-range-rule": ("cxl", "llama-3-8b",
                         Decode(batch=1, context=512, placement={"weights[20:32]": "cxl:0.3"})),
    "tiered-spill": ("cxl", "llama-3-70b", Decode(batch=8, context=8192, weights="int8")),
    "pinned": ("h100-sxm", "llama-3.2-1b", Decode(batch=1, context=256, residency="pinned")),
    # placement computed per tensor where a rule depends on the layer (experts by rank)
    "experts-rule": ("cxl", TINY_MOE, Decode(batch=4, context=64,
                                             placement={"experts": "cxl:0.5"})),
    "tied-head-rule": ("cxl", TINY, Decode(batch=2, context=100,
                                           placement={"lm_head": "cxl:0.5"})),
    "pp-70b-microbatches": ("cxl", "llama-3-70b",
                               Decode(batch=8, context=8192, weights="int8", pp=2,
                                      microbatches=2)),
}


def _row_by_row(monkeypatch: pytest.MonkeyPatch, device, model, workload):
    """Every layer's specs built, placed and lowered on its own."""
    monkeypatch.setattr(plan_module, "_plan_stage",
                        functools.partial(plan_module._plan_stage, replicate=False))
    monkeypatch.setattr(plan_module, "_item_specs",
                        functools.partial(plan_module._item_specs, replicate=False))
    try:
        return plan_system(device, model, workload)
    finally:
        monkeypatch.undo()


def _load(device_name, model):
    dev = (memsim.device("h100-sxm").with_tier("cxl-gen5-x16") if device_name == "cxl"
           else memsim.device(device_name))
    return dev, memsim.model(model) if isinstance(model, str) else model


@pytest.mark.parametrize("case", sorted(CASES))
def test_replicated_plan_equals_row_by_row(case, monkeypatch):
    device_name, model, workload = CASES[case]
    dev, mod = _load(device_name, model)
    fast = plan_system(dev, mod, workload)
    slow = _row_by_row(monkeypatch, dev, mod, workload)
    assert len(fast.stages) == len(slow.stages)
    for a, b in zip(fast.stages, slow.stages):
        assert a.op_int.dtype == b.op_int.dtype
        np.testing.assert_array_equal(a.op_int, b.op_int)
        np.testing.assert_array_equal(a.op_float, b.op_float)
        np.testing.assert_array_equal(a.op_microbatch, b.op_microbatch)
        assert a.op_names == b.op_names
        assert a.op_formats == b.op_formats
        assert a.tensors == b.tensors
        assert a.layers == b.layers
        assert (a.max_lru_entries, a.lru_capacity_bits) == (b.max_lru_entries,
                                                            b.lru_capacity_bits)


def test_layers_of_one_shape_are_copies():
    """The 80 layers of Llama 3 70B have one shape: one is built, 79 are copies."""
    dev, mod = _load("h100-sxm", "llama-3-70b")
    stage = plan_system(dev, mod, Decode(batch=1, context=4096, weights="int8")).stages[0]
    per_layer = np.bincount(stage.op_int[:, k.C_LAYER] + 1)[1:]
    assert len(per_layer) == 80 and (per_layer == per_layer[0]).all()
    assert set(plan_module.REPLICATED_COLUMNS).isdisjoint(plan_module.TENSOR_COLUMNS)


def _max_lru_entries_by_row(op_int, tensors, capacity_bits, workload, tiers) -> int:
    """The op-table loop ``_max_lru_entries`` replaced (over the tensors), kept as its
    reference."""
    smallest = None
    distinct = 0
    for row in op_int:
        if row[k.C_TENSOR] < 0:
            continue
        tensor = tensors[row[k.C_TENSOR]]
        on_chip = tensor.home == 0 and tensor.home_hi == 0
        if on_chip or tensor.pinned or row[k.C_KIND] == k.OP_KV_APPEND:
            continue
        kind = row[k.C_KIND]
        if kind == k.OP_MATMUL:
            tk, tn, kk, n = row[k.C_TILE_K], row[k.C_TILE_N], row[k.C_K], row[k.C_N]
            bits = min(tk, kk % tk or tk) * min(tn, n % tn or tn) * row[k.C_ELEM_BITS]
            distinct += -(-kk // tk) * -(-n // tn)
        elif kind == k.OP_ATTENTION:
            bits = 8 * kv_block_bytes(row[k.C_KV_ROW_BITS], workload.kv_block,
                                      min(tiers[tensor.home].granularity,
                                          tiers[tensor.home_hi].granularity))
            distinct += 2 * row[k.C_BATCH] * row[k.C_KV_HEADS] * row[k.C_KV_MAX_BLOCKS]
        elif kind == k.OP_EMBED:
            bits = row[k.C_K] * row[k.C_ELEM_BITS]
            distinct += row[k.C_M] * workload.steps
        else:
            bits = row[k.C_K] * row[k.C_ELEM_BITS]
            distinct += 1
        smallest = bits if smallest is None else min(smallest, bits)
    if smallest is None or capacity_bits == 0:
        return 1
    return int(max(1, min(distinct, capacity_bits // max(int(smallest), 1) + 1)))


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("residency", ["lru", "pinned"])
def test_lru_entries_equal_the_row_loop(case, residency):
    device_name, model, workload = CASES[case]
    dev, mod = _load(device_name, model)
    for what_if in (dev, dev.with_overrides({"tiers.sram.capacity": "160 GiB"})):
        system = plan_system(what_if, mod, dataclasses.replace(workload, residency=residency))
        for stage in system.stages:
            expected = _max_lru_entries_by_row(stage.op_int, stage.tensors,
                                               stage.lru_capacity_bits, system.workload,
                                               what_if.tiers)
            assert stage.max_lru_entries == expected
            pinned = np.array([stage.tensors[t].pinned if t >= 0 else False
                               for t in stage.op_int[:, k.C_TENSOR]])
            np.testing.assert_array_equal(stage.op_int[:, k.C_PINNED], pinned.astype(np.int64))
