"""Real deployments stated directly: padded tensor parallel, pipelines longer than the model,
expert parallel with tensor parallel."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import memsim
import memsim.plan
from memsim.capacity import max_batch, max_batch_table
from memsim.layout import divides, group_kv_heads, shard, tp_degrees
from memsim.plan import fold_pipeline, kv_cache_bytes, plan_system
from memsim.testing import examples

PROJECTIONS = ("qkv", "o_proj", "gate", "up", "down")


def _model(heads: int, kv_heads: int, ffn: int, **extra) -> memsim.Model:
    return memsim.Model(name="m", display_name="m", layers=2, hidden=256, heads=heads,
                        kv_heads=kv_heads, head_dim=32, ffn=ffn, vocab=1000,
                        tied_embeddings=False, **extra)


# Padding ------------------------------------------------------------------------------------

@pytest.mark.parametrize("heads, kv_heads, ranks, expected", [
    (56, 8, 32, 32),      # NxD's own example: replicate to the TP degree
    (64, 8, 24, 24),      # Llama 3 70B on 24 NeuronCores: one replica per core
    (64, 8, 12, 72),      # 12 is no multiple of 8: multi-head over the 72 padded heads
    (32, 32, 24, 48),     # multi-head attention pads its KV heads with the query heads
    (64, 8, 8, 8),        # divides: split plainly
    (64, 8, 16, 16),      # vLLM's replication
])
def test_kv_heads_follow_neuron_rule(heads, kv_heads, ranks, expected):
    assert group_kv_heads(heads, kv_heads, ranks) == expected


def test_llama_3_70b_on_24_neuroncores():
    """The TGI inf2.48xlarge deployment: 12 chips of 2 NeuronCores, TP degree 24."""
    model = memsim.model("llama-3-70b")
    sh = shard(model, 12, ranks_per_chip=2)
    assert (sh.ranks, sh.heads, sh.kv_heads, sh.ffn) == (24, 6, 2, 2390)
    assert (sh.padded_heads, sh.padded_kv_heads, sh.padded_ffn) == (8, 16, 8)
    assert sh.q_per_kv == 3
    line = sh.describe(model)
    assert "64 -> 72" in line and "8 -> 24" in line and "28672 -> 28680" in line


@pytest.mark.parametrize("name", ["llama-3-8b", "llama-3-70b", "mixtral-8x7b", "llama-3.1-405b", "deepseek-v3-style"])
def test_degrees_that_divide_shard_as_before(name):
    """Every degree vLLM accepts shards without padding, as the plain split did."""
    model = memsim.model(name)
    for tp in tp_degrees(model, 64):
        sh = shard(model, tp)
        assert sh.heads * tp == model.heads and sh.ffn * tp == model.ffn
        assert sh.kv_heads == max(1, model.kv_heads // tp)
        assert sh.vocab_rows == -(-model.vocab // tp)
        assert sh.padded_heads == sh.padded_ffn == 0
    assert all(divides(model, tp) for tp in tp_degrees(model, 64))


def _chip_weight_bytes(model: memsim.Model, sh, bytes_per_weight: int = 2) -> int:
    """Closed form of one chip's weights (bf16, untied embedding): padded projections, every
    norm, an embedding and LM head shard."""
    h, hd = model.hidden, model.head_dim
    layer = ((sh.heads + 2 * sh.kv_heads) * hd * h + h * sh.heads * hd + 3 * h * sh.ffn
             + 2 * h) * bytes_per_weight
    return model.layers * layer + (2 * sh.vocab_rows * h + h) * bytes_per_weight


def test_padded_shard_weight_bytes_are_the_closed_form(monkeypatch):
    """Llama 3 70B bf16 over 24 NeuronCores: what each Inferentia2 chip holds."""
    monkeypatch.setattr(memsim.plan, "tp_ranks_per_chip", lambda device: 2)
    model = memsim.model("llama-3-70b")
    system = plan_system(memsim.device("inferentia2"), model,
                         memsim.Decode(tp=12, context=1622))
    sh = system.shard
    assert sh.ranks == 24 and sh.padded_heads == 8
    held = sum(system.stages[0].bytes_by_tier("weight").values())
    assert held == _chip_weight_bytes(model, sh)
    unpadded = _chip_weight_bytes(model, shard(model, 8))      # a plain split, for scale
    assert held * 12 > unpadded * 8                              # the padding is real bytes


@settings(max_examples=examples(40))
@given(tp=st.integers(1, 8), kv_heads=st.integers(1, 8), group=st.integers(1, 4),
       ffn=st.integers(8, 300), ranks_per_chip=st.integers(1, 2))
def test_any_degree_shards_with_padding_below_one_row_per_rank(tp, kv_heads, group, ffn,
                                                               ranks_per_chip):
    """Whatever the degree: the group holds every head and column, pads each width by less
    than one per rank, and one chip's planned weights are the closed form."""
    model = _model(kv_heads * group, kv_heads, ffn)
    sh = shard(model, tp, ranks_per_chip)
    ranks = tp * ranks_per_chip
    assert sh.heads * tp == model.heads + sh.padded_heads and 0 <= sh.padded_heads < ranks
    assert sh.ffn * tp == model.ffn + sh.padded_ffn and 0 <= sh.padded_ffn < ranks
    assert sh.kv_heads * tp == model.kv_heads + sh.padded_kv_heads >= model.kv_heads
    assert sh.heads % sh.kv_heads == 0
    if ranks_per_chip == 1:
        system = plan_system(memsim.device("h100-sxm"), model, memsim.Decode(tp=tp, context=8))
        assert sum(system.stages[0].bytes_by_tier("weight").values()) == \
            _chip_weight_bytes(model, sh)


def test_the_walker_reads_and_multiplies_the_padding():
    """6 heads and an FFN of 102 over 4 chips: 8 heads and 104 columns are stored, every byte
    is read once from home, and the matmuls count the padded widths."""
    model = _model(6, 2, 102)
    dev = memsim.device("h100-sxm").with_overrides({"tiers.sram.capacity": "4 KiB"})
    report = memsim.emulate(dev, model, batch=1, context=16, tp=4, steps=1)
    system = plan_system(dev, model, memsim.Decode(batch=1, context=16, tp=4, steps=1))
    sh = system.shard
    assert (sh.heads, sh.kv_heads, sh.ffn) == (2, 1, 26)
    h, hd = model.hidden, model.head_dim
    expected = {"qkv": (2 + 2) * hd * h, "o_proj": h * 2 * hd, "gate": 26 * h, "up": 26 * h,
                "down": h * 26}
    for row in report.op_rows("cold"):
        if row.name in PROJECTIONS:
            assert row.bytes_read["hbm"] == 2 * expected[row.name]
            assert row.flops == 2 * expected[row.name]          # one token: 2 x weights


# Pipelines longer than the model --------------------------------------------------------------

def test_a_pipeline_longer_than_the_model_folds_into_tensor_parallel_stages():
    model = memsim.load_model("validation/models/llama-2-70b.toml")
    folded = fold_pipeline(model, memsim.Decode(pp=576))
    assert (folded.tp, folded.pp, folded.chips) == (8, 72, 576)
    assert fold_pipeline(model, memsim.Decode(pp=82)).pp == 82        # one stage per item
    assert fold_pipeline(model, memsim.Decode(tp=2, pp=164)).tp == 4
    assert fold_pipeline(model, memsim.Decode(batch=8, pp=576)).microbatches == 8


def test_groqcloud_llama_2_70b_on_576_chips():
    """The 576-chip system stated as ``pp=576``: 72 stages of 8 chips, SRAM-resident int8, and
    at batch 1 the pipeline is one bubble: the step is every stage's work in turn."""
    report = memsim.emulate("groq-lpu", "validation/models/llama-2-70b.toml", batch=1,
                            context=512, weights="int8", kv="fp16", pp=576)
    assert report.chips == 576 and (report.tp, report.pp) == (8, 72)
    assert report.time_per_step == pytest.approx(sum(report.warm.chip_busy_s), rel=1e-12)
    assert report.warm.bytes_read.get("hbm", 0) == 0


# Expert parallel with tensor parallel -------------------------------------------------------

def _trace(tmp_path, choices) -> str:
    path = tmp_path / "trace.npy"
    np.save(path, np.array(choices))
    return str(path)


def test_expert_groups_of_tensor_parallel_chips(tmp_path):
    """Four expert groups of two chips: each chip holds its group's two experts, half of each
    expert's FFN; rank r of each group runs the all-to-all of its group's tokens with rank r of
    the others, so the exchanged bytes are the one-chip-per-group closed form, tp times."""
    experts, k, groups, tp, batch = 8, 2, 4, 2, 8
    rng = np.random.default_rng(5)
    choices = np.array([[rng.choice(experts, k, replace=False) for _ in range(batch)]
                        for _ in range(2)])
    path = _trace(tmp_path, choices)
    model = _model(4, 2, 512, experts=experts, experts_per_token=k)
    system = plan_system(memsim.device("h100-sxm"), model,
                         memsim.Decode(batch=batch, context=16, ep=groups, tp=tp, routing=path))
    assert system.chips == groups * tp and len(system.stages) == groups
    for plan in system.stages:
        gates = [t for t in plan.tensors if t.name.startswith("expert_gate.0.")]
        assert len(gates) == experts // groups
        assert all(t.bytes == (512 // tp) * model.hidden * 2 for t in gates)
    report = memsim.emulate("h100-sxm", model, batch=batch, context=16, ep=groups, tp=tp,
                            routing=path)
    rows = 0
    for layer in range(2):
        for token in range(batch):
            home = token // (batch // groups)
            rows += len({e // (experts // groups) for e in choices[layer, token]} - {home})
    exchanged = sum(r.link_bytes for r in report.ops if r.name in ("moe_dispatch",
                                                                     "moe_combine"))
    assert exchanged == 2 * rows * model.hidden * 2               # one chip of every group
    reduced = sum(r.link_bytes for r in report.ops if r.name not in ("moe_dispatch",
                                                                      "moe_combine"))
    assert report.link_bytes == tp * (exchanged + reduced)
    assert report.chips == groups * tp and report.ep == groups


def test_expert_parallel_with_a_pipeline_is_refused():
    model = memsim.model("mixtral-8x7b")
    with pytest.raises(memsim.ConfigError, match="pipeline") as info:
        plan_system(memsim.device("h100-sxm"), model, memsim.Decode(ep=2, pp=2, batch=2))
    assert info.value.field == "ep"


# The largest batch ------------------------------------------------------------------------------

@pytest.mark.parametrize("tp", [1, 2])
def test_max_batch_agrees_with_the_closed_form_capacity(tp):
    """HBM holds the weights once and one paged KV cache per sequence: the largest batch is
    the free bytes over one sequence's cache, on each chip of the group."""
    dev, model = memsim.device("h100-sxm"), memsim.model("llama-3-8b")
    workload = memsim.Decode(context=8192, tp=tp)
    found = max_batch(dev, model, workload)
    hbm = dev.tiers[dev.tier_index("hbm")]
    weights = plan_system(dev, model, workload).stages[0].bytes_by_tier("weight")["hbm"]
    final_tokens = workload.context + workload.steps * workload.new_tokens
    per_sequence = model.layers * kv_cache_bytes(model, workload, final_tokens, hbm.granularity,
                                                 kv_heads=model.kv_heads // tp, sequences=1)
    assert found.batch == (hbm.capacity - weights) // per_sequence
    assert (found.tp, found.pp, found.chips, found.policy) == (tp, 1, tp, "hbm-centric")
    assert found.tokens_per_s_total == pytest.approx(found.batch / found.time_per_token_s)


def test_max_batch_is_zero_when_one_sequence_does_not_fit():
    found = max_batch(memsim.device("h100-sxm"), memsim.model("llama-3-70b"),
                      memsim.Decode(context=8192))
    assert found.batch == 0 and "does not fit" in found.reason


def test_neuroncores_beyond_the_chips_get_the_chip_spelling(monkeypatch):
    """TP counts chips; on a chip of two NeuronCores, 24 ranks are tp=12."""
    monkeypatch.setattr(memsim.plan, "tp_ranks_per_chip", lambda device: 2)
    with pytest.raises(memsim.ConfigError, match="24 ranks are tp=12") as info:
        plan_system(memsim.device("inferentia2"), memsim.model("llama-3-8b"),
                    memsim.Decode(tp=24))
    assert info.value.field == "tp"


def test_max_batch_per_chip_count_on_an_sram_machine():
    """Each degree on the fewest stages that hold one sequence: one more sequence than the
    answer does not fit; a degree whose embedding alone overflows a chip says so."""
    dev, model = memsim.device("groq-lpu"), memsim.model("llama-3.2-1b")
    workload = memsim.Decode(context=1024, steps=1)
    rows = max_batch_table(dev, model, workload)
    assert [r.tp for r in rows][:3] == [1, 2, 4]
    assert rows[0].batch == 0 and "alone overflows" in rows[0].reason
    for row in rows:
        assert row.policy == "sram-resident"
        if row.batch:
            edge = dataclasses.replace(workload, tp=row.tp, pp=row.pp, microbatches=None)
            plan_system(dev, model, dataclasses.replace(edge, batch=row.batch))
            with pytest.raises(memsim.CapacityError):
                plan_system(dev, model, dataclasses.replace(edge, batch=row.batch + 1))


def test_max_batch_under_expert_parallel_stays_a_multiple_of_the_groups():
    found = max_batch(memsim.device("h100-sxm"), memsim.model("mixtral-8x7b"),
                      memsim.Decode(context=8192, ep=2, tp=2))
    assert found.batch % 2 == 0 and found.chips == 4 and found.ep == 2
