"""Issue 18: a figure without a finite value is null in JSON with the reason; inputs that were
silently ignored or never returned are refused."""

from __future__ import annotations

import json

import pytest

import memsim


@pytest.mark.parametrize("device, model, fields", [
    ("wse-3", "llama-3-8b", {}),
    ("groq-lpu", "llama-3.2-1b", dict(tp=4, pp=4)),
    ("ipu-gc200", "llama-3.2-1b", dict(pp=4)),
])
def test_sram_resident_runs_give_strict_json(device, model, fields):
    report = memsim.emulate(device, model, batch=1, context=256, **fields)
    assert report.off_chip_bytes == 0 and report.arithmetic_intensity == float("inf")
    data = json.loads(report.to_json(), parse_constant=lambda name: pytest.fail(name))
    assert data["arithmetic_intensity"] is None
    assert "unbounded" in data["unbounded"]["arithmetic_intensity"]


def test_bounded_figures_stay_numbers():
    data = json.loads(memsim.emulate("h100-sxm", "llama-3.2-1b", context=64).to_json())
    assert data["arithmetic_intensity"] > 0 and data["unbounded"] == {}


def test_routing_a_dense_model_is_refused_not_ignored():
    """Issue 18 item 16: a routing spec on a dense model was silently ignored."""
    with pytest.raises(memsim.ConfigError, match="dense") as info:
        memsim.emulate("h100-sxm", "llama-3.2-1b", routing="zipf:1.2")
    assert info.value.field == "routing"


def test_monte_carlo_draws_are_bounded():
    """Issue 18 item 14: --samples 2**62 never returned."""
    with pytest.raises(memsim.ConfigError, match="Monte Carlo") as info:
        memsim.speculative("h100-sxm", "llama-3.2-1b", method="ngram", gamma=2,
                           acceptance=0.5, samples=4611686018427387904, context=64)
    assert info.value.field == "samples"
