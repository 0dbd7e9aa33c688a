"""A runtime's GEMM kernel tile (``[gemm.FORMAT]``, memsim.gemmtile): M padded to the CTA tile's
rows, no split-K, a fused gate/up GEMM's halves sharing one grid; against closed forms and the
twin, and bad input."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
from hypothesis import given, settings

import memsim
from memsim.errors import ConfigError
from memsim.gemmtile import parse_gemm_tiles
from memsim.kernels import step as walker
from memsim.plan import plan_system
from memsim.runtime import parse_runtime, runtime
from memsim.testing import examples
from tests.test_walker_twin import check_run_against_twin, small_runs

ENGINE = "trt-llm-engine-0.16-0.17"
WORKLOAD = dict(batch=1, context=3072, weights="fp8-e4m3", kv="bf16", tp=4)


def _ops(rt) -> dict:
    rep = memsim.emulate(memsim.device("h100-sxm"), "llama-3-70b",
                         memsim.Decode(runtime=rt, **WORKLOAD))
    return {(op.layer, op.name): op for op in rep.ops}


def test_fp8_gemm_without_split_k_takes_one_cta_per_tile_of_128_padded_rows():
    """At M = 1 the TP-4 QKV projection of Llama 3 70B (K 8,192, N 2,560) runs N / 128 = 20
    units of its whole K, each 2 x 128 x 128 x K operations at one SM's share of the FP8 rate:
    that, plus the op's launch and one wave's HBM latency, is its time."""
    dev = memsim.device("h100-sxm")
    qkv = _ops(ENGINE)[(0, "qkv")]
    unit_s = 2 * 128 * 128 * 8192 / (dev.matmul_rate("fp8") / dev.cores)
    assert qkv.waves == math.ceil(2560 / 128 / dev.cores) == 1
    assert qkv.time_s == pytest.approx(unit_s + dev.op_launch_s + dev.tier("hbm").latency_s,
                                          rel=1e-12)


def test_fused_gate_up_halves_share_one_grid():
    """gate and up (N 7,168 each at TP 4) are one fused GEMM of 112 CTAs on 132 SMs: one wave
    that takes the longer of both halves' bytes at the sustained HBM rate and one unit's
    compute; memsim charges each half its share (one launch, on gate)."""
    dev = memsim.device("h100-sxm")
    ops = _ops(ENGINE)
    gate, up = ops[(0, "gate")], ops[(0, "up")]
    hbm = dev.tier("hbm")
    both_bytes = gate.bytes_read["hbm"] + up.bytes_read["hbm"]
    unit_s = 2 * 128 * 128 * 8192 / (dev.matmul_rate("fp8") / dev.cores)
    wave_s = max(both_bytes / hbm.sustained_bandwidth, unit_s)
    assert gate.time_s + up.time_s == pytest.approx(
        wave_s + hbm.latency_s + dev.op_launch_s, rel=1e-12)


def test_the_tile_changes_time_not_bytes():
    """The same step on trt-llm (no [gemm] table) and on the engine runtime reads and writes
    the same bytes per op; only the FP8 GEMMs' times differ."""
    plain = dataclasses.replace(runtime(ENGINE), gemm=())
    a, b = _ops(ENGINE), _ops(plain)
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].bytes_read == b[key].bytes_read, key
        assert a[key].bytes_written == b[key].bytes_written, key
    assert a[(0, "qkv")].time_s > b[(0, "qkv")].time_s


def test_plan_sets_grain_tile_and_split_from_the_runtime():
    system = plan_system(memsim.device("h100-sxm"), memsim.model("llama-3-8b"),
                         memsim.Decode(runtime=ENGINE, weights="fp8-e4m3"))
    plan = system.stages[0]
    kinds = plan.op_int[:, walker.C_KIND]
    fp8 = [op for op in range(plan.n_ops)
           if kinds[op] == walker.OP_MATMUL and plan.op_formats[op] == "fp8-e4m3"]
    other = [op for op in range(plan.n_ops)
             if kinds[op] == walker.OP_MATMUL and plan.op_formats[op] != "fp8-e4m3"]
    rows = plan.op_int[fp8]
    assert (rows[:, walker.C_M_GRAIN] == 128).all() and (rows[:, walker.C_TILE_M] == 128).all()
    assert (rows[:, walker.C_SPLIT_K] == 0).all() and (rows[:, walker.C_GEMV] == 0).all()
    shares = {plan.op_names[op]: plan.op_int[op, walker.C_GRID_SHARE] for op in fp8}
    assert shares == {"qkv": 1, "o_proj": 1, "gate": 2, "up": 2, "down": 1}
    for op in other:            # another format keeps the device's grain and split-K
        assert plan.op_int[op, walker.C_M_GRAIN] == 64 and plan.op_int[op, walker.C_SPLIT_K] == 1


@settings(max_examples=examples(40))
@given(small_runs())
def test_kernel_equals_twin_with_the_engine_gemm_tile(run):
    device, model, workload = run
    check_run_against_twin(device, model, dataclasses.replace(workload, runtime=runtime(ENGINE)))


@pytest.mark.parametrize("table, field", [
    ({"fp9": {"rows": 128, "split_k": False}}, "gemm.fp9"),
    ({"fp8-e4m3": {"rows": 0, "split_k": False}}, "gemm.fp8-e4m3.rows"),
    ({"fp8-e4m3": {"rows": 128, "split_k": "no"}}, "gemm.fp8-e4m3.split_k"),
    ({"fp8-e4m3": {"rows": 128}}, "gemm.fp8-e4m3.split_k"),
    ({"fp8-e4m3": {"rows": 128, "split_k": False, "cols": 4}}, "gemm.fp8-e4m3"),
    ({"fp8-e4m3": 128}, "gemm.fp8-e4m3"),
])
def test_bad_gemm_table_is_one_config_error_naming_the_field(table, field):
    data = copy.deepcopy(runtime("trt-llm").data)
    data["gemm"] = table
    with pytest.raises(ConfigError) as err:
        parse_runtime(data, file="my-stack.toml")
    assert "my-stack.toml" in str(err.value) and field in str(err.value)


AITER = "vllm-rocm-aiter"


def test_ctas_without_split_k_stream_no_faster_than_their_bytes_in_flight_allow():
    """Llama 3 70B's TP-8 QKV shard (N 1,280, K 8,192) on AITER's a8w8 kernel at M = 1: 1,280 / 64
    = 20 workgroups of 256 threads keep 128 B each in flight, 655,360 B on the chip, so by
    Little's law its HBM bytes take bytes x latency / 655,360 B (far above bytes over the
    sustained rate), plus one wave's HBM latency, the kernel's fixed time and the op's launch."""
    dev = memsim.device("mi300x")
    rep = memsim.emulate(dev, "llama-3-70b", batch=1, context=128, tp=8, weights="int8",
                         activations="int8", runtime=AITER)
    qkv = next(op for op in rep.ops if op.layer == 0 and op.name == "qkv")
    hbm = dev.tier("hbm")
    in_flight = min(math.ceil(1280 / 64), dev.cores * min(16, 2048 // 256)) * 256 * 128.0
    assert in_flight == 655_360
    stream_s = qkv.bytes_read["hbm"] * hbm.latency_s / in_flight
    assert stream_s > 3 * qkv.bytes_read["hbm"] / hbm.sustained_bandwidth
    assert qkv.waves == 1
    assert qkv.time_s == pytest.approx(stream_s + hbm.latency_s + dev.kernel_fixed_s
                                       + dev.op_launch_s, rel=1e-12)


def test_enough_ctas_leave_the_stream_at_the_sustained_rate():
    """The TP-1 gate shard (N 28,672) has 448 workgroups, 14.7 MB in flight: Little's law
    allows more than the HBM, which bounds it as without the table."""
    runs = {rt: memsim.emulate("mi300x", "llama-3-70b", batch=1, context=128, weights="int8",
                               activations="int8", runtime=rt) for rt in (AITER, "vllm")}
    gate = {rt: next(op for op in rep.ops if op.layer == 0 and op.name == "gate")
            for rt, rep in runs.items()}
    assert gate[AITER].bytes_read == gate["vllm"].bytes_read
    hbm = memsim.device("mi300x").tier("hbm")
    assert gate[AITER].time_s >= gate[AITER].bytes_read["hbm"] / hbm.sustained_bandwidth


def test_in_flight_needs_a_kernel_that_does_not_split_k():
    table = {"int8": {"rows": 16, "split_k": True, "in_flight": {
        "threads_per_block": 256, "rows_per_block": 64, "bytes_per_thread": 128.0,
        "max_rows": 16}}}
    with pytest.raises(ConfigError, match="split_k = false") as err:
        parse_gemm_tiles(table, file="my.toml")
    assert "gemm.int8.in_flight" in str(err.value)


@settings(max_examples=examples(30))
@given(small_runs())
def test_kernel_equals_twin_with_ctas_in_flight(run):
    """The twin follows the in-flight bound (h100-sxm of these runs has [occupancy])."""
    device, model, workload = run
    check_run_against_twin(device, model, dataclasses.replace(
        workload, runtime=runtime(AITER), weights="int8", activations="int8"))
