"""The LRU arena grows on demand: a walk that starts with room for two runs of tiles gives the
counts and times, bit for bit, of one sized for everything the on-chip tier could hold."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import memsim
from memsim.emulate import NO_ROUTES, Residency, SystemRun, run_step
from memsim.kernels import step as walker
from memsim.plan import plan_system
from memsim.testing import examples
from tests.test_walker_twin import _with_big_memory, small_runs


def _steps(plan, residency, workload, router):
    """Every step's counts, one array per counter."""
    out = []
    for step in range(workload.steps):
        routes = router.tally(step) if router else NO_ROUTES
        counts = run_step(plan, residency, step, routes)
        out.append((counts.read_bits, counts.written_bits, counts.results, counts.times,
                    residency.used_bits))
    return out


def _same_walk(system, initial_runs: int) -> None:
    router = SystemRun(system).router
    for plan in system.stages:
        small = Residency(plan, initial_runs=initial_runs)
        full = Residency(plan, initial_runs=plan.max_lru_entries + 2)
        assert walker.arena_runs(full.arena) == full.max_runs
        got = _steps(plan, small, system.workload, router)
        want = _steps(plan, full, system.workload, router)
        for step_got, step_want in zip(got, want):
            for a, b in zip(step_got, step_want):
                np.testing.assert_array_equal(a, b)
        assert walker.arena_runs(small.arena) <= small.max_runs
        assert small.arena[0, walker.S_RUNS] == full.arena[0, walker.S_RUNS]


POINTS = [
    # every weight tile an LRU hit in the warm step
    ("h100-sxm", "llama-3.2-1b", {"tiers.sram.capacity": "8 GiB"},
     memsim.Decode(context=300, steps=3, tile_k=128, tile_n=128, residency="lru")),
    # the LRU is smaller than the weights: fills, evictions and streamed ops
    ("h100-sxm", "llama-3.2-1b", {"tiers.sram.capacity": "3 MiB"},
     memsim.Decode(batch=3, context=100, steps=2, weights="int4-g128", kv="fp8-e4m3")),
    # an MoE model (routed experts) with pinned weights
    ("mtia-v2", "mixtral-8x7b", {"tiers.sram.capacity": "512 MiB"},
     memsim.Decode(batch=2, context=64, steps=2, residency="pinned", tp=1)),
]


@pytest.mark.parametrize("device_name,model_name,overrides,workload", POINTS)
@pytest.mark.parametrize("initial_runs", [2, 3, 17])
def test_a_small_arena_grows_to_the_counts_of_a_full_one(device_name, model_name, overrides,
                                                         workload, initial_runs):
    device = _with_big_memory(memsim.device(device_name).with_overrides(overrides))
    _same_walk(plan_system(device, memsim.model(model_name), workload), initial_runs)


def test_a_prefill_with_m_tiles_grows_its_arena_too():
    device = memsim.device("h100-sxm").with_overrides({"tiers.sram.capacity": "64 MiB"})
    workload = memsim.Prefill(batch=2, prompt=96, tile_m=32, kv_block=16).step()
    _same_walk(plan_system(device, memsim.model("llama-3.2-1b"), workload), 2)


def test_the_arena_stays_near_the_runs_held_not_the_tier():
    """A 160 GiB on-chip what-if: the LRU could hold millions of tiles, the arena holds runs."""
    device = memsim.device("h100-sxm").with_overrides({"tiers.sram.capacity": "160 GiB"})
    system = plan_system(device, memsim.model("llama-3-8b"), memsim.Decode(context=4096))
    plan = system.stages[0]
    residency = Residency(plan, initial_runs=64)
    for step in range(2):
        run_step(plan, residency, step)
    held = int(residency.arena[0, walker.S_RUNS])
    assert plan.max_lru_entries > 1000 * held
    # it grows for the largest op's worst case (two runs per tile it looks up), no further
    assert 8 * walker.arena_runs(residency.arena) < plan.max_lru_entries


def test_growing_keeps_the_state_and_adds_rows_never_taken():
    arena = walker.new_arena(3, 2, 1000)
    assert arena[0, walker.S_UNTAKEN] == 4 and arena[0, walker.S_FREE] == walker.NIL
    arena[4:6, walker.N_TENSOR] = 7          # as if runs had taken two node rows
    arena[0, walker.S_UNTAKEN] = 6
    grown = walker.grow_arena(arena, 10)
    assert walker.arena_runs(grown) == 10
    np.testing.assert_array_equal(grown[:6], arena[:6])
    assert grown[0, walker.S_UNTAKEN] == 6
    assert walker.grow_arena(grown, 5) is grown


def _garbage_after_untaken(residency: Residency, value: int) -> None:
    arena = residency.arena
    arena[arena[0, walker.S_UNTAKEN]:] = value


@pytest.mark.parametrize("device_name,model_name,overrides,workload", POINTS)
@pytest.mark.parametrize("value", [0, -1, 7, 2**62])
def test_rows_no_run_has_taken_are_never_read(device_name, model_name, overrides, workload,
                                              value):
    """The arena's node rows are left as allocated (np.empty): whatever they hold, a walk
    gives the counts of one over zeroed rows, growing included."""
    device = _with_big_memory(memsim.device(device_name).with_overrides(overrides))
    system = plan_system(device, memsim.model(model_name), workload)
    router = SystemRun(system).router
    for plan in system.stages:
        for initial_runs in (3, plan.max_lru_entries + 2):
            zeroed, filled = (Residency(plan, initial_runs=initial_runs) for _ in range(2))
            _garbage_after_untaken(zeroed, 0)
            _garbage_after_untaken(filled, value)
            got = _steps(plan, filled, system.workload, router)
            want = _steps(plan, zeroed, system.workload, router)
            for step_got, step_want in zip(got, want):
                for a, b in zip(step_got, step_want):
                    np.testing.assert_array_equal(a, b)


@settings(max_examples=examples(60), deadline=None)
@given(small_runs(), st.integers(2, 9))
def test_any_initial_arena_gives_the_counts_of_a_full_one(run, initial_runs):
    device, model, workload = run
    device = _with_big_memory(device) if len(device.tiers) > 1 else device
    try:
        system = plan_system(device, model, workload)
    except memsim.CapacityError:
        return
    _same_walk(system, initial_runs)
