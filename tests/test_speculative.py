"""Speculative decoding: acceptance (closed form and Monte Carlo), traffic, break-even."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import memsim
from memsim.speculative import (
    Acceptance,
    closed_form_tokens,
    kv_bytes_per_token,
    sample_tokens,
    speculative,
    tree_nodes,
)
from memsim.plan import plan_system
from memsim.testing import examples

# small enough for one chip of every device, the two together (Groq's 230 MB included)
TINY_TARGET = memsim.Model(name="tiny-target", display_name="tiny target", layers=4, hidden=1024,
                           heads=8, kv_heads=2, head_dim=128, ffn=2048, vocab=16000,
                           tied_embeddings=False)
TINY_DRAFT = memsim.Model(name="tiny-draft", display_name="tiny draft", layers=1, hidden=512,
                          heads=4, kv_heads=1, head_dim=128, ffn=1024, vocab=16000,
                          tied_embeddings=True)


# Acceptance -------------------------------------------------------------------------------

@given(st.floats(0.0, 1.0), st.integers(1, 12))
def test_closed_form_matches_the_distribution(rate, gamma):
    accept = Acceptance.parse(rate, gamma)
    assert accept.expected_tokens == pytest.approx(closed_form_tokens(rate, gamma), rel=1e-9)
    assert sum(accept.distribution) == pytest.approx(1.0)


def test_tokens_tend_to_gamma_plus_one():
    for gamma in (1, 4, 9):
        assert closed_form_tokens(1.0, gamma) == gamma + 1
        assert closed_form_tokens(0.999999, gamma) == pytest.approx(gamma + 1, rel=1e-4)
        assert closed_form_tokens(0.0, gamma) == 1.0


@settings(max_examples=examples(30))
@given(st.floats(0.0, 1.0), st.integers(1, 10), st.integers(0, 1000))
def test_monte_carlo_mean_is_within_three_standard_errors(rate, gamma, seed):
    """Three standard errors of the mean, from the closed-form distribution's variance."""
    accept = Acceptance.parse(rate, gamma)
    draws = 20000
    sampled = sample_tokens(accept, draws, seed)
    assert sum(sampled.counts) == draws
    expected = closed_form_tokens(rate, gamma)
    variance = sum(p * (t - expected) ** 2 for t, p in enumerate(accept.distribution, start=1))
    assert abs(sampled.mean - expected) <= 3 * math.sqrt(variance / draws) + 1e-12


def test_monte_carlo_is_deterministic_for_a_seed():
    accept = Acceptance.parse([0.9, 0.7, 0.5], 3)
    assert sample_tokens(accept, 5000, 7) == sample_tokens(accept, 5000, 7)
    assert sample_tokens(accept, 5000, 7) != sample_tokens(accept, 5000, 8)


@pytest.mark.parametrize("value, message", [(1.5, "lie in"), ([0.9, 0.8], "expected 3"),
                                            ("often", "expected a rate")])
def test_bad_acceptance(value, message):
    with pytest.raises(memsim.ConfigError, match=message):
        Acceptance.parse(value, 3)


# Iterations on devices ----------------------------------------------------------------------

@pytest.mark.parametrize("name", memsim.device_names())
def test_acceptance_zero_is_slower_than_plain_decode_on_every_device(name):
    report = speculative(name, TINY_TARGET, TINY_DRAFT, 4, 0.0, context=512)
    assert report.expected_tokens == 1.0
    assert report.speedup < 1.0
    assert report.time_per_token > report.plain_time_per_token_s


def test_llama_70b_with_a_1b_draft_on_h100s():
    """Batch 1 is HBM-bound: one weight pass serves gamma + 1 tokens and speculation pays. At
    batch 256 the verification is bound on chip instead (its rows, not its weight bytes, set the
    time), so the speedup falls."""
    single = speculative("h100-sxm", "llama-3-70b", "llama-3.2-1b", 4, 0.8, batch=1,
                         context=1024, tp=2)
    assert single.speedup > 1.0
    assert single.verify_bound_by == "hbm" and single.plain_bound_by == "hbm"
    assert "pays" in single.why
    served = speculative("h100-sxm", "llama-3-70b", "llama-3.2-1b", 4, 0.8, batch=256,
                         context=1024, tp=8)
    assert served.speedup < single.speedup and served.speedup < 1.0
    assert served.verify_bound_by not in ("hbm",)
    assert served.verify_time_s > 2 * served.plain_time_per_token_s
    assert "does not pay" in served.why


def test_target_weight_bytes_are_one_step_whatever_gamma():
    """One pass over the weights verifies every drafted token; only the embedding lookups grow
    with the tokens (one 2048 x bf16 row each)."""
    dev = memsim.device("h100-sxm").with_overrides({"tiers.sram.capacity": "4 KiB"})
    plain = memsim.emulate(dev, "llama-3.2-1b", context=256)
    row = 2048 * 2
    for gamma in (1, 2, 5, 8):
        report = speculative(dev, "llama-3.2-1b", None, gamma, 0.7, context=256,
                             method="ngram")
        assert report.target_weight_bytes["hbm"] - gamma * row == \
            plain.warm.weight_bytes_read["hbm"]


@pytest.mark.parametrize("gamma, rate", [(1, 0.5), (4, 0.8), (7, 0.3)])
def test_wasted_kv_writes_are_the_rejected_tokens(gamma, rate):
    report = speculative("h100-sxm", "llama-3-8b", None, gamma, rate, batch=3, context=512,
                         method="ngram")
    rejected = gamma + 1 - closed_form_tokens(rate, gamma)
    per_token = kv_bytes_per_token(memsim.model("llama-3-8b"), "bf16")
    assert report.wasted_kv_bytes == pytest.approx(rejected * 3 * per_token, rel=1e-12)
    # the verification really wrote every drafted token's KV (bf16 rows are whole sectors)
    assert report.target_kv_written == (gamma + 1) * 3 * per_token


def test_a_draft_on_the_same_chip_competes_for_its_on_chip_tier():
    """On MTIA v2 the target pins its weights in SRAM; a draft on the same chip gets what is
    left, and its own chip gives it all of it."""
    dev = memsim.device("mtia-v2")
    shared = speculative(dev, TINY_TARGET, TINY_DRAFT, 3, 0.8, context=256)
    alone = speculative(dev, TINY_TARGET, TINY_DRAFT, 3, 0.8, context=256, draft_device=dev)
    assert alone.transfer_time_s > 0 and shared.transfer_time_s == 0
    assert shared.draft_bytes["lpddr"] >= alone.draft_bytes["lpddr"]


def test_target_and_draft_must_fit_one_chip_together():
    dev = memsim.device("h100-sxm").with_overrides({"tiers.hbm.capacity": "17 GB"})
    with pytest.raises(memsim.CapacityError, match="together"):
        speculative(dev, "llama-3-8b", "llama-3.2-1b", 4, 0.8, context=1024)


def test_draft_heads_verify_a_tree_in_one_pass():
    report = speculative("h100-sxm", "llama-3-8b", None, acceptance=0.7, method="heads",
                         tree=(3, 2, 1), context=1024)
    assert report.gamma == tree_nodes((3, 2, 1)) == 3 + 6 + 6
    assert report.acceptance[0] == pytest.approx(1 - 0.3 ** 3)
    assert report.draft_bytes["hbm"] == 0 and report.draft_time_s == 0
    plain = memsim.emulate("h100-sxm", "llama-3-8b", context=1024)
    heads_bytes = report.target_weight_bytes["hbm"] - plain.warm.weight_bytes_read["hbm"]
    per_head = 4096 * 4096 * 2 + 128256 * 4096 * 2        # residual block + vocabulary head
    assert heads_bytes == 3 * per_head + 15 * 4096 * 2      # and 15 more embedding rows


def test_gamma_auto_picks_the_best_of_its_scan():
    report = speculative("h100-sxm", "llama-3-8b", "llama-3.2-1b", "auto", 0.8, context=512)
    assert len(report.gamma_scan) == 12
    assert report.speedup == max(s for _, s in report.gamma_scan)
    assert report.gamma == max(report.gamma_scan, key=lambda gs: gs[1])[0]


def test_spec_on_the_command_line(capsys):
    from memsim.cli import main
    assert main(["spec", "h100-sxm", "llama-3-8b", "--draft", "llama-3.2-1b", "--gamma", "3",
                 "--acceptance", "0.9,0.8,0.7", "--samples", "2000", "--json"]) == 0
    import json
    data = json.loads(capsys.readouterr().out)
    assert data["gamma"] == 3 and data["monte_carlo"]["draws"] == 2000
    assert math.isclose(data["expected_tokens"], 1 + 0.9 + 0.9 * 0.8 + 0.9 * 0.8 * 0.7)
    assert main(["spec", "h100-sxm", "llama-3-8b", "--gamma", "two"]) == 2


# Energy -------------------------------------------------------------------------------------

def _dynamic_j(report: memsim.Report, steps: slice) -> float:
    """The dynamic energy (bytes and operations) of some of a plain run's steps."""
    return sum(s.energy_j - s.static_energy_j for s in report.steps[steps])


@pytest.mark.parametrize("target, fields, draft_device, powered", [
    ("llama-3-70b", {"tp": 8, "weights": "fp8-e4m3"}, None, {"h100-sxm": 8}),
    ("llama-3-8b", {"tp": 1}, None, {"h100-sxm": 1}),
    ("llama-3-8b", {"tp": 2}, "b200", {"h100-sxm": 2, "b200": 1}),
])
def test_every_powered_chip_pays_static_power_over_the_whole_iteration(target, fields,
                                                                       draft_device, powered):
    """The target's chips idle while the draft runs (the other seven at TP 8), the draft's own
    device idles while the target verifies, and the bookkeeping and hand-off are on the clock
    too: static energy is idle power x powered chips x iteration time. Without idle power the
    energy is the dynamic part alone: the warm verification's and drafts' bytes and operations,
    as plain runs of the two count them when the draft has a device of its own."""
    devices = {name: memsim.device(name) for name in powered}
    unpowered = {name: dataclasses.replace(dev, idle_power_w=None)
                 for name, dev in devices.items()}
    report, dynamic = (speculative(devs["h100-sxm"], target, "llama-3.2-1b", 4, 0.8,
                                   draft_device=devs.get(draft_device), context=1024, **fields)
                       for devs in (devices, unpowered))
    assert report.bookkeeping_time_s > 0 and report.draft_time_s > 0
    assert dynamic.iteration_time_s == report.iteration_time_s
    watts = sum(devices[name].idle_power_w * chips for name, chips in powered.items())
    assert report.energy_j - dynamic.energy_j == pytest.approx(
        watts * report.iteration_time_s, rel=1e-9)
    if draft_device is not None:       # no shared tier: the two run as they would alone
        verify = memsim.emulate("h100-sxm", target, context=1024, new_tokens=5, steps=2,
                                **fields)
        drafts = memsim.emulate(draft_device, "llama-3.2-1b", context=1024, steps=8)
        assert dynamic.energy_j == pytest.approx(
            _dynamic_j(verify, slice(-1, None)) + _dynamic_j(drafts, slice(-4, None)),
            rel=1e-12)


def test_a_draft_sharing_a_hybrid_chip_pins_in_what_the_target_leaves():
    """MTIA v2 pins weights in its SRAM (the hybrid policy): the target pins first, and the
    draft on the same chip pins in what is left, so the two never hold more than the SRAM;
    the draft then reads more off chip, and runs slower, than it does alone."""
    from memsim.speculative import _beside

    dev = memsim.device("mtia-v2")
    target = plan_system(dev, memsim.model("llama-3-8b"),
                         memsim.Decode(weights="int8", new_tokens=5))
    draft_model = memsim.model("llama-3.2-1b")
    alone = plan_system(dev, draft_model, memsim.Decode(weights="int8", steps=8))
    beside = _beside(dev, target, draft_model, alone)
    tables = [target.stages[0].tensor_table, beside.stages[0].tensor_table]
    assert tables[0].pinned_bytes() > 0
    assert sum(t.pinned_bytes() + t.need().get(0, 0) for t in tables) <= dev.tiers[0].capacity
    assert tables[1].pinned_bytes() < alone.stages[0].tensor_table.pinned_bytes()
    report = speculative(dev, "llama-3-8b", draft_model, 4, 0.8, weights="int8")
    alone_step = memsim.emulate(dev, draft_model, weights="int8", steps=8).time_per_step
    assert report.draft_time_s > 4 * alone_step


@pytest.mark.parametrize("gamma", [0, 4097, 2**63 - 1, 10**20])
def test_a_gamma_out_of_range_is_one_clear_error(gamma):
    """10^20 ended in an OverflowError and 2^63 - 1 in a MemoryError."""
    from memsim.limits import MAX_GAMMA

    with pytest.raises(memsim.ConfigError, match=f"from 1 to {MAX_GAMMA}") as info:
        speculative("h100-sxm", "llama-3-8b", "llama-3.2-1b", gamma, 0.8)
    assert info.value.field == "gamma"


@pytest.mark.parametrize("method, extra, field", [
    ("ngram", {"tree": [3, 2]}, "tree"), ("draft", {"tree": [3, 2]}, "tree"),
    ("ngram", {"draft": "llama-3.2-1b"}, "draft"), ("heads", {"draft_weights": "int8"},
                                                    "draft_weights"),
    ("heads", {"draft_device": "b200"}, "draft_device")])
def test_an_input_the_method_would_ignore_is_refused(method, extra, field):
    """A what-if that would change nothing is refused, not ignored (they ran, exit 0)."""
    fields = {"draft": "llama-3.2-1b"} if method == "draft" and field != "draft" else {}
    with pytest.raises(memsim.ConfigError) as info:
        speculative("h100-sxm", "llama-3-8b", gamma=3, acceptance=0.8, method=method,
                    **{**fields, **extra})
    assert info.value.field == field
