"""The MI300X's measured rates (devices/mi300x.toml [sources]) against the figures they cite:
Azure's hipblaslt-bench FP8 GEMM (1,222.9 TFLOPS) and BabelStream read-only Dot (4.0 TB/s),
stas00's mamf-finder BF16 (668.4 TFLOPS); and the time model using exactly those rates."""

from __future__ import annotations

import pytest

import memsim
from memsim.kernels import step as k
from memsim.plan import plan_system

FP8_GEMM_FLOPS = 1222.9e12        # Azure ND MI300X v5, hipBLASLt FP8 8192^3
BF16_MAMF_FLOPS = 668.4e12        # stas00/ml-engineering MAMF table
DOT_BYTES_PER_S = 4.0e12          # Azure ND MI300X v5, BabelStream Dot


def test_sustained_rates_are_the_cited_measurements():
    dev = memsim.device("mi300x")
    assert dev.matmul_rate("fp8") == FP8_GEMM_FLOPS
    assert dev.matmul_rate("int8") == FP8_GEMM_FLOPS          # as fp8: the same peak
    assert dev.matmul_rate("bf16") == dev.matmul_rate("fp16") == BF16_MAMF_FLOPS
    assert dev.main_memory.sustained_bandwidth == DOT_BYTES_PER_S
    assert dev.matmul_rate("fp8") / dev.peak("fp8") == pytest.approx(1222.9 / 2614.9)


def test_fp8_matmuls_run_at_the_measured_fp8_rate():
    dev = memsim.device("mi300x").with_overrides({"tiers.sram.capacity": "64 GB"})
    plan = plan_system(dev, memsim.model("llama-3-8b"),
                       memsim.Decode(batch=1, context=64, weights="fp8-e4m3")).stages[0]
    rows = plan.op_float[plan.op_int[:, k.C_KIND] == k.OP_MATMUL]
    assert len(rows) > 0 and all(row[k.F_PEAK] == FP8_GEMM_FLOPS for row in rows)


def test_hbm_time_is_bytes_over_the_measured_bandwidth():
    """Llama 3 8B BF16 at batch 1 streams its weights: the HBM-bound time of the step is the
    bytes it reads and writes in HBM over 4.0 TB/s (was 4.2 TB/s, an estimate)."""
    step = memsim.emulate("mi300x", "llama-3-8b", batch=1, context=128).warm
    moved = step.bytes_read["hbm"] + step.bytes_written["hbm"]
    assert step.time_by_bound["hbm"] == pytest.approx(moved / DOT_BYTES_PER_S, rel=1e-12)
