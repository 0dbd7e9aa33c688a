"""How idle the machine was while a benchmark ran, printed beside its figures.

On a virtual machine the hypervisor may run other guests on the same physical cores: the time
it takes from this guest is its *steal* (the eighth field of ``/proc/stat``'s ``cpu`` line,
``man 5 proc``). A benchmark that ran while steal was a tenth of the CPU time ran on a shared
machine, whatever the load average says, and its absolute times are slower by about that much;
its ratios against a baseline measured in the same run are what to read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")
STEAL_FIELD = 7          # user nice system idle iowait irq softirq steal ...


@dataclass(frozen=True)
class CpuTicks:
    """The machine's CPU time so far, in clock ticks: all of it, and what the hypervisor took."""

    total: int
    steal: int


def cpu_ticks() -> CpuTicks | None:
    """This machine's CPU ticks from ``/proc/stat``; None where there is no such file (not
    Linux) or it has no steal field (a kernel older than 2.6.11)."""
    try:
        fields = PROC_STAT.read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    if len(fields) <= STEAL_FIELD:
        return None
    ticks = [int(value) for value in fields]
    # guest time is counted in user time already (man 5 proc): add only the first eight
    return CpuTicks(total=sum(ticks[:STEAL_FIELD + 1]), steal=ticks[STEAL_FIELD])


class HostWatch:
    """The hypervisor's share of the CPU time over a ``with`` block, and the load average at
    its end: ``with HostWatch() as host: ...; print(host.describe())``."""

    def __init__(self) -> None:
        self.before: CpuTicks | None = None
        self.after: CpuTicks | None = None

    def __enter__(self) -> HostWatch:
        self.before = cpu_ticks()
        return self

    def __exit__(self, *exc: object) -> None:
        self.after = cpu_ticks()

    def steal_share(self) -> float | None:
        """Steal over all CPU time during the block, from 0 to 1; None if not measured."""
        if self.before is None or self.after is None:
            return None
        total = self.after.total - self.before.total
        return (self.after.steal - self.before.steal) / total if total > 0 else None

    def describe(self) -> str:
        """One line: the steal share during the block and the one-minute load average."""
        share = self.steal_share()
        steal = ("steal not measured (no /proc/stat)" if share is None else
                 f"hypervisor steal {share:.1%} of the CPU time (another guest on these cores; "
                 "0% on an idle machine)")
        load = f"load average {os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else ""
        return f"host during this run: {steal}" + (f", {load}" if load else "")
