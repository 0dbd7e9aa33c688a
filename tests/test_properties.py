"""Invariants of the decode-step emulation: conservation, lower bounds, closed forms,
monotonicity, scaling, determinism; drawn with memsim's own public strategies and checked with
its public checkers (memsim.testing)."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

import memsim
from memsim.testing import (assert_matches_closed_form, assert_no_more_traffic_when,
                            assert_not_slower_when, assert_report_invariants,
                            assert_same_traffic, examples, no_reuse)
from memsim.testing import strategies as ms

CATALOG = st.sampled_from(["h100-sxm", "mi300x", "tpu-v5e", "gaudi-3", "mtia-v2"])
# the catalog's streaming devices, their figures perturbed up to 2x either way
devices = ms.devices(base=CATALOG)
# small shapes, ragged against every tile; dense and mixture-of-experts
models = ms.models(layers=st.integers(1, 3), hidden=st.integers(1, 384),
                   ffn=st.integers(1, 768), head_dim=st.integers(1, 64),
                   vocab=st.integers(1, 3000), experts=st.just(1) | st.integers(2, 6))
dense_models = ms.models(layers=st.integers(1, 3), hidden=st.integers(1, 384),
                         ffn=st.integers(1, 768), head_dim=st.integers(1, 64),
                         vocab=st.integers(1, 3000), experts=1)
workloads = ms.decodes(batch=st.integers(1, 6), context=st.integers(0, 600),
                       tile_k=st.none() | st.integers(8, 160),
                       tile_n=st.none() | st.integers(8, 160))
lru_workloads = ms.decodes(batch=st.integers(1, 6), context=st.integers(0, 600), residency="lru")


def _off_chip_read(report: memsim.Report) -> int:
    return sum(v for t, v in report.bytes_read.items() if t != report.tier_names[0])


@settings(max_examples=examples(40))
@given(devices, models, workloads)
def test_every_report_conserves_bytes_and_respects_its_lower_bounds(dev, model, workload):
    """What the compute reads on chip is its hits plus what came from further out, every fill is
    a read from further out, and no step beats its bytes over bandwidth or its FLOPs over peak."""
    assert_report_invariants(memsim.emulate(dev, model, workload), dev)


@settings(max_examples=examples(25))
@given(devices, ms.models(layers=st.integers(1, 3), hidden=st.integers(1, 256),
                          kv_heads=st.sampled_from([2, 4]), head_dim=st.integers(1, 64),
                          ffn=st.integers(1, 256).map(lambda n: 2 * n), experts=1),
       ms.decodes(batch=st.integers(1, 4), context=st.integers(0, 300),
                  tp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2])))
def test_tensor_and_pipeline_parallel_reports_keep_the_invariants(dev, model, workload):
    """Per chip of each stage, and over the system with the other chips' embedding rows."""
    assert_report_invariants(memsim.emulate(dev, model, workload), dev)


@settings(max_examples=examples(25))
@given(devices, ms.models(layers=st.integers(1, 3), hidden=st.integers(1, 256),
                          ffn=st.integers(1, 256), experts=st.sampled_from([2, 4, 6])),
       ms.decodes(batch=st.sampled_from([2, 4, 6]), context=st.integers(0, 300), ep=2,
                  routing=st.sampled_from(["uniform", "zipf:1.2", "zipf:2"])))
def test_expert_parallel_reports_keep_the_invariants(dev, model, workload):
    """Chips side by side, each layer waiting for the slowest."""
    assert_report_invariants(memsim.emulate(dev, model, workload), dev)


@settings(max_examples=examples(40))
@given(devices, dense_models, ms.decodes(batch=st.integers(1, 6), context=st.integers(0, 600),
                                         tile_k=st.none() | st.integers(8, 160),
                                         tile_n=st.none() | st.integers(8, 160),
                                         pp=st.sampled_from([1, 1, 2])))
def test_with_no_reuse_every_op_reads_its_closed_form(dev, model, workload):
    """Every weight's storage, one embedding row per token and the KV blocks, to the byte."""
    dev = no_reuse(dev)
    assert_matches_closed_form(memsim.emulate(dev, model, workload), dev, model, workload)


@settings(max_examples=examples(25))
@given(devices, ms.models(layers=1, experts=1), workloads)
def test_traffic_is_linear_in_layers(dev, model, workload):
    dev = no_reuse(dev)
    totals = []
    for layers in (1, 2, 3):
        report = memsim.emulate(dev, dataclasses.replace(model, layers=layers), workload)
        totals.append(_off_chip_read(report) + sum(report.bytes_written.values()))
    assert totals[2] - totals[1] == totals[1] - totals[0] > 0


@settings(max_examples=examples(25))
@given(devices, ms.models(layers=st.integers(1, 3), hidden=st.integers(16, 384),
                          ffn=st.integers(16, 768), head_dim=st.integers(16, 64),
                          vocab=st.integers(1, 3000), experts=1), st.integers(1, 5))
def test_fewer_bits_per_weight_move_fewer_bytes(dev, model, batch):
    """Once rows are long enough to amortise their scales (at one element, an int4 group's
    20 bits of metadata make it as big as int8's row)."""
    dev = no_reuse(dev)
    moved = [_off_chip_read(memsim.emulate(dev, model, batch=batch, context=64, weights=fmt))
             for fmt in ("int4-g128", "int8", "bf16")]
    assert moved[0] < moved[1] < moved[2]


@settings(max_examples=examples(25))
@given(devices, models, workloads, st.floats(1.01, 8.0), st.data())
def test_time_never_rises_when_a_bandwidth_rises(dev, model, workload, factor, data):
    tier = data.draw(st.sampled_from(dev.tiers))
    before, after = assert_not_slower_when(
        {f"tiers.{tier.name}.bandwidth": f"{tier.bandwidth * factor!r} B/s"},
        device=dev, model=model, workload=workload)
    assert after.bytes_read == before.bytes_read


@settings(max_examples=examples(25))
@given(devices, models, lru_workloads, st.integers(0, 30), st.integers(0, 30))
def test_a_bigger_on_chip_tier_never_adds_off_chip_traffic(dev, model, workload, a, b):
    on_chip = dev.tiers[0]
    small, big = sorted(on_chip.granularity + 2**16 * n for n in (a, b))
    assert_no_more_traffic_when({f"tiers.{on_chip.name}.capacity": f"{big} B"},
                                device=dev.with_overrides(
                                    {f"tiers.{on_chip.name}.capacity": f"{small} B"}),
                                model=model, workload=workload)


@settings(max_examples=examples(25))
@given(devices, dense_models, workloads)
def test_kv_traffic_scales_with_batch_and_weights_do_not(dev, model, workload):
    dev = no_reuse(dev)
    one = memsim.emulate(dev, model, dataclasses.replace(workload, batch=1))
    three = memsim.emulate(dev, model, dataclasses.replace(workload, batch=3))
    home = dev.layout.kv

    def attention(report):
        return sum(r.bytes_read[home] for r in report.ops if r.name == "attention")

    def matmuls(report):
        return sum(r.bytes_read[dev.layout.weights] for r in report.ops
                   if r.name in ("qkv", "o_proj", "gate", "up", "down", "lm_head"))

    assert attention(three) == 3 * attention(one)
    assert three.bytes_written[home] == 3 * one.bytes_written[home]
    assert matmuls(three) == matmuls(one)


@settings(max_examples=examples(25))
@given(models, workloads, st.integers(100, 4000))
def test_more_context_reads_more_kv(model, workload, extra):
    dev = no_reuse(memsim.device("h100-sxm"))
    short = memsim.emulate(dev, model, workload)
    long = memsim.emulate(dev, model, dataclasses.replace(workload,
                                                          context=workload.context + extra))
    assert long.bytes_read["hbm"] > short.bytes_read["hbm"]
    assert long.time_per_token >= short.time_per_token


@settings(max_examples=examples(25))
@given(devices, models, workloads)
def test_same_seed_same_counts_bit_for_bit(dev, model, workload):
    first = memsim.emulate(dev, model, workload)
    again = memsim.emulate(dev, model, workload)
    assert_same_traffic(first, again)
    assert first.to_dict() == again.to_dict()
