"""The landscape's comparison table, from first principles: every device at the smallest system
that holds a model, emulated, with its time, energy and cost per token."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace

from memsim.capacity import capacity_table, smallest_system
from memsim.device import Device, device_names
from memsim.emulate import emulate, run_system
from memsim.inputs import device_from
from memsim.model import Model
from memsim.plan import SystemPlan, plan_system
from memsim.units import format_quantity
from memsim.workload import Decode

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class Comparison:
    """One device's row: the configuration, what a warm decode step costs, and what bounds it."""

    device: str
    display_name: str
    fits: bool
    policy: str
    chips: int
    tp: int
    pp: int
    time_per_token_s: float | None = None
    tokens_per_s: float | None = None            # one sequence
    tokens_per_s_total: float | None = None      # the whole batch
    energy_per_token_j: float | None = None
    usd_per_chip_hour: float | None = None
    usd_per_million_tokens: float | None = None  # None where no price is known
    bottleneck: str = ""
    off_chip_weight_bytes: int | None = None     # warm step, all chips
    link_bytes: int | None = None                # warm step, all chips
    shortfall_bytes: int = 0
    note: str = ""

    def to_dict(self) -> dict:
        """Plain data."""
        return asdict(self)


def usd_per_million_tokens(usd_per_chip_hour: float, chips: int, tokens_per_s: float) -> float:
    """What a million tokens cost when ``chips`` rented chips make ``tokens_per_s`` together."""
    return usd_per_chip_hour * chips / (tokens_per_s * SECONDS_PER_HOUR) * 1e6


def compare_device(dev: Device, model: Model, workload: Decode,
                   usd_per_chip_hour: float | None = None) -> Comparison:
    """One device at its smallest configuration (its own policy unless that cannot hold it)."""
    price = usd_per_chip_hour if usd_per_chip_hour is not None else dev.usd_per_chip_hour
    table = capacity_table(dev, model, workload)
    config, system = smallest_system(dev, model, workload, table)
    own = table[0]
    fallback = ([] if own.fits or not config.fits else
                [f"its own {own.policy} policy cannot hold it ({own.reason}; short by "
                 f"{format_quantity(own.shortfall_bytes, 'capacity')})"])
    if system is None:
        return Comparison(dev.name, dev.display_name, False, config.policy, 0, 0, 0,
                          usd_per_chip_hour=price, shortfall_bytes=config.shortfall_bytes,
                          note=config.reason)
    report = run_system(system)
    spilled = [note for h in report.holdings for note in h.spilled]
    return Comparison(
        device=dev.name, display_name=dev.display_name, fits=True, policy=config.policy,
        chips=config.chips, tp=config.tp, pp=config.pp,
        time_per_token_s=report.time_per_token, tokens_per_s=report.tokens_per_s,
        tokens_per_s_total=report.tokens_per_s_total,
        energy_per_token_j=report.energy_per_token, usd_per_chip_hour=price,
        usd_per_million_tokens=(usd_per_million_tokens(price, config.chips,
                                                       report.tokens_per_s_total)
                                if price is not None else None),
        bottleneck=report.bottleneck, off_chip_weight_bytes=report.off_chip_weight_bytes,
        link_bytes=report.link_bytes,
        note="; ".join(fallback + spilled[:1] + ([f"and {len(spilled) - 1} more spills"]
                                                 if len(spilled) > 1 else [])),
    )


def compare(model: Model, workload: Decode, devices: Sequence[Device | str] | None = None,
            prices: Mapping[str, float] | None = None) -> list[Comparison]:
    """Every catalog device (or those given) at its smallest system, in catalog order."""
    prices = dict(prices or {})
    chosen = [device_from(d)
              for d in (devices if devices is not None else device_names())]
    return [compare_device(d, model, workload, prices.get(d.name)) for d in chosen]


@dataclass(frozen=True)
class SpillCost:
    """A run whose tensors live partly behind slower tiers, against the same device with a main
    memory large enough to hold everything (a hypothetical: no spill, no placement rules)."""

    main_tier: str
    time_per_token_s: float
    baseline_time_per_token_s: float
    bytes_read: dict[str, int]
    baseline_bytes_read: dict[str, int]
    baseline_capacity: int

    @property
    def slowdown(self) -> float:
        """How many times slower than the all-in-main-memory device."""
        return self.time_per_token_s / self.baseline_time_per_token_s

    def to_dict(self) -> dict:
        """Plain data."""
        return {**asdict(self), "slowdown": self.slowdown}


def _largest_chip_bytes(system: SystemPlan) -> int:
    """The most weight and KV-cache bytes one chip of any stage holds, over all its tiers: the
    main tier that holds this never spills, however unevenly the stages split the model (the
    average over the chips leaves a stage above it spilling)."""
    return max(sum(plan.bytes_by_tier("weight").values()) + sum(plan.bytes_by_tier("kv").values())
               for plan in system.stages)


def spill_cost(dev: Device, model: Model, workload: Decode) -> SpillCost:
    """Emulate ``workload`` as placed, and again with the main tier grown to hold all that the
    fullest chip holds, so that no stage of the baseline spills."""
    system = plan_system(dev, model, workload)
    main = dev.layout.weights
    capacity = max(_largest_chip_bytes(system), dev.tier(main).capacity)
    roomy = dev.with_overrides({f"tiers.{main}.capacity": f"{capacity} B"})
    baseline = emulate(roomy, model, replace(workload, placement=(), policy="auto"))
    report = run_system(system)
    return SpillCost(main_tier=main, time_per_token_s=report.time_per_token,
                     baseline_time_per_token_s=baseline.time_per_token,
                     bytes_read=dict(report.bytes_read),
                     baseline_bytes_read=dict(baseline.bytes_read),
                     baseline_capacity=roomy.tier(main).capacity)
