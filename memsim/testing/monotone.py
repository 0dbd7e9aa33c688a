"""Monotonicity: a better device is never slower, a bigger on-chip tier never moves more bytes.

Each helper emulates the same model and workload on a device before and after a change (a
mapping of overrides for :meth:`memsim.Device.with_overrides`, or any function from a Device to a
Device) and compares the two reports, which it returns for further checks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from memsim.device import Device, device as catalog_device
from memsim.emulate import emulate
from memsim.model import Model
from memsim.report import Report
from memsim.testing.invariants import fail
from memsim.workload import Decode

Change = Mapping[str, Any] | Callable[[Device], Device]


def _before_after(change: Change, device: Device | str, model: Model | str,
                  workload: Decode) -> tuple[Report, Report, str]:
    dev = catalog_device(device) if isinstance(device, str) else device
    if isinstance(change, Mapping):
        changed, what = dev.with_overrides(change), f"with {dict(change)}"
    else:
        changed, what = change(dev), f"after {getattr(change, '__name__', repr(change))}"
    return emulate(dev, model, workload), emulate(changed, model, workload), what


def assert_not_slower_when(change: Change, *, device: Device | str, model: Model | str,
                           workload: Decode, rel: float = 1e-12) -> tuple[Report, Report]:
    """The warm step is not slower after ``change`` (more bandwidth, more capacity, more cores,
    less latency ...) than before; ``rel`` allows for float rounding. Returns both reports."""
    before, after, what = _before_after(change, device, model, workload)
    if after.time_per_token > before.time_per_token * (1 + rel):
        fail(f"time per token in s {what}", f"at most {before.time_per_token!r} (before)",
             repr(after.time_per_token),
             f"{after.time_per_token / before.time_per_token - 1:.3g} slower")
    return before, after


def assert_no_more_traffic_when(change: Change, *, device: Device | str, model: Model | str,
                                workload: Decode) -> tuple[Report, Report]:
    """No step reads more bytes from the tiers further out than the on-chip one after ``change``
    (a bigger on-chip tier, a pinning policy ...) than before. Returns both reports."""
    before, after, what = _before_after(change, device, model, workload)
    for ours, theirs in zip(before.steps, after.steps):
        old = sum(v for t, v in ours.bytes_read.items() if t != before.tier_names[0])
        new = sum(v for t, v in theirs.bytes_read.items() if t != after.tier_names[0])
        if new > old:
            fail(f"step {ours.step}: bytes read off chip {what}", f"at most {old} (before)",
                 new, f"{new - old} B more")
    return before, after
