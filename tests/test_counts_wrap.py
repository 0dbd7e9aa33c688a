"""No count wraps and no figure is a silent NaN or infinity, whatever the input's size.

One chip's counts are int64 and bounded before planning (:func:`memsim.limits.check_sizes`);
the whole system's are one chip's times its tensor-parallel chips, summed over stages, and may
pass 2^63: they are Python integers, exact. Inputs that would plan for hours are refused by
their own limits (docs/limits.md).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memsim
from memsim.errors import ConfigError
from memsim.inputs import device_from
from memsim.limits import INT64_MAX, MAX_DRAFT_HEADS, check_sizes, largest_counts
from memsim.workload import Decode

MODEL = "llama-3.2-1b"
HUGE_HBM = (("tiers.hbm.capacity", "64 PiB"),)


def test_whole_system_bytes_past_int64_are_exact():
    # 16,384 chips each reading a 2^50-byte KV cache: 2^64 bytes in all (wrapped to 1.4e12,
    # less than one chip's, before the totals were Python integers)
    dev = device_from("h100-sxm", sets=HUGE_HBM)
    tp = 16384
    rep = memsim.emulate(dev, MODEL, batch=1024, context=2**28, tp=tp, steps=1)
    chip = rep.chip(0)["bytes_read"]["hbm"]
    assert chip < INT64_MAX < rep.bytes_read["hbm"]
    assert rep.bytes_read["hbm"] >= chip * (tp - 1)
    assert rep.bytes_written["sram"] >= rep.chip(0)["bytes_written"]["sram"] * (tp - 1)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.integers(1, 4096), context=st.integers(0, 2**26),
       tp=st.sampled_from([1, 2, 8, 64, 4096]))
def test_system_totals_are_at_least_one_chips_and_every_figure_is_finite(batch, context, tp):
    dev = device_from("h100-sxm", sets=HUGE_HBM)
    try:
        rep = memsim.emulate(dev, MODEL, batch=batch, context=context, tp=tp, steps=1)
    except ConfigError:
        return
    for tier, nbytes in rep.chip(0)["bytes_read"].items():
        assert rep.bytes_read[tier] >= nbytes
    for name in ("time_per_token", "tokens_per_s", "energy_per_token", "cycles"):
        assert math.isfinite(getattr(rep, name)), name


def test_draft_heads_are_bounded_before_planning():
    # 10^6 heads planned for 27 s before a capacity error; 10^9 would have planned for hours
    with pytest.raises(ConfigError) as info:
        check_sizes(memsim.device("h100-sxm"), memsim.model(MODEL),
                    Decode(draft_heads=MAX_DRAFT_HEADS + 1))
    assert info.value.field == "draft_heads"


def test_the_weight_bound_counts_the_draft_heads():
    dev, model = memsim.device("h100-sxm"), memsim.model(MODEL)
    plain = largest_counts(dev, model, Decode())["weights_bits"]
    heads = largest_counts(dev, model, Decode(draft_heads=3))["weights_bits"]
    h, v = model.hidden, model.vocab
    assert heads - plain == 3 * h * (h + v) * 16          # bf16: 16 bits a weight, no metadata


@pytest.mark.parametrize("ranks", [10**12, 1025])
def test_ranks_per_chip_has_a_range(ranks):
    # 10^12 ranks per chip padded every head to 2 x 10^12 and planned without end
    with pytest.raises(ConfigError) as info:
        device_from("h100-sxm", sets=(("link.ranks_per_chip", ranks),))
    assert info.value.field == "link.ranks_per_chip" and "docs/limits.md" in str(info.value)
