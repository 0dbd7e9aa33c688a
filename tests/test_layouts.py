"""Memory layouts: policies, placement rules, tiered spill, CXL what-ifs, capacity planning."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import memsim
from memsim.capacity import capacity_table, fewest_chips
from memsim.compare import compare_device, usd_per_million_tokens
from memsim.plan import plan_system
from memsim.testing import examples

WEIGHT_OPS = ("embed", "attn_norm", "qkv", "o_proj", "ffn_norm", "gate", "up", "down",
              "final_norm", "lm_head")


def with_cxl(name: str = "h100-sxm", on_chip: str | None = None) -> memsim.Device:
    dev = memsim.device(name).with_tier("cxl-gen5-x16")
    if on_chip:
        dev = dev.with_overrides({f"tiers.{dev.tiers[0].name}.capacity": on_chip})
    return dev


def tier_reads(report: memsim.Report, which: str = "cold", ops=WEIGHT_OPS) -> dict[str, int]:
    totals = dict.fromkeys(report.tier_names, 0)
    for row in report.op_rows(which):
        if row.name in ops:
            for tier, nbytes in row.bytes_read.items():
                totals[tier] += nbytes
    return totals


# Placement rules --------------------------------------------------------------------------

@pytest.mark.parametrize("selector, target, message", [
    ("wieghts", "cxl", "ROLE"),
    ("weights[a:b]", "cxl", "ROLE"),
    ("kv", "nvme", "no tier 'nvme'"),
    ("kv", "cxl:1.5", "FRACTION"),
    ("kv", "cxl:half", "FRACTION"),
])
def test_bad_placement_names_the_rule(selector, target, message):
    with pytest.raises(memsim.ConfigError, match=message) as info:
        memsim.emulate(with_cxl(), "llama-3.2-1b", placement={selector: target})
    assert info.value.field == f"placement.{selector}"


def test_placement_must_be_a_mapping_of_strings():
    with pytest.raises(memsim.ConfigError) as info:
        memsim.Decode(placement={"kv": 3})
    assert info.value.field == "placement"


def test_a_fraction_moves_the_last_column_tiles_of_each_weight():
    dev = with_cxl(on_chip="4 KiB")
    system = plan_system(dev, memsim.model("llama-3-8b"),
                         memsim.Decode(context=64, placement={"weights": "cxl:0.3"}))
    plan = system.stages[0]
    hbm, cxl = dev.tier_index("hbm"), dev.tier_index("cxl")
    qkv = next(t for t in plan.tensors if t.name == "qkv.0")
    tiles = -(-6144 // dev.tile_n)                     # (32 + 2 x 8) x 128 output columns
    far = -(-3 * tiles // 10)
    assert (qkv.home, qkv.home_hi, qkv.split) == (hbm, cxl, tiles - far)
    assert dict(qkv.tier_bytes) == {hbm: (tiles - far) * 128 * 4096 * 2,
                                    cxl: far * 128 * 4096 * 2}


def test_a_kv_fraction_moves_the_oldest_blocks():
    dev = with_cxl()
    plan = plan_system(dev, memsim.model("llama-3-8b"),
                       memsim.Decode(context=1000, placement={"kv": "cxl:0.5"})).stages[0]
    kv = next(t for t in plan.tensors if t.name == "kv.0")
    blocks = -(-1002 // 16)
    assert (kv.home, kv.home_hi, kv.split) == (2, 1, -(-blocks // 2))


def test_plan_bytes_per_tier_are_what_a_cold_step_reads():
    """With nothing reused on chip, a cold step reads each matmul weight's bytes from the tiers
    the plan put them on, to the byte."""
    dev = with_cxl(on_chip="4 KiB")
    for placement in ({"weights": "cxl:0.3"}, {"qkv[0:2]": "cxl", "down": "cxl:0.5"},
                      {"weights[8:16]": "cxl"}):
        system = plan_system(dev, memsim.model("llama-3.2-1b"),
                             memsim.Decode(context=64, placement=placement))
        report = memsim.emulate(dev, "llama-3.2-1b", context=64, placement=placement)
        plan = system.stages[0]
        matmuls = ("qkv", "o_proj", "gate", "up", "down")
        expected = dict.fromkeys(plan.tier_names, 0)
        for tensor in plan.tensors:
            if tensor.role in matmuls:
                for tier, nbytes in tensor.tier_bytes:
                    expected[plan.tier_names[tier]] += nbytes
        reads = tier_reads(report, ops=matmuls)
        assert {t: reads[t] for t in plan.tier_names[1:]} == {
            t: expected[t] for t in plan.tier_names[1:]}


@st.composite
def placements(draw):
    rules = {}
    for _ in range(draw(st.integers(0, 3))):
        selector = draw(st.sampled_from(["weights", "qkv", "down[1:3]", "embedding", "norms",
                                         "gate[0:1]", "lm_head", "up"]))
        rules[selector] = draw(st.sampled_from(["cxl", "cxl:0.5", "cxl:0.1", "hbm"]))
    return rules


@settings(max_examples=examples(25))
@given(placements(), st.integers(1, 3), st.integers(0, 200))
def test_placement_moves_weight_bytes_between_tiers_but_never_changes_their_total(
        placement, batch, context):
    dev = with_cxl(on_chip="64 MiB")
    base = memsim.emulate(dev, "llama-3.2-1b", batch=batch, context=context, seed=3)
    moved = memsim.emulate(dev, "llama-3.2-1b", batch=batch, context=context, seed=3,
                           placement=placement)
    for which in ("cold", "warm"):
        before, after = tier_reads(base, which), tier_reads(moved, which)
        assert sum(before.values()) == sum(after.values())
        assert before["sram"] == after["sram"]      # the compute consumes the same bytes


def test_a_weight_placed_on_chip_is_never_read_from_off_chip():
    report = memsim.emulate("h100-sxm", "llama-3.2-1b", context=128,
                            placement={"qkv[0:2]": "sram", "o_proj[0:2]": "sram"})
    for row in report.op_rows("cold"):
        if row.name in ("qkv", "o_proj") and row.layer < 2:
            assert row.bytes_read["hbm"] == 0 and row.misses == 0 and row.bytes_read["sram"] > 0


# Policies ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["groq-lpu", "wse-3"])
def test_sram_resident_reads_no_off_chip_weights_even_cold(name):
    dev, model = memsim.device(name), memsim.model("llama-3.2-1b")
    config = fewest_chips(dev, model, memsim.Decode(context=256), "sram-resident")
    report = memsim.emulate(dev, model, tp=config.tp, pp=config.pp, context=256)
    assert report.policy == "sram-resident"
    assert report.off_chip_weight_bytes == 0
    assert sum(report.cold.weight_bytes_read[t] for t in report.tier_names[1:]) == 0


def test_hybrid_pinning_reads_no_off_chip_weights_after_the_first_step():
    model = memsim.Model(name="small", display_name="small", layers=4, hidden=1024, heads=8,
                         kv_heads=2, head_dim=128, ffn=4096, vocab=32000,
                         tied_embeddings=False)
    report = memsim.emulate("mtia-v2", model, context=512, weights="int8", steps=3)
    assert report.policy == "hybrid"
    assert sum(report.cold.weight_bytes_read[t] for t in report.tier_names[1:]) > 0
    for step in report.steps[1:]:
        assert sum(step.weight_bytes_read[t] for t in report.tier_names[1:]) == 0


@pytest.mark.parametrize("fields", [
    dict(batch=1, context=1024, prefill_chunk=512, prefill_context=512),
    dict(batch=64, context=1024, tile_m=16)], ids=["prompt-chunk", "tiled-m"])
def test_more_sram_never_adds_off_chip_bytes_under_pinned_residency(fields):
    """A matmul whose M is tiled reads each weight strip once per M tile. Pinning leaves the LRU
    two strips of room, so the re-reads hit whatever the SRAM holds. Before, first-fit pinning
    could leave it a few hundred KB: MTIA v2 at 28 MB read 2.65 GB off chip, against
    1.58 GB at 24 MB. (The time may still grow by ~0.1 us of a 13 ms step, in the latency
    column of three ops whose tiles now come from two tiers: waves' latency, not bytes.)"""
    dev, model = memsim.device("mtia-v2"), memsim.model("llama-3.2-1b")
    before = None
    for capacity in ("16 MB", "24 MB", "28 MB", "32 MB", "128 MB", "200 MB", "256 MB"):
        what_if = dev.with_overrides({"tiers.sram.capacity": capacity})
        report = memsim.emulate(what_if, model, weights="int8", **fields)
        off_chip = sum(report.bytes_read[t] for t in report.tier_names[1:])
        if before is not None:
            assert off_chip <= before[0], capacity
            assert report.time_per_token <= before[1] * (1 + 1e-5), capacity
        before = (off_chip, report.time_per_token)
    lru = memsim.emulate(dev, model, weights="int8", residency="lru", **fields)
    assert before[0] <= sum(lru.bytes_read[t] for t in lru.tier_names[1:])


def test_weight_streaming_reads_every_weight_from_memoryx_each_step():
    """70B in bf16 is three times the wafer's SRAM: streamed in layer order through an LRU, no
    weight survives until the next step, so every step reads them all from MemoryX."""
    report = memsim.emulate("wse-3", "llama-3-70b", context=256, policy="weight-streaming")
    plan = plan_system(memsim.device("wse-3"), memsim.model("llama-3-70b"),
                       memsim.Decode(context=256, policy="weight-streaming")).stages[0]
    held = plan.bytes_by_tier("weight")
    assert held["sram"] == 0 and plan.bytes_by_tier("kv")["ddr"] == 0
    matmul_bytes = sum(t.bytes for t in plan.tensors if t.role in ("qkv", "o_proj", "gate",
                                                                    "up", "down", "lm_head"))
    assert tier_reads(report, "warm", ("qkv", "o_proj", "gate", "up", "down",
                                       "lm_head"))["ddr"] == matmul_bytes
    assert report.bottleneck == "ddr"


def test_a_policy_the_device_lacks_is_refused():
    """A workload's policy is the device's layout.policy what-if (one rule for the CLI's
    --policy, --set layout.policy and the Python API): refused by the device's own check."""
    with pytest.raises(memsim.ConfigError, match="needs a slower tier") as info:
        memsim.emulate("h100-sxm", "llama-3.2-1b", policy="weight-streaming")
    assert info.value.field == "layout.policy"


# CXL what-ifs -------------------------------------------------------------------------------

def test_h100_with_cxl_holds_llama_70b_bf16_on_one_chip():
    dev = with_cxl()
    with pytest.raises(memsim.CapacityError):
        memsim.emulate("h100-sxm", "llama-3-70b", context=4096)
    report = memsim.emulate(dev, "llama-3-70b", context=4096)
    assert report.policy == "tiered" and report.chips == 1
    held = report.holdings[0]
    assert held.weights["hbm"] + held.kv["hbm"] <= dev.tier("hbm").capacity
    assert held.weights["cxl"] > 0 and held.spilled
    # warm step: every weight byte comes from HBM or CXL, as placed
    assert report.warm.weight_bytes_read["cxl"] > 0.95 * held.weights["cxl"]
    all_hbm = memsim.emulate(memsim.device("h100-sxm").with_overrides(
        {"tiers.hbm.capacity": "200 GB"}), "llama-3-70b", context=4096)
    assert all_hbm.bytes_read["sram"] == report.bytes_read["sram"]
    slowdown = report.time_per_token / all_hbm.time_per_token
    # CXL at ~1/50 of HBM's bandwidth: the spilled 45% of the weights set the pace
    cxl_time = held.weights["cxl"] / dev.tier("cxl").sustained_bandwidth
    assert slowdown > 10
    assert report.time_per_token == pytest.approx(cxl_time, rel=0.15)


def test_kv_on_cxl_instead_of_weights_is_a_different_answer():
    """Llama 3 70B int8 with 21 GB of KV at batch 8 overflows an 80 GB H100 by ~11 GB. Spilling
    the last layers' weights to CXL reads ~11 GB from CXL per step; moving the KV cache instead
    reads all ~21 GB of it from CXL every step (and writes the new tokens there): slower, by about
    the ratio of the CXL bytes."""
    dev = with_cxl()
    fields = dict(batch=8, context=8192, weights="int8")
    spill = memsim.emulate(dev, "llama-3-70b", **fields)
    kv_far = memsim.emulate(dev, "llama-3-70b", placement={"kv": "cxl"}, **fields)
    assert spill.policy == "tiered" and spill.holdings[0].spilled
    assert kv_far.holdings[0].weights["cxl"] == 0 and not kv_far.holdings[0].spilled
    assert spill.warm.weight_bytes_read["cxl"] == spill.bytes_read["cxl"]
    assert kv_far.warm.weight_bytes_read["cxl"] == 0
    attention_cxl = sum(r.bytes_read["cxl"] for r in kv_far.ops if r.name == "attention")
    assert attention_cxl == kv_far.bytes_read["cxl"] > spill.bytes_read["cxl"]
    assert kv_far.bytes_written["cxl"] > 0
    ratio = kv_far.time_per_token / spill.time_per_token
    assert ratio > 1.2
    assert ratio == pytest.approx(kv_far.bytes_read["cxl"] / spill.bytes_read["cxl"], rel=0.25)


def test_tiered_spills_whole_layers_from_the_last():
    plan = plan_system(with_cxl(), memsim.model("llama-3-70b"), memsim.Decode()).stages[0]
    spilled_layers = sorted({t.layer for t in plan.tensors
                             if t.kind == "weight" and t.home == 2})
    assert spilled_layers == list(range(spilled_layers[0], 80))
    assert all(t.home == t.home_hi for t in plan.tensors)


def test_without_a_slower_tier_a_shortfall_points_at_the_planner():
    with pytest.raises(memsim.CapacityError, match="memsim plan h100-sxm llama-3-70b") as info:
        memsim.emulate("h100-sxm", "llama-3-70b")
    assert info.value.shortfall_bytes > 60e9


# Capacity planning ----------------------------------------------------------------------

def test_groq_chips_for_llama_70b_int8():
    dev, model = memsim.device("groq-lpu"), memsim.model("llama-3-70b")
    workload = memsim.Decode(weights="int8", context=2048)
    config = fewest_chips(dev, model, workload, "sram-resident")
    assert config.fits
    system = plan_system(dev, model, memsim.Decode(weights="int8", context=2048, tp=config.tp,
                                                   pp=config.pp))
    held = system.bytes_by_tier("weight")["sram"] + system.bytes_by_tier("kv")["sram"]
    assert config.chips * dev.tiers[0].capacity >= held
    assert config.chips >= -(-held // dev.tiers[0].capacity)
    for plan in system.stages:
        assert sum(plan.bytes_by_tier("weight").values()) + sum(
            plan.bytes_by_tier("kv").values()) <= dev.tiers[0].capacity


def test_nothing_fits_gives_the_shortfall():
    dev, model = memsim.device("ipu-gc200"), memsim.model("llama-3-70b")
    table = capacity_table(dev, model, memsim.Decode())
    own = table[0]
    assert own.policy == "sram-resident" and not own.fits
    assert own.shortfall_bytes > 64 * 0.9e9
    assert "64 chip" in own.reason


def test_more_capacity_never_needs_more_chips():
    model = memsim.model("llama-3-8b")
    previous = None
    for capacity in ("60 GB", "40 GB", "20 GB", "10 GB"):
        dev = memsim.device("mi300x").with_overrides({"tiers.hbm.capacity": capacity})
        chips = fewest_chips(dev, model, memsim.Decode(), "hbm-centric").chips
        assert previous is None or chips >= previous
        previous = chips


def test_compare_sram_machines_read_no_off_chip_weights():
    model = memsim.model("llama-3-70b")
    for name in ("groq-lpu", "wse-3"):
        row = compare_device(memsim.device(name), model, memsim.Decode())
        assert row.fits and row.policy == "sram-resident" and row.chips > 1
        assert row.off_chip_weight_bytes == 0 and row.time_per_token_s > 0


def test_cost_per_million_tokens():
    assert usd_per_million_tokens(3.6, 2, 100.0) == pytest.approx(20.0)
    row = compare_device(memsim.device("h100-sxm"), memsim.model("llama-3.2-1b"),
                         memsim.Decode(batch=4), usd_per_chip_hour=2.0)
    assert row.usd_per_million_tokens == pytest.approx(
        2.0 * row.chips / (row.tokens_per_s_total * 3600) * 1e6)
    unpriced = compare_device(memsim.device("groq-lpu"), memsim.model("llama-3.2-1b"),
                              memsim.Decode())
    assert unpriced.usd_per_million_tokens is None


# Corner cases found in review ----------------------------------------------------------------

@pytest.mark.parametrize("selector, target", [
    ("embedding[0:2]", "hbm"), ("weights[10:5]", "hbm"), ("kv", "hbm:")])
def test_placements_that_select_nothing_are_refused(selector, target):
    with pytest.raises(memsim.ConfigError) as info:
        memsim.emulate(with_cxl(), "llama-3.2-1b", placement={selector: target})
    assert info.value.field == f"placement.{selector}"


def test_a_tied_lm_head_lives_where_its_embedding_lives():
    dev = with_cxl(on_chip="4 KiB")
    for placement in ({"embedding": "cxl"}, {"embedding": "cxl:0.5"}, {"lm_head": "cxl"}):
        report = memsim.emulate(dev, "llama-3.2-1b", context=64, placement=placement)
        plan = plan_system(dev, memsim.model("llama-3.2-1b"),
                           memsim.Decode(context=64, placement=placement)).stages[0]
        embedding = next(t for t in plan.tensors if t.role == "embedding")
        head_reads = next(r for r in report.op_rows("cold") if r.name == "lm_head").bytes_read
        assert head_reads["cxl"] == embedding.bytes_on(dev.tier_index("cxl")) > 0
        assert head_reads["hbm"] == embedding.bytes_on(dev.tier_index("hbm"))


def test_a_pinned_tied_embedding_pins_its_lm_head():
    dev = memsim.device("mtia-v2").with_overrides({"tiers.sram.capacity": "1 GB"})
    report = memsim.emulate(dev, "llama-3.2-1b", context=64, weights="int8", steps=3)
    head = next(r for r in report.ops if r.name == "lm_head")
    assert head.bytes_read["lpddr"] == 0 and head.misses == 0


def test_each_microbatch_looks_up_its_own_tokens():
    dev = memsim.device("h100-sxm").with_overrides({"tiers.sram.capacity": "8 GiB",
                                                    "tiers.hbm.capacity": "1 TB"})
    split = memsim.emulate(dev, "llama-3-8b", batch=2, context=16, microbatches=2, steps=1)
    whole = memsim.emulate(dev, "llama-3-8b", batch=2, context=16, steps=1)
    assert sum(r.misses for r in split.ops if r.name == "embed") == \
        sum(r.misses for r in whole.ops if r.name == "embed")


def test_tiered_spill_moves_tensors_a_fraction_rule_split():
    report = memsim.emulate(with_cxl(), "llama-3-70b", policy="tiered",
                            placement={"weights": "cxl:0.3"})
    held = report.holdings[0]
    assert held.weights["hbm"] + held.kv["hbm"] <= 80e9
    note = held.spilled[0]
    assert "moved from hbm to cxl" in note


def test_spill_note_counts_only_what_the_spill_moved():
    dev = with_cxl()
    plan = plan_system(dev, memsim.model("llama-3-70b"),
                       memsim.Decode(placement={"weights[0:10]": "cxl"})).stages[0]
    user = sum(t.bytes for t in plan.tensors if t.kind == "weight" and 0 <= t.layer < 10)
    spilled = sum(t.bytes for t in plan.tensors if t.kind == "weight" and t.layer >= 10
                  and t.home == dev.tier_index("cxl"))
    assert f"({memsim.format_quantity(spilled, 'capacity')})" in plan.spilled[0]
    assert user > 0


def test_a_tied_model_that_fits_one_chip_plans_one_chip():
    dev = memsim.device("h100-sxm").with_overrides({"tiers.hbm.capacity": "2.7 GB"})
    config = fewest_chips(dev, memsim.model("llama-3.2-1b"), memsim.Decode(context=512),
                          "hbm-centric")
    assert config.chips == 1


def test_a_hybrid_chip_can_keep_the_kv_of_recent_tokens_on_chip():
    dev = memsim.device("mtia-v2")
    plan = plan_system(dev, memsim.model("llama-3.2-1b"),
                       memsim.Decode(context=4000, placement={"kv": "sram:0.25"})).stages[0]
    kv = next(t for t in plan.tensors if t.name == "kv.0")
    blocks = -(-4002 // 16)
    assert (kv.home, kv.home_hi, kv.split) == (1, 0, blocks - -(-blocks // 4))
    report = memsim.emulate(dev, "llama-3.2-1b", context=4000, placement={"kv": "sram:0.25"})
    attention = [r for r in report.ops if r.name == "attention"]
    appends = [r for r in report.ops if r.name == "kv_append"]
    assert all(r.bytes_read["lpddr"] > 0 for r in attention)
    assert all(r.bytes_written["sram"] > 0 and r.bytes_written["lpddr"] == 0 for r in appends)
    whole = memsim.emulate(dev, "llama-3.2-1b", context=4000)
    kv_bytes = sum(r.bytes_read["lpddr"] for r in whole.ops if r.name == "attention")
    near_bytes = sum(r.bytes_read["lpddr"] for r in attention)
    assert near_bytes == pytest.approx(0.75 * kv_bytes, rel=0.01)
