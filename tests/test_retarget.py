"""A sweep reuses one plan for points that differ only in timing figures
(:func:`memsim.plan.retarget`): a reused plan must be, array for array, the plan its own device
gives, and a what-if that changes a count after all must not be reused. Both the kernel
columns of a runtime's GEMM kernel and a compute class made native once slipped through."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import memsim
from memsim.kernels import step as k
from memsim.plan import plan_system, retarget
from memsim.study import Point
from memsim.sweep import _PLANS, evaluate, figures_of, plain_figures

W8A8_AITER = dict(batch=8, context=1024, weights="int8", activations="int8",
                  runtime="vllm-rocm-aiter")
#: (device, model, workload, what-if path, values): a runtime whose int8 matmuls run on a GEMM
#: kernel with bytes in flight; a compute class made native (W8A8 activations quantize); a
#: 16-bit class whose KV conversion depends on it; links inside and across NVLink domains.
CASES = [
    ("mi300x", "llama-3-8b", W8A8_AITER, "tiers.hbm.bandwidth", ("4 TB/s", "8 TB/s")),
    ("mi300x", "llama-3-8b", W8A8_AITER, "tiers.hbm.latency", ("1 us", "5 us")),
    ("mi300x", "llama-3-8b", W8A8_AITER, "clock", ("1.5 GHz", "2.5 GHz")),
    ("mi300x", "llama-3-8b", W8A8_AITER, "compute.vector", ("80 TFLOPS", "300 TFLOPS")),
    ("mi300x", "llama-3-8b", W8A8_AITER, "overheads.op_launch", ("2 us", "6 us")),
    ("gaudi-3", "llama-3-8b", dict(batch=64, context=1024, weights="int8", activations="int8"),
     "compute.int8", ("3670 TOPS",)),
    ("maia-100", "llama-3-8b", dict(batch=32, context=4096, kv="fp16"), "compute.fp16",
     ("400 TFLOPS", "800 TFLOPS")),
    ("h100-sxm", "llama-3-8b", dict(batch=2, context=128, tp=2, pp=3), "link.latency",
     ("2 us", "9 us")),
    ("h100-sxm", "llama-3-8b", dict(batch=2, context=128, tp=8, pp=2), "link.bandwidth",
     ("100 GB/s",)),
    ("h100-sxm", "mixtral-8x7b", dict(batch=16, context=128, tp=2, ep=8), "link.latency",
     ("3 us",)),
]
IDS = [f"{dev}-{path}" for dev, _, _, path, _ in CASES]


def _decode(fields: dict) -> memsim.Decode:
    return memsim.Decode(**fields)


def _same_plans(a, b) -> None:
    for one, other in zip(a.stages, b.stages):
        for field in dataclasses.fields(one):
            x, y = getattr(one, field.name), getattr(other, field.name)
            if isinstance(x, np.ndarray):
                np.testing.assert_array_equal(x, y, err_msg=field.name)
            elif isinstance(x, (int, float, str, tuple)):
                assert x == y, field.name


@pytest.mark.parametrize("device, model, fields, path, values", CASES, ids=IDS)
def test_a_reused_plan_is_the_plan_of_its_own_device(device, model, fields, path, values):
    base, mod = memsim.device(device), memsim.model(model)
    planned = plan_system(base, mod, _decode(fields))
    for value in values:
        what_if = base.with_overrides({path: value})
        fresh = plan_system(what_if, mod, _decode(fields))
        reused = retarget(planned, what_if)
        if reused is None:      # refused only where the activations' bits differ
            assert any((p.op_int[:, k.C_ACT_BITS] != q.op_int[:, k.C_ACT_BITS]).any()
                       for p, q in zip(planned.stages, fresh.stages))
        else:
            _same_plans(reused, fresh)


def test_a_compute_class_made_native_is_planned_afresh():
    """Gaudi 3's file has no INT8 matrix peak: W8A8 runs at BF16 there. An INT8 peak what-if
    makes its activations quantize to 8 bits, which a reused plan cannot say."""
    base = memsim.device("gaudi-3")
    fields = dict(batch=64, context=1024, weights="int8", activations="int8")
    planned = plan_system(base, memsim.model("llama-3-8b"), _decode(fields))
    assert retarget(planned, base.with_overrides({"compute.int8": "3670 TOPS"})) is None
    assert retarget(planned, base.with_overrides({"compute.bf16": "900 TFLOPS"})) is not None


@pytest.mark.parametrize("device, model, fields, path, values", CASES, ids=IDS)
def test_a_sweep_gives_each_what_if_the_figures_of_its_own_device(device, model, fields, path,
                                                                 values):
    """The study's first point plans, the others reuse its plan: each row's figures are what
    the point gives on its own, whatever came before it in the process."""
    workload = tuple(sorted(fields.items()))
    points = [Point(device=device, model=model, workload=workload)] + [
        Point(device=device, model=model, workload=workload, overrides=((path, value),))
        for value in values]
    _PLANS.clear()
    in_turn = [evaluate(point)[2] for point in points]
    for point, figures in zip(points, in_turn):
        alone = plain_figures(figures_of(memsim.emulate(memsim.device(device).with_overrides(
            dict(point.overrides)), model, _decode(fields))))
        assert figures == alone, point.overrides
