"""The GEMV in-flight bound (memory-level parallelism, Little's law).

Closed forms: a kernel's bytes in flight per core are its resident blocks (the fewer of the
block and thread limits of the device's ``[occupancy]``) times threads per block times bytes per
thread; a GEMV of ``n`` rows keeps min(ceil(n / rows per block), cores x blocks per core) blocks
in flight; a latency-bound GEMV's time is bytes x latency / bytes in flight; the kernel and the
twin agree; bad ``in_flight`` and ``[occupancy]`` tables are one ConfigError naming file and
field.
"""

from __future__ import annotations

import numpy as np
import pytest

import memsim
from memsim.device import parse_device
from memsim.emulate import NO_ROUTES, Residency, run_step
from memsim.errors import ConfigError
from memsim.formats import get_format
from memsim.instructions import (MAX_PIPES, MLP_COLUMNS, Occupancy, mlp_columns,
                                 parse_mixes)
from memsim.kernels import step as k
from memsim.plan import make_plan
from memsim.precision import matmul_path
from memsim.runtime import parse_runtime, runtime
from tests.test_dequant_time import assert_bad_device_table
from tests.test_walk_fast import check_against_twin

A100 = "validation/devices/a100-sxm4-80gb.toml"


def _mix(threads: int, rows: int, nbytes: float, max_rows: int = 1):
    spec = {"per_weight": {}, "per_weight_row": {"load": 1},
            "in_flight": {"threads_per_block": threads, "rows_per_block": rows,
                          "bytes_per_thread": nbytes, "max_rows": max_rows}}
    return dict(parse_mixes({"fp16": spec}, file="rt.toml"))["fp16"]


def test_columns_are_block_bytes_and_the_fewer_of_the_two_limits():
    assert k.N_MLP_COLS == MLP_COLUMNS and k.N_FLOAT_COLS == k.F_MLP + MLP_COLUMNS
    # 32-thread blocks: the block limit binds (32 x 32 = 1024 of 2048 threads)
    assert mlp_columns(Occupancy(2048, 32), _mix(32, 1, 4.0)) == (128.0, 32.0, 1.0, 1.0)
    # 128-thread blocks: the thread limit binds (1536 / 128 = 12 of 24 blocks)
    assert mlp_columns(Occupancy(1536, 24), _mix(128, 2, 9.0, 8)) == (1152.0, 12.0, 2.0, 8.0)
    assert mlp_columns(None, _mix(32, 1, 4.0)) == (0.0,) * MLP_COLUMNS


def test_guide_limits_per_compute_capability():
    for name, threads, blocks in ((A100, 2048, 32), ("validation/devices/rtx-4090.toml", 1536, 24),
                                  ("validation/devices/l40s.toml", 1536, 24),
                                  ("h100-sxm", 2048, 32), ("h200", 2048, 32),
                                  ("b200", 2048, 32), ("gb200", 2048, 32)):
        occupancy = memsim.device(name).occupancy
        assert (occupancy.threads_per_core, occupancy.blocks_per_core) == (threads, blocks)


def test_llama_cpp_fp16_dmmv_keeps_4_kib_per_sm_on_the_a100():
    a100 = memsim.device(A100)
    path = matmul_path(a100, get_format("fp16"), get_format("fp16"), runtime("llama.cpp-cuda"))
    block_bytes, blocks, rows_per_block, max_rows = path.gemv_s_per_weight[2 * MAX_PIPES:]
    assert block_bytes * blocks == 32 * 32 * 4                   # 32 blocks x 32 threads x 4 B
    assert (rows_per_block, max_rows) == (1.0, 1.0)
    # without an [occupancy] table there is no bound
    bare = dict(a100.data)
    del bare["occupancy"]
    bare_path = matmul_path(parse_device(bare, file="a.toml"), get_format("fp16"),
                            get_format("fp16"), runtime("llama.cpp-cuda"))
    assert not any(bare_path.gemv_s_per_weight[2 * MAX_PIPES:])


def test_trtllm_cuda_core_fp8_block_shape_would_not_bind_on_the_h100():
    """runtimes/trt-llm.toml keeps FP8 off the GEMV path on sm90; its [sources] say TensorRT-LLM's
    CUDA-core FP8 kernel (cudaCoreGemm.cu: 128 threads, 2 output columns per block, 2 x 16 B per
    thread and iteration, M <= 4) would not bind there anyway: 132 SMs x 16 blocks x 4 KiB over
    the 500 ns DRAM latency is 17.3 TB/s, above the 2.8 TB/s sustained stream."""
    assert runtime("trt-llm").gemv == ()
    h100 = memsim.device("h100-sxm")
    columns = mlp_columns(h100.occupancy, _mix(128, 2, 32.0, 4))
    assert columns == (4096.0, 16.0, 2.0, 4.0)
    hbm = h100.tiers[1]
    bound = h100.cores * columns[1] * columns[0] / hbm.latency_s
    assert bound == pytest.approx(132 * 16 * 4096 / 500e-9)
    assert bound > 5 * hbm.sustained_bandwidth


def test_close_wave_takes_bytes_times_latency_over_bytes_in_flight():
    bandwidth = np.array([1e15, 2e12])
    latency = np.array([1e-7, 5e-7])
    times = np.zeros((1, 6))
    bits = np.array([0, 8 * 10**9], dtype=np.int64)
    k._close_wave(0, bits, 0.0, bandwidth, latency, times, 4096.0 * 108, 1)
    assert times[0, 1] == pytest.approx(1e9 * 5e-7 / (4096.0 * 108))
    times[:] = 0.0
    bits = np.array([0, 8 * 10**9], dtype=np.int64)
    k._close_wave(0, bits, 0.0, bandwidth, latency, times, 1e9, 1)   # ample: bandwidth binds
    assert times[0, 1] == pytest.approx(1e9 / 2e12)


def test_in_flight_blocks_are_the_rows_up_to_the_resident_limit():
    mlp = np.array([128.0, 32.0, 1.0, 1.0])
    assert k._in_flight_bytes(mlp, 1, 1024, 108, True) == 1024 * 128.0     # fewer rows
    assert k._in_flight_bytes(mlp, 1, 14336, 108, True) == 108 * 32 * 128.0
    assert k._in_flight_bytes(mlp, 2, 14336, 108, True) == 0.0             # above max_rows
    assert k._in_flight_bytes(mlp, 1, 14336, 108, False) == 0.0            # not the GEMV
    assert k._in_flight_bytes(np.zeros(4), 1, 14336, 108, True) == 0.0


def _latency_bound(cores: int):
    """A device on which only the in-flight bound can bind: bandwidth and compute ample."""
    base = memsim.device(A100)
    fast = {"cores": cores, "tiers.hbm.bandwidth": "1e6 TB/s",
            "tiers.hbm.sustained_bandwidth": "1e6 TB/s", "tiers.sram.bandwidth": "1e6 TB/s"}
    return base.with_overrides(fast)


def _one_layer_step(device, batch: int):
    """The plan and first step's counts of a one-layer F16 model under llama.cpp's kernels."""
    model = memsim.Model(name="tiny", display_name="tiny", layers=1, hidden=256, heads=4,
                         kv_heads=4, head_dim=64, ffn=512, vocab=256, tied_embeddings=False)
    workload = memsim.Decode(batch=batch, context=8, weights="fp16", kv="fp16",
                             runtime="llama.cpp-cuda", tile_k=256, tile_n=32)
    plan = make_plan(device, model, workload)
    return plan, run_step(plan, Residency(plan), 0, NO_ROUTES)


def test_latency_bound_gemv_time_is_bytes_times_latency_over_the_chips_bytes_in_flight():
    cores = 4
    device = _latency_bound(cores)
    latency_s = device.tier("hbm").latency_s
    plan, counts = _one_layer_step(device, batch=1)
    hbm = plan.tier_names.index("hbm")
    matmuls = np.flatnonzero(plan.op_int[:, k.C_KIND] == k.OP_MATMUL)
    assert len(matmuls)
    for op in matmuls:
        n = int(plan.op_int[op, k.C_N])
        in_flight = min(n, cores * 32) * 32 * 4                  # blocks x threads x 4 B
        weight_bytes = counts.read_bits[op, hbm] / 8
        assert counts.times[op, hbm] == pytest.approx(weight_bytes * latency_s / in_flight,
                                                      rel=1e-9)


def test_batched_rows_are_not_bound():
    device = _latency_bound(4)
    plan, counts = _one_layer_step(device, batch=2)
    hbm = plan.tier_names.index("hbm")
    bandwidth = device.tier("hbm").sustained_bandwidth
    for op in np.flatnonzero(plan.op_int[:, k.C_KIND] == k.OP_MATMUL):    # bytes / bandwidth
        assert counts.times[op, hbm] == pytest.approx(counts.read_bits[op, hbm] / 8 / bandwidth,
                                                      rel=1e-9)


def test_kernel_equals_twin_with_an_in_flight_bound():
    device = memsim.device(A100).with_overrides({"cores": 3})
    model = memsim.Model(name="tiny", display_name="tiny", layers=2, hidden=64, heads=2,
                         kv_heads=1, head_dim=32, ffn=96, vocab=100, tied_embeddings=False)
    for weights in ("fp16", "q4_0"):
        workload = memsim.Decode(batch=1, context=5, weights=weights, kv="fp16",
                                 runtime="llama.cpp-cuda", tile_k=32, tile_n=16, steps=2)
        plan = make_plan(device, model, workload)
        assert plan.op_float[:, k.F_MLP:].any()
        check_against_twin(plan, steps=2)


@pytest.mark.parametrize("in_flight, field", [
    ({"threads_per_block": 32, "rows_per_block": 1, "bytes_per_thread": 4.0},
     "gemv.fp16.in_flight"),
    ({"threads_per_block": 0, "rows_per_block": 1, "bytes_per_thread": 4.0, "max_rows": 1},
     "gemv.fp16.in_flight.threads_per_block"),
    ({"threads_per_block": 32, "rows_per_block": 1.5, "bytes_per_thread": 4.0, "max_rows": 1},
     "gemv.fp16.in_flight.rows_per_block"),
    ({"threads_per_block": 32, "rows_per_block": 1, "bytes_per_thread": 0, "max_rows": 1},
     "gemv.fp16.in_flight.bytes_per_thread"),
    ({"threads_per_block": 32, "rows_per_block": 1, "bytes_per_thread": 4.0, "max_rows": 1,
      "unroll": 4}, "gemv.fp16.in_flight"),
])
def test_bad_in_flight_names_file_and_field(in_flight, field):
    data = dict(runtime("llama.cpp-cuda").data)
    data["gemv"] = {"fp16": {"per_weight": {}, "per_weight_row": {"load": 1},
                             "in_flight": in_flight}}
    with pytest.raises(ConfigError) as err:
        parse_runtime(data, file="rt.toml")
    assert err.value.file == "rt.toml" and err.value.field.startswith(field)


@pytest.mark.parametrize("occupancy, field", [
    ({"threads_per_core": 2048}, "occupancy"),
    ({"threads_per_core": 0, "blocks_per_core": 32}, "occupancy.threads_per_core"),
    ({"threads_per_core": 2048, "blocks_per_core": True}, "occupancy.blocks_per_core"),
    ("2048", "occupancy"),
])
def test_bad_occupancy_names_file_and_field(occupancy, field):
    assert_bad_device_table("occupancy", occupancy, field)


@pytest.mark.parametrize("runtime_name, weights", [("llama.cpp-cuda", "q4_0"),
                                                   ("gpt-fast", "int8")])
def test_a_gemv_kernel_takes_at_most_its_runtimes_rows(runtime_name, weights):
    """llama.cpp's CUDA mmvq takes at most 8 activation rows (MMVQ_MAX_BATCH_SIZE) and MMQ the
    rest: at batch 16 and in a prefill the matmuls run their GEMM path, as with no GEMV at
    all; at batch 8 the GEMV still runs. Before, a counted GEMV ran at any M: batch 16 took
    14.8 ms against 4.2, a 512-token prefill 335 ms against 13."""
    from memsim.runtime import runtime

    dev = memsim.device("h100-sxm")
    stack = runtime(runtime_name)
    assert stack.gemv_max_rows == 8
    no_gemv = stack.with_overrides({"small_batch_gemv": False})

    def step(rt, **fields):
        return memsim.emulate(dev, "llama-3-8b", weights=weights, runtime=rt,
                              **fields).time_per_step

    assert step(stack, batch=16) == step(no_gemv, batch=16)
    assert step(stack, batch=8) != step(no_gemv, batch=8)
    # a prefill: its 512-row matmuls run the GEMM path; only its LM head (one row, the last
    # position's) still runs the GEMV
    gemv, gemm = (memsim.emulate(dev, "llama-3-8b", memsim.Prefill(
        prompt=512, weights=weights, runtime=rt)).time_per_step for rt in (stack, no_gemv))
    assert gemv == pytest.approx(gemm, rel=1e-3)
