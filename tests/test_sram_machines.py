"""SRAM machines stated at their public sizes: GroqCloud's 576 LPUs for Llama 3.1 70B, whose
128K-vocabulary embedding does not fit 8 chips per stage (issue 14, item 4)."""

import memsim
import pytest

from memsim.plan import fold_pipeline, plan_system

LLAMA2_70B = "validation/models/llama-2-70b.toml"
GROQ_SRAM_B = 230_686_720          # 220 MiB, devices/groq-lpu.toml tiers.sram.capacity


def _embedding_bytes_per_chip(vocab: int, hidden: int, tp: int, bits: int) -> int:
    """One chip's rows of the vocabulary split in equal ranges (the last padded) x hidden."""
    return -(-vocab // tp) * hidden * bits // 8


def test_embedding_closed_form_matches_the_capacity_error_it_replaces():
    # the shortfall docs/validation.md reported before the fold looked at capacity
    assert _embedding_bytes_per_chip(128256, 8192, 8, 16) == 262_668_288 > GROQ_SRAM_B
    assert _embedding_bytes_per_chip(128256, 8192, 16, 16) == 131_334_144 < GROQ_SRAM_B


def test_the_fold_takes_the_smallest_tensor_parallel_stage_that_holds_the_embedding():
    device = memsim.device("groq-lpu")
    model = memsim.model("llama-3-70b")
    workload = memsim.Decode(batch=1, context=512, weights="int8", kv="fp16", pp=576)
    assert fold_pipeline(model, workload).tp == 8                 # without a device: as before
    folded = fold_pipeline(model, workload, device)
    # tp 9 and 12 pad the 64 query heads; tp 9 would not hold the embedding either
    assert (folded.tp, folded.pp, folded.chips) == (16, 36, 576)
    plan = plan_system(device, model, workload)
    assert (plan.workload.tp, len(plan.stages)) == (16, 36)
    embedding = _embedding_bytes_per_chip(model.vocab, model.hidden, 16, 16)
    held = [stage.bytes_by_tier("weight")["sram"] for stage in plan.stages]
    assert max(held) <= GROQ_SRAM_B
    assert held[0] >= embedding                 # the stage holding the embedding holds all of it


def test_llama_2_70b_keeps_its_72_stages_of_8():
    device = memsim.device("groq-lpu")
    model = memsim.load_model(LLAMA2_70B)
    workload = memsim.Decode(batch=1, context=512, weights="int8", kv="fp16", pp=576)
    assert fold_pipeline(model, workload, device).tp == 8


def test_groqcloud_llama_31_70b_on_576_chips_runs_and_keeps_its_weights_on_chip():
    report = memsim.emulate("groq-lpu", "llama-3-70b", batch=1, context=512, weights="int8",
                            kv="fp16", pp=576)
    assert report.chips == 576 and (report.tp, report.pp) == (16, 36)
    assert report.time_per_step == pytest.approx(sum(report.warm.chip_busy_s), rel=1e-12)
    assert set(report.warm.bytes_read) == {"sram"}


def test_no_fold_fits_reports_the_smallest_and_its_shortfall():
    device = memsim.device("groq-lpu")
    model = memsim.model("llama-3-70b")
    workload = memsim.Decode(batch=1, context=512, weights="bf16", kv="fp16", pp=164)
    # 141 GB of BF16 weights cannot fit 164 x 230 MB = 37.8 GB under any fold
    assert fold_pipeline(model, workload, device).tp == 2
    with pytest.raises(memsim.CapacityError):
        plan_system(device, model, workload)


# A wafer's cores multiply the weights they hold ----------------------------------------------

def test_resident_tile_is_one_cores_share_of_the_weights():
    from memsim.wafer import resident_tile_side
    model = memsim.model("llama-3-8b")
    assert model.total_params == 8_030_261_248
    # 8,030,261,248 / 900,000 = 8,922.5 weights per core; isqrt = 94 (94^2 = 8,836 <= 8,922 < 95^2)
    assert resident_tile_side(model, 900_000, 1) == 94
    assert resident_tile_side(model, 900_000, 4) == 47          # 2,230 per core
    assert resident_tile_side(model, 10**12, 1) == 1            # more cores than weights


def test_a_resident_wafer_step_charges_each_op_one_cores_share():
    """Llama 3 8B on one WSE-3: qkv's 4,096 x 6,144 weights in 94 x 94 tiles go one per core;
    a unit is 94 x 94 MACs at 8 per cycle (compute.fp16 / cores = 17.6 GFLOP/s a core)."""
    device = memsim.device("wse-3")
    assert device.tile_per_core == "resident"
    plan = plan_system(device, memsim.model("llama-3-8b"), memsim.Decode(batch=1, context=512))
    assert (plan.workload.tile_k, plan.workload.tile_n) == (94, 94)
    report = memsim.emulate(device, "llama-3-8b", batch=1, context=512)
    core_flops = 15.8e15 / 900_000
    qkv = next(r for r in report.op_rows("warm") if r.name == "qkv")
    assert qkv.flops == 2 * 4096 * 6144                      # one layer's row
    unit_s = 2 * 94 * 94 / core_flops                         # 1.0066 us
    sram_latency_s = device.tier("sram").latency_s
    assert qkv.time_s == pytest.approx(unit_s + device.op_launch_s + sram_latency_s, rel=1e-9)


def test_streamed_weights_and_a_workload_tile_keep_their_tiles():
    device = memsim.device("wse-3")
    model = memsim.model("llama-3-8b")
    streaming = plan_system(device, model, memsim.Decode(batch=1, context=512,
                                                         policy="weight-streaming"))
    assert streaming.workload.tile_k is None               # the device's 64 x 64
    mine = plan_system(device, model, memsim.Decode(batch=1, context=512, tile_k=64, tile_n=64))
    assert (mine.workload.tile_k, mine.workload.tile_n) == (64, 64)
    own = memsim.emulate(device, "llama-3-8b", batch=1, context=512, tile_k=64, tile_n=64)
    fixed = device.with_overrides({"tile.per_core": "fixed"})
    assert memsim.emulate(fixed, "llama-3-8b", batch=1, context=512).time_per_step == \
        pytest.approx(own.time_per_step, rel=1e-12)


def test_tile_per_core_must_be_fixed_or_resident(tmp_path):
    text = open("devices/wse-3.toml").read().replace('per_core = "resident"', 'per_core = "all"')
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(memsim.ConfigError) as info:
        memsim.load_device(str(path))
    assert "tile.per_core" in str(info.value) and "bad.toml" in str(info.value)
