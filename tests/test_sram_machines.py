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
