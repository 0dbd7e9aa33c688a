"""The limits memsim enforces (memsim.limits, docs/limits.md): figure ranges and exact int64 counts.

Issue 18 items 4, 9, 11 and 14: a figure that would make an infinity, a count that could wrap
int64 and a shape that would plan for hours are each refused with the limit named.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import memsim
from memsim import ConfigError
from memsim.limits import (FIGURE_RANGES, INT64_MAX, MAX_SAMPLES, MAX_STEPS, MAX_TILE_SIDE,
                           check_figure, check_int64, check_samples, check_sizes, largest_counts)
from memsim.model import LIMITS
from memsim.workload import Decode

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_catalog_points_pass_including_a_405b_point_at_1m_context_and_batch_1024():
    h100 = memsim.device("h100-sxm")
    for name in memsim.model_names():
        check_sizes(h100, memsim.model(name), Decode())
    check_sizes(h100, memsim.model("llama-3.1-405b"), Decode(batch=1024, context=10**6))


def test_kv_bound_is_the_closed_form_of_the_final_cache():
    model, wl = memsim.model("llama-3-8b"), Decode(batch=3, context=1000, kv_block=16, steps=2)
    tokens = -(-(1000 + 2) // 16) * 16
    closed = 3 * tokens * 2 * model.layers * model.kv_heads * model.head_dim * 16
    assert largest_counts(memsim.device("h100-sxm"), model, wl)["kv_bits"] == closed


def test_weight_bound_covers_the_model():
    model = memsim.model("llama-3-70b")
    counts = largest_counts(memsim.device("h100-sxm"), model, Decode(weights="int4-g128"))
    assert counts["weights_bits"] >= 4 * model.total_params


def test_a_one_layer_model_at_huge_context_and_batch_is_refused_not_wrapped():
    """Issue 18 item 4: context 2^30 x batch 2^20 used to miss exactly 2^62 KV bytes."""
    one = dataclasses.replace(memsim.model("llama-3-8b"), layers=1)
    with pytest.raises(ConfigError) as info:
        check_sizes(memsim.device("h100-sxm"), one, Decode(batch=2**20, context=2**30))
    assert info.value.field == "context" and "2^63 - 1" in str(info.value)


def test_flops_past_int64_are_refused():
    """Issue 18 item 4: 405B at batch 131,072 and context 10^7 reported negative FLOPs."""
    with pytest.raises(ConfigError) as info:
        check_sizes(memsim.device("h100-sxm"), memsim.model("llama-3.1-405b"),
                    Decode(batch=131_072, context=10**7))
    assert info.value.field == "batch" and "FLOPs" in str(info.value)


@pytest.mark.parametrize("side", ["tile_k", "tile_n"])
def test_absurd_tiles_are_refused(side):
    """Issue 18 item 4: --tile-n 2^63-1 read 540,672 B for Llama 3 8B."""
    with pytest.raises(ConfigError) as info:
        check_sizes(memsim.device("h100-sxm"), memsim.model("llama-3-8b"),
                    Decode(**{side: INT64_MAX}))
    assert info.value.field == side and f"{MAX_TILE_SIDE:,}" in str(info.value)


def test_a_tile_of_too_many_elements_is_refused():
    with pytest.raises(ConfigError, match="elements"):
        check_sizes(memsim.device("h100-sxm"), memsim.model("llama-3-8b"),
                    Decode(tile_k=2**20, tile_n=2**20))


@pytest.mark.parametrize("field,value", [("layers", 10**6), ("experts", 10**5),
                                         ("hidden", 2**30)])
def test_shapes_that_would_plan_for_hours_are_refused_before_planning(field, value):
    """Issue 18 item 14: 10^6 layers planned for 105 s and 5.4 GB before its CapacityError.
    The planner holds a Model to the limits a model file is read with (one bound, not two)."""
    model = dataclasses.replace(memsim.model("mixtral-8x7b"), **{field: value})
    with pytest.raises(ConfigError) as info:
        check_sizes(memsim.device("h100-sxm"), model, Decode())
    assert info.value.field == field and f"{LIMITS[field][1]:,}" in str(info.value)


def test_steps_are_bounded():
    with pytest.raises(ConfigError) as info:
        check_sizes(memsim.device("h100-sxm"), memsim.model("llama-3.2-1b"),
                    Decode(steps=MAX_STEPS + 1))
    assert info.value.field == "steps"


def test_samples_and_int64_helpers():
    assert check_samples(MAX_SAMPLES) == MAX_SAMPLES
    with pytest.raises(ConfigError, match="Monte Carlo"):
        check_samples(4611686018427387904)
    assert check_int64(INT64_MAX, field="seed") == INT64_MAX
    with pytest.raises(ConfigError) as info:
        check_int64(2**64, field="seed")
    assert info.value.field == "seed"


@pytest.mark.parametrize("kind", sorted(FIGURE_RANGES))
def test_each_range_refuses_both_sides_and_names_itself(kind):
    limit = FIGURE_RANGES[kind]
    check_figure(limit.high, kind, file="f.toml", field="x")
    for outside in (limit.high * 10, -1.0, float("inf"), float("nan")):
        with pytest.raises(ConfigError) as info:
            check_figure(outside, kind, file="f.toml", field="x")
        assert limit.text() in str(info.value) and "docs/limits.md" in str(info.value)


def test_every_limit_is_documented():
    text = (DOCS / "limits.md").read_text(encoding="utf-8")
    for kind, limit in FIGURE_RANGES.items():
        assert f"`{kind}`" in text, kind
        assert limit.text() in text, (kind, limit.text())
    for name in ("MAX_STEPS", "MAX_TILE_SIDE",
                 "MAX_TILE_ELEMENTS", "MAX_SAMPLES", "INT64_MAX"):
        assert f"`{name}`" in text, name
