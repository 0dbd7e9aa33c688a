"""A point's figures do not depend on what the process planned before it.

Plans are built from per-process caches of what a point shares with others (its device, model,
formats and parallelism); these tests run varied points in two orders, so that one order meets
each point on a cache miss and the other on a hit, and compare every figure exactly: the JSON
and CSV of the report and the warm step's per-op rows.
"""

from __future__ import annotations

import memsim

CXL = ("h100-sxm", "cxl-gen5-x16")

#: (device, model, workload fields): parallelism, MoE, MLA, prefill, speculative heads,
#: placement rules, the pinned and tiered policies and SRAM machines, at several batch x context.
POINTS = (
    ("h100-sxm", "llama-3-70b", dict(weights="int8")),
    ("h100-sxm", "llama-3-70b", dict(weights="int8", batch=8, context=1024)),
    ("h100-sxm", "llama-3.2-1b", dict(weights="int8")),
    ("h100-sxm", "llama-3.2-1b", dict(weights="int8", batch=16, context=8192)),
    ("h100-sxm", "llama-3.2-1b", dict(batch=4, context=512, kv="fp8-e4m3")),
    ("h100-sxm", "llama-3-70b", dict(tp=8, batch=32, context=2048)),
    ("h100-sxm", "llama-3-70b", dict(tp=4, pp=2, microbatches=2, batch=8, context=4096)),
    ("h100-sxm", "llama-3-70b", dict(tp=4, pp=2, batch=2, context=512)),
    ("h100-sxm", "mixtral-8x7b", dict(tp=2, batch=4, context=2048)),
    ("h100-sxm", "mixtral-8x7b", dict(ep=2, batch=8, context=1024, weights="int8")),
    ("h100-sxm", "deepseek-v3-style", dict(tp=8, weights="int4-g128", batch=2, context=4096)),
    ("h100-sxm", "llama-3-8b", dict(prefill_chunk=256, prefill_context=512, batch=2)),
    ("h100-sxm", "llama-3-8b", dict(draft_heads=2, batch=1, context=2048)),
    ("h100-sxm", "llama-3-8b", dict(new_tokens=4, batch=2, context=1024)),
    (CXL, "llama-3-8b", dict(placement={"kv": "cxl:0.5"}, batch=8, context=8192)),
    (CXL, "llama-3-8b", dict(placement={"weights": "cxl:0.3"}, context=64)),
    (CXL, "llama-3-70b", dict(policy="tiered", weights="int8", batch=4, context=4096)),
    ("mtia-v2", "llama-3.2-1b", dict(weights="int8", context=512, steps=3)),
    ("mtia-v2", "llama-3.2-1b", dict(weights="int8", policy="hybrid", batch=2, context=1024)),
    ("wse-3", "llama-3-8b", dict(batch=4, context=8192)),
    ("groq-lpu", "llama-3-70b", dict(pp=576, weights="int8", kv="fp16")),
    ("groq-lpu", "llama-3.2-1b", dict(tp=4, pp=4, batch=2, context=1024)),
    ("inferentia2", "llama-3-8b", dict(tp=12, batch=2, context=2048)),
    ("mi300x", "llama-3.2-1b", dict(batch=8, context=2048, weights="int4-g128", kv="fp8-e4m3")),
    ("b200", "llama-3-70b", dict(weights="int4-g128", batch=1, context=32768)),
    ("tpu-v5e", "llama-3-8b", dict(tp=4, batch=8, context=4096)),
    ("mi300x", "llama-3-8b", dict(batch=64, context=128)),
)


def _device(spec) -> memsim.Device:
    if isinstance(spec, tuple):
        name, tier = spec
        return memsim.device(name).with_tier(tier)
    return memsim.device(spec)


def figures(point) -> tuple[str, str, list[dict]]:
    """Every figure of one point: the report's JSON and CSV and the warm per-op rows."""
    device, model, fields = point
    rep = memsim.emulate(_device(device), model, **fields)
    return rep.to_json(), rep.to_csv(), [row.to_dict() for row in rep.op_rows("warm")]


def test_points_in_two_orders_give_the_same_figures():
    forward = [figures(point) for point in POINTS]
    backward = [figures(point) for point in reversed(POINTS)][::-1]
    for point, a, b in zip(POINTS, forward, backward):
        assert a == b, point


def test_a_repeated_point_gives_the_same_figures():
    first = figures(POINTS[0])
    figures(POINTS[1])
    assert figures(POINTS[0]) == first
