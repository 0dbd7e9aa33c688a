"""The Numba walker equals its pure-Python twin, count for count, on small random shapes,
placements over two tiers, tensor-parallel shards and pipeline stages."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

import memsim
from memsim.emulate import NO_ROUTES, Residency, SystemRun, run_step
from memsim.kernels import step as walker
from memsim.plan import make_plan, plan_system
from memsim.testing import examples
from tests import reference

FORMAT_NAMES = ["bf16", "fp8-e4m3", "int8", "int4-g32", "int4-g128", "nvfp4", "mxfp4", "q4_0",
                "q8_0", "fp8-e4m3-b128"]
KV_FORMATS = ["bf16", "fp8-e4m3", "int8", "int4-g32"]


@st.composite
def small_models(draw):
    kv_heads = draw(st.integers(1, 3))
    heads = kv_heads * draw(st.integers(1, 3))
    head_dim = draw(st.sampled_from([8, 16, 24, 32]))
    layers = draw(st.integers(1, 2))
    moe = {}
    if draw(st.booleans()):
        experts = draw(st.integers(2, 6))
        moe = dict(experts=experts, experts_per_token=draw(st.integers(1, min(2, experts))),
                   shared_experts=draw(st.integers(0, 1)),
                   dense_layers=draw(st.integers(0, layers - 1)),
                   dense_ffn=draw(st.integers(0, 30)) * 4)
    return memsim.Model(
        name="tiny", display_name="tiny", layers=layers,
        hidden=draw(st.integers(4, 40)) * 4, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
        ffn=draw(st.integers(4, 60)) * 4, vocab=draw(st.integers(16, 300)),
        tied_embeddings=draw(st.booleans()), **moe)


@st.composite
def small_runs(draw):
    model = draw(small_models())
    base = memsim.device(draw(st.sampled_from(["h100-sxm", "mtia-v2", "groq-lpu"])))
    overrides = {
        "cores": draw(st.integers(1, 9)),
        "overheads.kernel_fixed": f"{draw(st.sampled_from([0, 1, 3.5]))} us",
        f"tiers.{base.tiers[0].name}.capacity":
            f"{2 ** draw(st.integers(10, 21)) + draw(st.integers(0, 4096))} B",
    }
    if len(base.tiers) > 1:
        overrides[f"tiers.{base.tiers[1].name}.granularity"] = f"{draw(st.sampled_from([1, 32, 64]))} B"
    device = base.with_overrides(overrides)
    placement = {}
    if len(device.tiers) > 1 and draw(st.booleans()):
        device = device.with_tier("cxl-gen5-x16")
        for selector in draw(st.lists(st.sampled_from(
                ["weights", "kv", "embedding", "qkv[0:1]", "down", "norms", "lm_head"]),
                max_size=3, unique=True)):
            placement[selector] = draw(st.sampled_from(
                ["cxl", "cxl:0.5", "cxl:0.25", device.tiers[1].name]))
    tp = draw(st.sampled_from([t for t in (1, 2, 3) if model.heads % t == 0
                               and model.ffn % t == 0 and (model.dense_ffn or model.ffn) % t == 0
                               and (model.kv_heads % t == 0 or t % model.kv_heads == 0)]))
    pp = draw(st.integers(1, model.layers + 1))
    if base.link is None:       # one chip only
        tp = pp = 1
    batch = draw(st.integers(1, 3))
    ep = 1
    if model.is_moe and base.link is not None and draw(st.booleans()):
        ep = draw(st.sampled_from([e for e in (1, 2, 3) if model.experts % e == 0]))
        batch = ep * draw(st.integers(1, 2))
        tp = pp = 1
    workload = memsim.Decode(
        tp=tp, pp=pp, placement=placement, ep=ep,
        routing=draw(st.sampled_from(["uniform", "zipf:1.2"])) if model.is_moe else "uniform",
        microbatches=1 if ep > 1 else draw(st.sampled_from([d for d in (1, 2, 3)
                                                             if batch % d == 0])),
        batch=batch, context=draw(st.integers(0, 70)),
        weights=draw(st.sampled_from(FORMAT_NAMES)), kv=draw(st.sampled_from(KV_FORMATS)),
        steps=draw(st.integers(1, 3)), new_tokens=draw(st.integers(1, 3)),
        kv_block=draw(st.sampled_from([1, 4, 16])), tile_k=draw(st.sampled_from([8, 16, 32, 48])),
        tile_n=draw(st.sampled_from([8, 16, 40])),
        residency=draw(st.sampled_from(["lru", "pinned", "auto"])), seed=draw(st.integers(0, 9)))
    return device, model, workload


def _with_big_memory(device: memsim.Device) -> memsim.Device:
    """Room for any tiny model in every tier but the on-chip one under test."""
    return device.with_overrides({f"tiers.{t.name}.capacity": "1 TB" for t in device.tiers[1:]})


@settings(max_examples=examples(100))
@given(small_runs())
def test_kernel_equals_reference_twin(run):
    check_run_against_twin(*run)


def check_run_against_twin(device, model, workload):
    """Every stage of one run, walked by the kernel and by the twin (a run that does not fit
    even with room in the outer tiers is skipped)."""
    device = _with_big_memory(device) if len(device.tiers) > 1 else device
    try:
        system = plan_system(device, model, workload)
    except memsim.CapacityError:
        return
    router = SystemRun(system).router
    for plan in system.stages:
        check_stage_against_twin(plan, workload, router)


def check_stage_against_twin(plan, workload, router):
    residency = Residency(plan)
    twin = reference.new_state(plan)
    for step in range(workload.steps):
        routes = router.tally(step) if router else NO_ROUTES
        counts = run_step(plan, residency, step, routes)
        expected = reference.run_step(plan, twin, step, routes.tolist())
        reference.assert_counts_equal(counts, expected)
        # the LRU holds exactly what the twin holds
        assert residency.used_bits == sum(twin.lru.tiles.values())


def test_lru_is_bounded_by_the_on_chip_tier_not_the_model():
    """The residency arrays are sized by what the on-chip tier can hold."""
    small = memsim.device("h100-sxm")
    big = small.with_overrides({"tiers.hbm.capacity": "1 TB"})
    for model in ("llama-3-8b", "llama-3-70b"):
        plan = make_plan(big, memsim.model(model), memsim.Decode(context=4096))
        tile_bits = 128 * 128 * 16
        kv_block_bits = 16 * 128 * 16
        assert plan.max_lru_entries <= math.ceil(8 * small.tiers[0].capacity / kv_block_bits) + 1
        rows = 1 + len(plan.tensors) + plan.max_lru_entries + 2
        assert Residency(plan).arena.nbytes <= 8 * walker.ARENA_COLS * rows   # grows up to this
        assert plan.max_lru_entries * tile_bits < 1e3 * 8 * small.tiers[0].capacity
