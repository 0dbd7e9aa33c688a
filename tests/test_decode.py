"""Decode-step counts against closed forms, the memory wall, the traps peer tools fall into."""

from __future__ import annotations

import csv
import io
import math

import pytest

import memsim
from memsim.checkpoints import weight_formats
from memsim import bytes_for


def _block_bytes(model: memsim.Model, kv: str, block: int, granularity: int) -> int:
    row_bits = memsim.get_format(kv).tensor_bits((1, model.head_dim)) \
        - memsim.get_format(kv).tensor_meta_bits
    return -(-(-(-block * row_bits // 8)) // granularity) * granularity


def _weight_bytes_streamed(model: memsim.Model, fmt: str, rows: int, norm_fmt: str = "bf16") -> int:
    """Bytes of every weight a decode step reads: matmuls, norms, and one embedding row per token."""
    h, hd = model.hidden, model.head_dim
    per_layer = (bytes_for(((model.heads + 2 * model.kv_heads) * hd, h), fmt)
                 + bytes_for((h, model.heads * hd), fmt)
                 + 2 * bytes_for((model.ffn, h), fmt) + bytes_for((h, model.ffn), fmt)
                 + 2 * bytes_for((1, h), norm_fmt))
    embedding_rows = rows * bytes_for((1, h), fmt)
    return (model.layers * per_layer + embedding_rows + bytes_for((1, h), norm_fmt)
            + bytes_for((model.vocab, h), fmt))


def _kv_read_bytes(model, kv, batch, tokens, block, granularity):
    blocks = -(-tokens // block)
    return model.layers * batch * model.kv_heads * 2 * blocks * _block_bytes(model, kv, block,
                                                                              granularity)


def test_llama3_8b_bf16_h100_warm_step_is_weights_plus_kv_exactly():
    dev = memsim.device("h100-sxm")
    model = memsim.model("llama-3-8b")
    report = memsim.emulate(dev, model, batch=1, context=4096)
    hbm = dev.tier("hbm")
    weights = _weight_bytes_streamed(model, "bf16", rows=1)
    tokens = 4096 + 2          # the warm step is the second: two tokens appended
    kv_read = _kv_read_bytes(model, "bf16", 1, tokens, 16, hbm.granularity)
    kv_written = model.layers * model.kv_heads * 2 * model.head_dim * 2
    assert report.bytes_read["hbm"] == weights + kv_read
    assert report.bytes_written["hbm"] == kv_written
    moved = weights + kv_read + kv_written
    lower = moved / hbm.bandwidth
    assert lower <= report.time_per_token <= 1.5 * lower
    assert report.bottleneck == "hbm"


def test_memory_wall_70b_fp16_is_about_42_ms_on_an_h100_with_room():
    big = memsim.device("h100-sxm").with_overrides({"tiers.hbm.capacity": "200 GB"})
    report = memsim.emulate(big, "llama-3-70b", batch=1, context=1024, weights="fp16")
    weight_bytes = memsim.model("llama-3-70b").total_params * 2
    assert weight_bytes / 3.35e12 == pytest.approx(0.0421, abs=0.0002)
    assert report.time_per_token >= weight_bytes / 3.35e12
    assert report.time_per_token <= 1.5 * weight_bytes / 3.35e12


def test_stock_h100_refuses_70b_bf16_with_the_shortfall():
    with pytest.raises(memsim.CapacityError) as info:
        memsim.emulate("h100-sxm", "llama-3-70b", batch=1, context=1024)
    plan_bytes = memsim.make_plan(
        memsim.device("h100-sxm").with_overrides({"tiers.hbm.capacity": "1 TB"}),
        memsim.model("llama-3-70b"), memsim.Decode(batch=1, context=1024)).bytes_by_tier
    need = plan_bytes("weight")["hbm"] + plan_bytes("kv")["hbm"]
    assert info.value.shortfall_bytes == need - 80_000_000_000
    assert f"{need - 80_000_000_000:,}" in str(info.value)
    assert info.value.field == "tiers.hbm.capacity"


def test_kv_cache_is_sized_by_kv_heads_not_query_heads():
    model = memsim.model("llama-3-8b")
    plan = memsim.make_plan(memsim.device("h100-sxm"), model,
                            memsim.Decode(batch=2, context=1000))
    kv = plan.bytes_by_tier("kv")["hbm"]
    tokens = 1000 + 2 * 1
    blocks = -(-tokens // 16)
    assert kv == model.layers * 2 * model.kv_heads * 2 * blocks * 16 * model.head_dim * 2
    assert kv * (model.heads // model.kv_heads) != kv


def test_embedding_reads_one_row_per_token_and_lm_head_every_step():
    model = memsim.model("llama-3-8b")
    report = memsim.emulate("h100-sxm", model, batch=4, context=64, steps=3)
    rows = {row.name: row for row in report.ops if row.layer < 0}
    assert rows["embed"].bytes_read["hbm"] == 4 * model.hidden * 2
    assert rows["lm_head"].bytes_read["hbm"] == bytes_for((model.vocab, model.hidden), "bf16")


@pytest.mark.parametrize("fmt", ["bf16", "int8", "int4-g128", "nvfp4", "q4_0", "fp8-e4m3"])
def test_with_no_reuse_each_matmul_reads_exactly_its_storage(fmt):
    model = memsim.model("llama-3.2-1b")
    dev = memsim.device("h100-sxm").with_overrides({"tiers.sram.capacity": "1 KiB"})
    report = memsim.emulate(dev, model, batch=1, context=100, weights=fmt)
    shapes = {"qkv": ((model.heads + 2 * model.kv_heads) * model.head_dim, model.hidden),
              "o_proj": (model.hidden, model.heads * model.head_dim),
              "gate": (model.ffn, model.hidden), "up": (model.ffn, model.hidden),
              "down": (model.hidden, model.ffn), "lm_head": (model.vocab, model.hidden)}
    formats = weight_formats(fmt)
    for row in report.ops:
        if row.name in shapes:
            stored = formats.for_tensor(row.name, max(row.layer, 0), model.layers,
                                        tied=model.tied_embeddings, k=shapes[row.name][1])
            assert row.bytes_read["hbm"] == bytes_for(shapes[row.name], stored), row


@pytest.mark.parametrize("kv", ["bf16", "fp8-e4m3", "int8", "int4-g64"])
def test_kv_bytes_read_and_written_closed_form(kv):
    model = memsim.model("llama-3.2-1b")
    dev = memsim.device("h100-sxm").with_overrides({"tiers.sram.capacity": "1 KiB"})
    report = memsim.emulate(dev, model, batch=3, context=777, kv=kv, kv_block=32, steps=2)
    gran = dev.tier("hbm").granularity
    attention = sum(r.bytes_read["hbm"] for r in report.ops if r.name == "attention")
    assert attention == _kv_read_bytes(model, kv, 3, 777 + 2, 32, gran)
    row_bits = memsim.get_format(kv).tensor_bits((1, model.head_dim)) \
        - memsim.get_format(kv).tensor_meta_bits
    appended = sum(r.bytes_written["hbm"] for r in report.ops if r.name == "kv_append")
    assert appended == model.layers * 3 * model.kv_heads * 2 * (
        -(-(-(-row_bits // 8)) // gran) * gran)


def test_a_model_whose_weights_fit_on_chip_streams_them_once():
    dev = memsim.device("h100-sxm").with_overrides({"tiers.sram.capacity": "4 GB"})
    report = memsim.emulate(dev, "llama-3.2-1b", batch=1, context=64, weights="int4-g128",
                            steps=3, residency="lru")
    cold, warm = report.cold, report.warm
    assert cold.bytes_read["hbm"] > 0.6e9
    # warm: only the new token's embedding row (a new token id) and nothing else of the weights
    assert warm.bytes_read["hbm"] < 1e6
    assert warm.time_s < cold.time_s


def test_pinned_policy_reads_no_weights_off_chip_after_the_first_step():
    dev = memsim.device("mtia-v2").with_overrides({"tiers.sram.capacity": "2 GB"})
    report = memsim.emulate(dev, "llama-3.2-1b", batch=1, context=512, weights="int8", steps=2,
                            residency="pinned")
    weights_off_chip = sum(r.bytes_read["lpddr"] for r in report.ops
                           if r.name not in ("attention",))
    assert weights_off_chip == 0
    cold_rows = report.op_rows("cold")
    assert sum(r.bytes_read["lpddr"] for r in cold_rows if r.name == "gate") > 0


def test_sram_resident_device_reads_nothing_off_chip():
    report = memsim.emulate("wse-3", "llama-3-8b", batch=1, context=2048)
    assert all(v == 0 for t, v in report.bytes_read.items() if t != "sram")
    assert report.hits > 0 and report.misses == 0


def test_same_inputs_same_counts():
    a = memsim.emulate("h100-sxm", "llama-3.2-1b", batch=5, context=300, seed=3, steps=3)
    b = memsim.emulate("h100-sxm", "llama-3.2-1b", batch=5, context=300, seed=3, steps=3)
    assert a.to_dict() == b.to_dict()


def test_report_outputs_agree():
    report = memsim.emulate("h100-sxm", "llama-3.2-1b", batch=2, context=100)
    data = report.to_dict()
    assert data["bytes_read"]["hbm"] == report.bytes_read["hbm"]
    rows = list(csv.DictReader(io.StringIO(report.to_csv())))
    assert len(rows) == len(report.ops)
    assert sum(int(row["bytes_read_hbm"]) for row in rows) == report.bytes_read["hbm"]
    assert "time per token" in report.table()
    assert math.isclose(report.cycles, report.time_per_token * 1.83e9, rel_tol=1e-12)
    assert report.tokens_per_s_total == pytest.approx(2 * report.tokens_per_s)
