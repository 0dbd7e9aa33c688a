"""Invariants any memsim Report must satisfy: conservation of bytes between tiers, lower bounds on
time, and comparisons between reports.

Each checker raises AssertionError naming the figure, the expected and the actual value, so that
a failing property test says what broke without a debugger.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from memsim.device import Device, device as catalog_device
from memsim.kernels import step as k
from memsim.report import Report, StepCounts, StepSummary


def fail(figure: str, expected: object, actual: object, why: str = "") -> None:
    """Raise the AssertionError every checker raises: the figure, expected and actual value."""
    reason = f" ({why})" if why else ""
    raise AssertionError(f"{figure}: expected {expected}, got {actual}{reason}")


def _op(report: Report, op: int) -> str:
    layer = report.op_layers[op]
    return f"op {op} ({report.op_names[op]}{f', layer {layer}' if layer >= 0 else ''})"


def assert_conservation(report: Report) -> None:
    """Bytes are neither made nor lost between the tiers.

    memsim's only cache is the on-chip tier; every other tier is a home. So, per op, exactly in
    bits, in the cold and warm steps (the raw counters the report keeps):

    - what the compute read on chip = the bits it found there (hits) + the bits read from the
      tiers further out;
    - what was written on chip = those bits read from further out (each miss fills the tier),
      except for a KV append, which writes its new rows to the KV's home and reads nothing;
    - only KV appends write to a tier further out; an op missed on chip if and only if it read
      from further out.

    In every step's totals, the same relations in whole bytes: each op rounds each of its parts
    up to a byte, so a total may fall short of the sum of its parts by less than a byte per op
    and part. And each chip's totals are the sum of its ops' rows.
    """
    for which, counts in (("cold", report.cold_counts), ("warm", report.warm_counts)):
        _ops_conserve(report, which, counts)
        summary = report.cold if which == "cold" else report.warm
        _rows_add_up(report, which, summary)
    for summary in report.steps:
        _totals_conserve(report, summary)


def _ops_conserve(report: Report, which: str, counts: StepCounts) -> None:
    on_chip = counts.read_bits[:, 0]
    outside = counts.read_bits[:, 1:].sum(axis=1)
    hit_bits = counts.results[:, k.R_HIT_BITS]
    hits, misses = counts.results[:, k.R_HITS], counts.results[:, k.R_MISSES]
    for op, name in enumerate(report.op_names):
        where = f"{which} step, {_op(report, op)}"
        if on_chip[op] != hit_bits[op] + outside[op]:
            fail(f"{where}: bits read on chip", f"{hit_bits[op] + outside[op]} (hits "
                 f"{hit_bits[op]} + from further out {outside[op]})", on_chip[op])
        if name == "kv_append":
            if on_chip[op] or hits[op] or misses[op]:
                fail(f"{where}: bits a KV append read", 0, on_chip[op])
        else:
            if counts.written_bits[op, 0] != outside[op]:
                fail(f"{where}: bits written on chip (fills)",
                     f"{outside[op]} (the bits read from further out)", counts.written_bits[op, 0])
            if counts.written_bits[op, 1:].any():
                fail(f"{where}: bits written to tiers further out",
                     "0 (only KV appends write there)", counts.written_bits[op, 1:].tolist())
        if (misses[op] > 0) != (outside[op] > 0):
            fail(f"{where}: bits read from further out", "some exactly when the op missed "
                 f"({misses[op]} misses)", outside[op])
        if (hits[op] > 0) != (hit_bits[op] > 0):
            fail(f"{where}: hit bits", f"some exactly when the op hit ({hits[op]} hits)",
                 hit_bits[op])


def _rows_add_up(report: Report, which: str, summary: StepSummary) -> None:
    rows = report.op_rows(which)
    for stage, (read, written) in enumerate(zip(summary.chip_bytes_read,
                                                summary.chip_bytes_written)):
        mine = [row for row in rows if row.stage == stage]
        for tier in report.tier_names:
            for figure, total, part in (("read", read, "bytes_read"),
                                        ("written", written, "bytes_written")):
                summed = sum(getattr(row, part)[tier] for row in mine)
                if total[tier] != summed:
                    fail(f"{which} step, chip {stage}: bytes {figure} in tier {tier!r}",
                         f"{summed} (the sum of its ops' rows)", total[tier])


def _totals_conserve(report: Report, summary: StepSummary) -> None:
    on_chip = report.tier_names[0]
    outside = sum(summary.bytes_read[t] for t in report.tier_names[1:])
    # one op of every chip, and the other chips' part of a vocabulary-parallel embedding
    slack = (len(report.tier_names) - 1) * len(report.op_names) * (report.tp + 1)
    parts = summary.hit_bytes + outside
    if not parts - slack <= summary.bytes_read[on_chip] <= parts:
        fail(f"step {summary.step}: bytes read on chip", f"hit bytes {summary.hit_bytes} + "
             f"bytes read further out {outside} = {parts} (less at most {slack} of rounding)",
             summary.bytes_read[on_chip])
    if summary.bytes_written[on_chip] < outside - slack:
        fail(f"step {summary.step}: bytes written on chip",
             f"at least the {outside} B read from further out (less {slack} of rounding)",
             summary.bytes_written[on_chip])


def assert_lower_bounds(report: Report, device: Device | str, *, rel: float = 1e-9) -> None:
    """No step is faster than its bytes over each tier's sustained bandwidth, or its matrix
    operations over the device's highest peak.

    Per chip of each stage: its busy time is at least its bytes read from each tier (and, for
    tiers further out, written to it) over that tier's sustained bandwidth, less a byte per op of
    rounding; the step takes at least the busiest chip's time and its operations over all chips'
    highest peak. ``device`` is the one the report was emulated on (object or catalog name);
    ``rel`` allows for float rounding in the sum of many wave times.
    """
    dev = catalog_device(device) if isinstance(device, str) else device
    if dev.tier_names != report.tier_names:
        fail("tiers of the device", report.tier_names, dev.tier_names,
             "the report was emulated on another device")
    peak = max(rate for _, rate in dev.compute)
    stages = np.array(report.op_stages or (0,) * len(report.op_names))
    for summary in report.steps:
        for stage, busy in enumerate(summary.chip_busy_s):
            ops = int((stages == stage).sum())
            for i, tier in enumerate(dev.tiers):
                moved = summary.chip_bytes_read[stage][tier.name]
                if i > 0:
                    moved += summary.chip_bytes_written[stage][tier.name]
                bound = max(0, moved - ops) / tier.sustained_bandwidth
                if busy < bound * (1 - rel):
                    fail(f"step {summary.step}, chip {stage}: busy time in s",
                         f"at least {bound!r} ({moved} B through {tier.name!r} at "
                         f"{tier.sustained_bandwidth!r} B/s sustained)", busy)
            if summary.time_s < busy * (1 - rel):
                fail(f"step {summary.step}: time in s", f"at least chip {stage}'s busy time "
                     f"{busy!r}", summary.time_s)
        bound = summary.flops / (report.chips * peak)
        if summary.time_s < bound * (1 - rel):
            fail(f"step {summary.step}: time in s", f"at least {bound!r} ({summary.flops} "
                 f"operations on {report.chips} chip(s) at {peak!r} op/s)", summary.time_s)


def assert_report_invariants(report: Report, device: Device | str) -> None:
    """Everything any report must satisfy: :func:`assert_conservation` and
    :func:`assert_lower_bounds`."""
    assert_conservation(report)
    assert_lower_bounds(report, device)


def assert_same_traffic(expected: Report, actual: Report) -> None:
    """Two reports count the same traffic: every step's totals, and every op's bytes, hits,
    misses and operations in the cold and warm steps (time is not compared)."""
    if expected.op_names != actual.op_names:
        fail("ops", expected.op_names, actual.op_names)
    if len(expected.steps) != len(actual.steps):
        fail("steps", len(expected.steps), len(actual.steps))
    for ours, theirs in zip(expected.steps, actual.steps):
        for figure in ("bytes_read", "bytes_written", "weight_bytes_read", "link_bytes",
                       "hits", "misses", "hit_bytes", "flops", "vector_ops"):
            if getattr(ours, figure) != getattr(theirs, figure):
                fail(f"step {ours.step}: {figure}", getattr(ours, figure),
                     getattr(theirs, figure))
    for which in ("cold", "warm"):
        for ours, theirs in zip(expected.op_rows(which), actual.op_rows(which)):
            for figure in ("bytes_read", "bytes_written", "link_bytes", "hits", "misses",
                           "flops", "vector_ops"):
                if getattr(ours, figure) != getattr(theirs, figure):
                    fail(f"{which} step, {_op(expected, ours.index)}: {figure}",
                         getattr(ours, figure), getattr(theirs, figure))


def assert_traffic_at_most(report: Report, limits: Mapping[str, int]) -> None:
    """The warm step moves at most ``limits[tier]`` bytes (read plus written) through each tier
    named in ``limits``, over the whole system: a budget a layout must not exceed."""
    for tier, limit in limits.items():
        if tier not in report.tier_names:
            fail(f"tier {tier!r} of the limits", f"one of {report.tier_names}", tier)
        moved = report.bytes_read[tier] + report.bytes_written[tier]
        if moved > limit:
            fail(f"warm step: bytes read and written in tier {tier!r}", f"at most {limit}",
                 moved, f"{moved - limit} B over")
