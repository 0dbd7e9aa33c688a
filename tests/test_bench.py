"""The benchmark's exact-LRU floor: it is an exact LRU, and it replays the walker's own lookups
(same tiles, same order, same capacity, so the same hits and misses). No timing is asserted."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

from memsim.bench import (bench_plan, new_replay, replay_lru, run_benchmarks, step_speed,
                          tile_stream)
from memsim.device import device
from memsim.emulate import Residency, run_step
from memsim.kernels import step as k
from memsim.model import model
from memsim.plan import make_plan
from memsim.workload import Decode


def _python_lru(ids, bits, capacity_bits, held: OrderedDict) -> tuple[int, int]:
    hits = 0
    for t, b in zip(ids.tolist(), bits.tolist()):
        if t in held:
            held.move_to_end(t)
            hits += 1
            continue
        while held and (sum(held.values()) + b > capacity_bits or b > capacity_bits):
            held.popitem(last=False)
        if b <= capacity_bits:
            held[t] = b
    return hits, len(ids) - hits


@pytest.mark.parametrize("capacity_bits", [0, 5, 40, 300, 10**9])
def test_replay_is_an_exact_lru(capacity_bits):
    rng = np.random.default_rng(capacity_bits)
    n_ids = 50
    size = rng.integers(1, 12, n_ids)
    nodes, state = new_replay(n_ids)
    held: OrderedDict = OrderedDict()
    for _ in range(4):
        ids = rng.integers(0, n_ids, 400)
        got = replay_lru(ids, size[ids], capacity_bits, nodes, state)
        assert got == _python_lru(ids, size[ids], capacity_bits, held)
        assert state[2] == sum(held.values())
        kept = np.flatnonzero(nodes[:, 2] >= 0)
        assert sorted(kept.tolist()) == sorted(held)


@pytest.mark.parametrize("on_chip", [None, "200 MB", "1 GB", "32 GiB"])
@pytest.mark.parametrize("weights", ["bf16", "int8", "int4-g128"])
def test_the_stream_is_the_walkers_lookups(on_chip, weights):
    overrides = {"tiers.hbm.capacity": "1 TB"}
    if on_chip:
        overrides["tiers.sram.capacity"] = on_chip
    dev = device("h100-sxm").with_overrides(overrides)
    plan = make_plan(dev, model("llama-3.2-1b"), Decode(batch=2, context=1000, weights=weights,
                                                        residency="lru"))
    assert not (plan.op_int[:, k.C_HOME] == 0).any()
    residency = Residency(plan)
    nodes, state = new_replay(tile_stream(plan, 0).n_ids)
    for step in range(3):
        counts = run_step(plan, residency, step)
        stream = tile_stream(plan, step)
        hits, misses = replay_lru(stream.ids, stream.bits, plan.lru_capacity_bits, nodes, state)
        assert (hits, misses) == (counts.results[:, k.R_HITS].sum(),
                                  counts.results[:, k.R_MISSES].sum())
        assert stream.bits.sum() == counts.read_bits[:, 0].sum()      # tile bits read on chip
        assert state[2] == residency.used_bits


def test_every_tile_hits_in_the_grown_on_chip_case():
    speed = step_speed(bench_plan("llama-3.2-1b", 512, "32 GiB"), repeats=1)
    assert speed.walker_hits == speed.replay_hits
    assert speed.lookups - speed.replay_hits <= 1        # the step's new embedding row
    assert speed.events == speed.lookups


def test_the_benchmark_prints_both_floors():
    text = run_benchmarks(quick=True)
    assert "exact-LRU floor" in text and "SIMD floor" in text
