"""The LRU's tile bound (``Plan.max_lru_entries``, counted by memsim.kernels.bounds.lru_tiles)
against the closed form written with numpy over the whole op table, on plans of every op kind,
placement and residency."""

from __future__ import annotations

import numpy as np
import pytest

import memsim
from memsim.kernels import step as k
from memsim.plan import plan_system
from memsim.workload import Decode


def closed_form(op_int: np.ndarray, capacity_bits: int, workload: Decode, tiers) -> int:
    """Distinct tiles of the cached ops (an embedding's M x steps rows, a norm's vector, a
    matmul's ceil(K/tk) x ceil(N/tn) tiles, attention's blocks of every stream), at most the
    capacity over the smallest tile, plus one."""
    if capacity_bits == 0:
        return 1
    granularity = np.array([t.granularity for t in tiers], dtype=np.int64)
    kind = op_int[:, k.C_KIND]
    cached = ((op_int[:, k.C_TENSOR] >= 0) & (kind != k.OP_KV_APPEND)
              & (op_int[:, k.C_PINNED] == 0)
              & ~((op_int[:, k.C_HOME] == 0) & (op_int[:, k.C_HOME_HI] == 0)))
    if not cached.any():
        return 1
    rows, kind = op_int[cached], kind[cached]
    kk, n, elem = rows[:, k.C_K], rows[:, k.C_N], rows[:, k.C_ELEM_BITS]
    tk, tn = rows[:, k.C_TILE_K], rows[:, k.C_TILE_N]
    bits = kk * elem
    distinct = np.where(kind == k.OP_EMBED, rows[:, k.C_M] * workload.steps, 1)
    mm = kind == k.OP_MATMUL
    min_k = np.minimum(tk, np.where(kk % tk == 0, tk, kk % tk))
    min_n = np.minimum(tn, np.where(n % tn == 0, tn, n % tn))
    bits[mm] = (min_k * min_n * elem)[mm]
    distinct[mm] = (-(-kk // tk) * -(-n // tn))[mm]
    att = kind == k.OP_ATTENTION
    grain = np.minimum(granularity[rows[:, k.C_HOME]], granularity[rows[:, k.C_HOME_HI]])
    block = -(-(workload.kv_block * rows[:, k.C_KV_ROW_BITS]) // 8)
    bits[att] = (8 * (-(-block // grain) * grain))[att]
    streams = rows[:, k.C_KV_PARTS] * rows[:, k.C_BATCH] * rows[:, k.C_KV_HEADS]
    distinct[att] = (streams * rows[:, k.C_KV_MAX_BLOCKS])[att]
    return int(max(1, min(int(distinct.sum()), capacity_bits // max(int(bits.min()), 1) + 1)))


POINTS = [
    ("h100-sxm", "llama-3-70b", dict(weights="int8")),
    ("h100-sxm", "llama-3.2-1b", dict(batch=3, context=300, steps=4)),
    ("h100-sxm", "llama-3.2-1b", dict(batch=2, context=100, residency="pinned")),
    ("h100-sxm", "mixtral-8x7b", dict(tp=2, batch=4)),
    ("h200", "llama-3-8b", dict(batch=8, context=256, pp=2, microbatches=2)),
    ("h100-sxm", "llama-3-8b", dict(batch=2, context=1024, prefill_chunk=256)),
    ("mtia-v2", "llama-3.2-1b", dict(context=512, weights="int8")),
    ("wse-3", "llama-3-8b", dict(batch=4, context=8192)),
    ("mi300x", "llama-3.2-1b", dict(batch=8, weights="int4-g128", kv="fp8-e4m3")),
]


@pytest.mark.parametrize("point", range(len(POINTS)), ids=lambda i: f"{POINTS[i][1]}-{i}")
def test_lru_bound_matches_the_closed_form(point):
    device, model, fields = POINTS[point]
    dev = memsim.device(device)
    for on_chip in (None, "160 GiB"):
        what_if = dev if on_chip is None else dev.with_overrides(
            {f"tiers.{dev.tiers[0].name}.capacity": on_chip})
        workload = Decode(**fields)
        for plan in plan_system(what_if, memsim.model(model), workload).stages:
            assert plan.max_lru_entries == closed_form(plan.op_int, plan.lru_capacity_bits,
                                                       workload, what_if.tiers)
