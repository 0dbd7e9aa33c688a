"""Models split across chips: tensor-parallel shards, collectives, pipeline stages."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import memsim
from memsim.emulate import link_energy_per_op
from memsim.layout import collective_steps
from memsim.plan import plan_system
from memsim.runtime import collective_time, runtime
from memsim.testing import examples

SHARDED = ("qkv", "o_proj", "gate", "up", "down", "lm_head")


def no_reuse(name: str = "h100-sxm") -> memsim.Device:
    """A device whose on-chip tier holds almost nothing: every weight byte comes from home."""
    dev = memsim.device(name)
    return dev.with_overrides({f"tiers.{dev.tiers[0].name}.capacity": "4 KiB"})


def _weight_reads(report: memsim.Report, names=SHARDED, tier: str = "hbm") -> int:
    """Bytes one chip of stage 0 read in the cold step, when every tile is a first touch."""
    return sum(row.bytes_read[tier] for row in report.op_rows("cold")
               if row.name in names and row.stage == 0)


def test_llama_70b_tp8_reads_one_eighth_of_the_sharded_weights_per_chip():
    dev = no_reuse()
    one = memsim.emulate(dev.with_overrides({"tiers.hbm.capacity": "1 TB"}), "llama-3-70b",
                         batch=1, context=1024)
    eight = memsim.emulate(dev, "llama-3-70b", batch=1, context=1024, tp=8)
    assert _weight_reads(one) % 8 == 0
    assert _weight_reads(eight) == _weight_reads(one) // 8
    # norms are replicated: every chip reads all of them
    norms = ("attn_norm", "ffn_norm", "final_norm")
    assert _weight_reads(eight, norms) == _weight_reads(one, norms)
    # the system reads 8 chips' worth, except the embedding row, read once by its owner
    chip_embed = sum(r.bytes_read["hbm"] for r in eight.ops if r.name == "embed")
    assert eight.warm.weight_bytes_read["hbm"] == (
        8 * (eight.chip(0)["weight_bytes_read"]["hbm"] - chip_embed) + 8192 * 2)


def _ring_bytes(m: int, width: int, chips: int, act_bytes: int, passes: int) -> int:
    return passes * (chips - 1) * math.ceil(m * width / chips) * act_bytes


def test_llama_70b_tp8_link_bytes_are_the_ring_all_reduce():
    model = memsim.model("llama-3-70b")
    report = memsim.emulate("h100-sxm", model, batch=4, context=512, tp=8)
    m, h = 4, model.hidden
    per_all_reduce = 2 * 7 * (m * h // 8) * 2          # 2 (N-1)/N of an m x h bf16 buffer
    assert per_all_reduce * 8 == 2 * 7 * m * h * 2
    vocab_rows = math.ceil(model.vocab / 8)
    expected = ((2 * model.layers + 1) * per_all_reduce       # 2 per layer + the embedding
                + 7 * m * vocab_rows * 2)                      # all-gather of the logits
    assert report.chip(0)["link_bytes"] == expected
    assert report.link_bytes == 8 * expected


@st.composite
def sharded_runs(draw):
    tp = draw(st.sampled_from([1, 2, 3, 4, 6, 8]))
    kv_heads = tp * draw(st.integers(1, 2))       # replicated KV heads are tested apart
    heads = kv_heads * draw(st.integers(1, 3))
    heads = heads if heads % tp == 0 else heads * tp
    model = memsim.Model(
        name="random", display_name="random", layers=draw(st.integers(1, 3)),
        hidden=tp * draw(st.integers(1, 24)) * 8, heads=heads, kv_heads=kv_heads,
        head_dim=draw(st.sampled_from([8, 16, 32])), ffn=tp * draw(st.integers(1, 40)) * 8,
        vocab=tp * draw(st.integers(4, 200)), tied_embeddings=draw(st.booleans()))
    workload = dict(batch=draw(st.integers(1, 5)), context=draw(st.integers(0, 300)),
                    weights=draw(st.sampled_from(["bf16", "uniform:fp8-e4m3"])),
                    tile_k=draw(st.sampled_from([8, 16, 64])),
                    tile_n=draw(st.sampled_from([8, 24, 64])))
    return model, tp, workload


@settings(max_examples=examples(40))
@given(sharded_runs())
def test_tp_shards_and_ring_bytes_for_random_shapes(run):
    """Each chip reads exactly 1/tp of every sharded weight, and sends exactly the ring
    all-reduce's 2 (N-1)/N of each buffer. (fp8-e4m3 keeps one scale per shard, which the test
    counts; per-channel and grouped scales of a row-parallel shard are duplicated per chip, as
    in a real sharded checkpoint, so those formats are not 1/tp exactly.)"""
    model, tp, fields = run
    dev = no_reuse()
    one = memsim.emulate(dev, model, tp=1, **fields)
    many = memsim.emulate(dev, model, tp=tp, **fields)
    scale_bytes = 4 if fields["weights"] == "uniform:fp8-e4m3" else 0
    n_tensors = sum(1 for row in one.ops if row.name in SHARDED)
    assert (_weight_reads(many) - n_tensors * scale_bytes) * tp == \
        _weight_reads(one) - n_tensors * scale_bytes
    m = fields["batch"]
    for row in many.ops:
        if row.name in ("attn_allreduce", "ffn_allreduce", "embed_allreduce"):
            assert row.link_bytes == _ring_bytes(m, model.hidden, tp, 2, 2)
            assert row.link_bytes * tp == 2 * (tp - 1) * m * model.hidden * 2
        elif row.name == "logits_allgather":
            assert row.link_bytes == _ring_bytes(m, model.vocab, tp, 2, 1)
    assert sum(1 for row in many.ops if row.link_bytes) == (
        0 if tp == 1 else 2 * model.layers + 2)


@settings(max_examples=examples(25))
@given(sharded_runs())
def test_more_chips_never_raise_per_chip_weight_bytes(run):
    model, tp, fields = run
    dev = no_reuse()

    def most_per_chip(**parallel) -> int:
        plan = plan_system(dev, model, memsim.Decode(**parallel, **fields))
        return max(stage.bytes_by_tier("weight")["hbm"] for stage in plan.stages)

    degrees = [d for d in (1, 2, 3, 4, 6, 8) if tp % d == 0]
    held = [most_per_chip(tp=d) for d in degrees]
    assert held == sorted(held, reverse=True)
    held = [most_per_chip(pp=pp) for pp in range(1, model.layers + 3)]
    assert held == sorted(held, reverse=True)


def test_kv_heads_are_replicated_when_fewer_than_chips():
    model = memsim.model("llama-3-70b")            # 8 KV heads
    plan = plan_system(memsim.device("groq-lpu"), model, memsim.Decode(tp=16, pp=42)).stages[1]
    assert plan.op_int[2, memsim.kernels.step.C_KV_HEADS] == 1
    assert plan.op_int[2, memsim.kernels.step.C_Q_PER_KV] == 64 // 16
    qkv = next(t for t in plan.tensors if t.role == "qkv")
    assert qkv.bytes == (64 // 16 + 2 * 1) * 128 * 8192 * 2    # K and V of one head, replicated


def test_tp_that_does_not_divide_the_heads_pads_them():
    """A degree that vLLM refuses is run as AWS Neuron runs it (padded heads and FFN, KV heads
    converted to multi-head); one that divides the model is split plainly."""
    model = memsim.model("llama-3-70b")
    padded = plan_system(memsim.device("h100-sxm"), model, memsim.Decode(tp=3)).shard
    assert (padded.heads, padded.kv_heads, padded.ffn) == (22, 22, 9558)
    assert (padded.padded_heads, padded.padded_ffn) == (2, 2)
    plain = plan_system(memsim.device("groq-lpu"), model, memsim.Decode(tp=16, pp=42)).shard
    assert (plain.heads, plain.kv_heads, plain.ffn) == (4, 1, 1792)
    assert plain.padded_heads == plain.padded_ffn == 0 and plain.padded_kv_heads == 8


def test_chips_beyond_the_link_domain_are_refused_without_a_scale_out_network():
    dev = memsim.device("mtia-v2")
    assert dev.scale_out is None
    with pytest.raises(memsim.ConfigError, match="link.max_chips") as info:
        memsim.emulate(dev, "llama-3.2-1b", tp=2, pp=dev.link.max_chips)
    assert info.value.field == "pp"


def test_a_pipeline_across_link_domains_hands_off_over_the_scale_out_network():
    """Two NVLink domains of 8 H100s: the stage boundary between them crosses InfiniBand."""
    dev = memsim.device("h100-sxm")
    report = memsim.emulate(dev, "llama-3-8b", batch=1, context=128, tp=8, pp=2)
    send = next(r for r in report.ops if r.name == "send")
    expected = (send.link_bytes / dev.scale_out.bandwidth + dev.scale_out.latency_s
                + dev.op_launch_s)
    assert send.time_s == pytest.approx(expected, rel=1e-12)
    with pytest.raises(memsim.ConfigError, match="scale_out.max_chips"):
        memsim.emulate(dev, "llama-3-8b", tp=8, pp=dev.scale_out.max_chips)


@pytest.mark.parametrize("tp, pp, crosses", [(4, 2, False), (1, 8, False), (2, 2, False),
                                              (8, 2, True), (2, 8, True)])
def test_the_sampled_tokens_go_back_over_the_domain_link_when_the_system_fits_one(tp, pp,
                                                                                 crosses):
    """The last stage's sampled tokens reach the first stage over NVLink when every chip of the
    system sits in one 8-GPU node (tp 4 x pp 2, pp 8), over InfiniBand when the stages span two
    nodes; their bytes' energy is the same link's."""
    dev = memsim.device("h100-sxm")
    system = plan_system(dev, memsim.model("llama-3-8b"),
                         memsim.Decode(batch=1, context=128, tp=tp, pp=pp))
    report = memsim.emulate(dev, "llama-3-8b", batch=1, context=128, tp=tp, pp=pp)
    back = next(r for r in report.ops if r.name == "send_tokens")
    link = dev.scale_out if crosses else dev.link
    assert back.time_s == pytest.approx(
        back.link_bytes / link.bandwidth + link.latency_s + dev.op_launch_s, rel=1e-12)
    energy = np.broadcast_to(link_energy_per_op(system), (len(report.ops),))
    assert energy[report.ops.index(back)] == link.energy_j_per_byte


@pytest.mark.parametrize("topology, chips, steps", [
    ("ring", 8, 7), ("switch", 8, 7), ("fully-connected", 16, 1), ("torus-2d", 16, 6),
    ("torus-2d", 8, 4), ("torus-3d", 64, 9), ("mesh", 4, 2), ("ring", 1, 0)])
def test_collective_steps_per_topology(topology, chips, steps):
    assert collective_steps(topology, chips) == steps


def test_collective_time_is_the_librarys_for_the_call():
    """The all-reduce of a 2 x 4096 bf16 buffer over 4 NVLinked H100s under TensorRT-LLM: the
    time memsim.runtime.collective_time gives (NCCL's tuning model or the custom all-reduce,
    whichever is faster), plus one kernel's dispatch gap."""
    dev = memsim.device("h100-sxm")
    report = memsim.emulate(dev, "llama-3-8b", batch=2, context=128, tp=4, runtime="trt-llm")
    row = next(r for r in report.ops if r.name == "attn_allreduce")
    link = dev.link
    timed = collective_time(runtime("trt-llm"), "all_reduce", 2 * 4096 * 2, 4, "nvlink",
                            link.bandwidth, link.latency_s, collective_steps(link.topology, 4))
    assert row.time_s == pytest.approx(timed.seconds + dev.op_launch_s, rel=1e-12)
    assert row.link_bytes == 2 * 3 * (2 * 4096 * 2 // 4)        # the ring's bytes, unchanged
    assert row.bound_by in ("link", "latency", "launch")


# Pipeline parallel ------------------------------------------------------------------------

def test_pipeline_at_batch_one_is_a_full_bubble():
    """One microbatch: stages run one after another, so the step is the sum of their work."""
    report = memsim.emulate("h100-sxm", "llama-3-8b", batch=1, context=512, pp=4)
    assert report.microbatches == 1
    host = report.warm.time_by_bound["host"]          # the runtime's graph replay per step
    assert report.time_per_step == pytest.approx(sum(report.warm.chip_busy_s) + host,
                                                 rel=1e-12)
    sends = [row for row in report.ops if row.name == "send"]
    assert len(sends) == 3
    assert all(row.link_bytes == 4096 * 2 for row in sends)   # one token's hidden state, bf16
    back = [row for row in report.ops if row.name == "send_tokens"]
    assert len(back) == 1 and back[0].link_bytes == 4      # the sampled token id goes back


def test_microbatches_fill_a_compute_bound_pipeline():
    """With weights on chip and compute the bound, microbatches overlap the stages: the busiest
    stage sets the pace instead of the sum of all of them."""
    bubble = memsim.emulate("wse-3", "llama-3-8b", batch=16, context=256, pp=4, microbatches=1)
    filled = memsim.emulate("wse-3", "llama-3-8b", batch=16, context=256, pp=4)
    assert filled.microbatches == 4 and filled.bottleneck == "compute"
    assert bubble.time_per_step == pytest.approx(sum(bubble.warm.chip_busy_s), rel=1e-12)
    assert filled.time_per_step < sum(filled.warm.chip_busy_s)
    assert filled.time_per_step >= max(filled.warm.chip_busy_s)
    assert filled.tokens_per_s_total > 1.5 * bubble.tokens_per_s_total


def test_microbatches_do_not_help_a_memory_bound_pipeline():
    """On HBM each microbatch re-reads its stage's weights: four microbatches read them four
    times, so the busiest stage is as slow as the whole bubbled pipeline."""
    bubble = memsim.emulate("h100-sxm", "llama-3-8b", batch=8, context=512, pp=4,
                            microbatches=1)
    filled = memsim.emulate("h100-sxm", "llama-3-8b", batch=8, context=512, pp=4)
    assert filled.warm.weight_bytes_read["hbm"] == pytest.approx(
        4 * bubble.warm.weight_bytes_read["hbm"], rel=1e-3)
    assert filled.tokens_per_s_total == pytest.approx(bubble.tokens_per_s_total, rel=0.1)


def test_pipeline_stages_split_layers_and_hold_equal_bytes():
    system = plan_system(memsim.device("tpu-v5e"), memsim.model("llama-3-8b"),
                         memsim.Decode(pp=4))
    layers = [layer for stage in system.stages for layer in stage.layers]
    assert layers == list(range(32))
    held = [sum(stage.bytes_by_tier("weight").values()) for stage in system.stages]
    assert max(held) < 1.2 * sum(held) / 4


def test_tied_embeddings_get_a_head_copy_on_the_last_stage():
    system = plan_system(memsim.device("h100-sxm"), memsim.model("llama-3.2-1b"),
                         memsim.Decode(pp=2))
    first, last = system.stages
    assert any(t.role == "embedding" for t in first.tensors)
    head = next(t for t in last.tensors if t.role == "lm_head")
    assert not head.aliased and head.bytes > 0
    single = plan_system(memsim.device("h100-sxm"), memsim.model("llama-3.2-1b"),
                         memsim.Decode()).stages[0]
    assert next(t for t in single.tensors if t.role == "lm_head").aliased


def test_per_chip_and_system_figures_agree():
    report = memsim.emulate("h100-sxm", "llama-3-8b", batch=2, context=256, tp=2, pp=2)
    assert report.chips == 4
    row_bytes = 4096 * 2
    for tier in report.tier_names:
        chip_embed = sum(r.bytes_read[tier] for r in report.ops if r.name == "embed")
        assert report.bytes_read[tier] == 2 * (sum(report.chip(s)["bytes_read"][tier]
                                                   for s in range(2)) - chip_embed) + 2 * row_bytes
    assert report.link_bytes == 2 * sum(report.chip(s)["link_bytes"] for s in range(2))
    data = report.to_dict()
    assert len(data["per_chip"]) == 2 and data["chips"] == 4


@pytest.mark.parametrize("tp, batch", [(2, 1), (4, 3), (8, 4)])
def test_vocabulary_parallel_lookup_reads_each_token_row_once_in_the_system(tp, batch):
    """Each token's embedding row is read by the one chip that owns its vocabulary range: the
    system reads batch rows whatever the seed; the emulated chip reads only its own share."""
    row_bytes = 4096 * 2
    for seed in range(4):
        report = memsim.emulate("h100-sxm", "llama-3-8b", batch=batch, context=16, tp=tp,
                                seed=seed)
        chip = sum(r.bytes_read["hbm"] for r in report.ops if r.name == "embed")
        assert chip % row_bytes == 0 and chip <= batch * row_bytes
        embed_system = report.warm.weight_bytes_read["hbm"] - tp * sum(
            r.bytes_read["hbm"] for r in report.ops if r.name not in ("embed",)
            and r.name not in ("attention", "kv_append"))
        assert embed_system == batch * row_bytes
