"""Invariants of the decode-step emulation: conservation, monotonicity, scaling, determinism."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memsim

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def no_reuse(name: str) -> memsim.Device:
    """The device with an on-chip tier no bigger than one access: nothing is ever reused."""
    dev = memsim.device(name)
    on_chip = dev.tiers[0]
    return dev.with_overrides({f"tiers.{on_chip.name}.capacity": f"{on_chip.granularity} B"})


@st.composite
def models(draw, layers=None):
    kv_heads = draw(st.integers(1, 4))
    return memsim.Model(
        name="m", display_name="m", layers=layers or draw(st.integers(1, 3)),
        hidden=draw(st.integers(2, 24)) * 16, heads=kv_heads * draw(st.integers(1, 4)),
        kv_heads=kv_heads, head_dim=draw(st.sampled_from([16, 32, 64])),
        ffn=draw(st.integers(2, 48)) * 16, vocab=draw(st.integers(100, 3000)),
        tied_embeddings=draw(st.booleans()))


workloads = st.builds(
    memsim.Decode, batch=st.integers(1, 6), context=st.integers(0, 600),
    weights=st.sampled_from(["bf16", "int8", "int4-g128", "nvfp4", "q8_0"]),
    kv=st.sampled_from(["bf16", "fp8-e4m3", "int8"]), steps=st.integers(1, 3),
    kv_block=st.sampled_from([8, 16, 32]), residency=st.just("lru"), seed=st.integers(0, 5))

devices = st.sampled_from(["h100-sxm", "mi300x", "tpu-v5e", "gaudi-3", "mtia-v2"])


def _off_chip_read(report: memsim.Report) -> int:
    return sum(v for t, v in report.bytes_read.items() if t != report.tier_names[0])


@SETTINGS
@given(models(), workloads, devices)
def test_conservation_across_tiers(model, workload, name):
    """What the compute reads on chip is its hits plus what came from further out; fills equal
    the bytes read from further out."""
    report = memsim.emulate(name, model, workload)
    on_chip = report.tier_names[0]
    for summary in report.steps:
        from_outside = sum(v for t, v in summary.bytes_read.items() if t != on_chip)
        assert summary.bytes_written[on_chip] == from_outside
        # each op's bits round up to whole bytes once for its total, once for each part
        n_ops = len(report.op_names)
        assert (summary.hit_bytes + from_outside - n_ops <= summary.bytes_read[on_chip]
                <= summary.hit_bytes + from_outside)
    warm_rows = report.op_rows("warm")
    assert sum(r.bytes_read[on_chip] for r in warm_rows) == report.warm.bytes_read[on_chip]


@SETTINGS
@given(models(layers=1), workloads, devices)
def test_traffic_is_linear_in_layers(model, workload, name):
    dev = no_reuse(name)
    totals = []
    for layers in (1, 2, 3):
        report = memsim.emulate(dev, dataclasses.replace(model, layers=layers), workload)
        totals.append(_off_chip_read(report) + sum(report.bytes_written.values()))
    assert totals[2] - totals[1] == totals[1] - totals[0] > 0


@SETTINGS
@given(models(), st.integers(1, 5), devices)
def test_fewer_bits_per_weight_move_fewer_bytes(model, batch, name):
    dev = no_reuse(name)
    moved = [_off_chip_read(memsim.emulate(dev, model, batch=batch, context=64, weights=fmt))
             for fmt in ("int4-g128", "int8", "bf16")]
    assert moved[0] < moved[1] < moved[2]


@SETTINGS
@given(models(), workloads, devices, st.floats(1.01, 8.0))
def test_time_never_rises_when_a_bandwidth_rises(model, workload, name, factor):
    dev = memsim.device(name)
    base = memsim.emulate(dev, model, workload)
    for tier in dev.tiers:
        faster = dev.with_overrides({f"tiers.{tier.name}.bandwidth": f"{tier.bandwidth * factor!r} B/s"})
        report = memsim.emulate(faster, model, workload)
        assert report.time_per_token <= base.time_per_token * (1 + 1e-12)
        assert report.bytes_read == base.bytes_read


@SETTINGS
@given(models(), workloads, devices, st.integers(0, 30), st.integers(0, 30))
def test_a_bigger_on_chip_tier_never_adds_off_chip_traffic(model, workload, name, a, b):
    dev = memsim.device(name)
    on_chip = dev.tiers[0].name
    # from one access up (TPU v5e's is 4 KiB)
    small, big = sorted(dev.tiers[0].granularity + 2**16 * n for n in (a, b))
    reports = [memsim.emulate(dev.with_overrides({f"tiers.{on_chip}.capacity": f"{size} B"}),
                              model, workload) for size in (small, big)]
    for small, big in zip(reports[0].steps, reports[1].steps):
        assert (sum(v for t, v in big.bytes_read.items() if t != on_chip)
                <= sum(v for t, v in small.bytes_read.items() if t != on_chip))


@SETTINGS
@given(models(), workloads, devices)
def test_kv_traffic_scales_with_batch_and_weights_do_not(model, workload, name):
    dev = no_reuse(name)
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


@SETTINGS
@given(models(), workloads, st.integers(100, 4000))
def test_more_context_reads_more_kv(model, workload, extra):
    dev = no_reuse("h100-sxm")
    short = memsim.emulate(dev, model, workload)
    long = memsim.emulate(dev, model, dataclasses.replace(workload,
                                                          context=workload.context + extra))
    assert long.bytes_read["hbm"] > short.bytes_read["hbm"]
    assert long.time_per_token >= short.time_per_token


@SETTINGS
@given(models(), workloads, devices)
def test_same_seed_same_counts_bit_for_bit(model, workload, name):
    a = memsim.emulate(name, model, workload).to_dict()
    b = memsim.emulate(name, model, workload).to_dict()
    assert a == b
