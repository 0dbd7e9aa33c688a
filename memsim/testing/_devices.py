"""Device data for the strategies: tier tables, devices from scratch, perturbed catalog devices.

Validity is built in rather than filtered for: capacities grow outwards (a tier further out is
never both faster and smaller), granularities fit their tiers, sustained bandwidths stay under
their peaks, and a policy gets the tiers it needs (a spill tier for ``tiered``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy

from memsim.device import (LINK_KINDS, RUNTIME_NAMES, TIER_KINDS, TOPOLOGIES, Device,
                           matmul_classes)
from memsim.formats import COMPUTE_CLASSES
from memsim.units import parse_quantity

OFF_CHIP_KINDS = tuple(kind for kind in TIER_KINDS if kind != "sram")
#: tiers beyond the on-chip one that each policy needs: a home for weights and KV off chip,
#: and for ``tiered`` a slower tier behind that home to spill to
OFF_CHIP_NEEDED = {"sram-resident": 0, "hbm-centric": 1, "hybrid": 1, "weight-streaming": 1,
                   "tiered": 2}
#: policies that home weights or the KV cache on chip, whose on-chip tier must hold them
ON_CHIP_HOMES = ("sram-resident", "weight-streaming")


def text(value: Any, unit: str) -> str:
    """A figure as file text: strings as given, numbers exactly in base units."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value} {unit}"
    return f"{float(value)!r} {unit}"


def _typical(on_chip: bool) -> dict[str, SearchStrategy[Any]]:
    if on_chip:
        return {"capacity": st.integers(2**16, 2**30),
                "bandwidth": st.integers(1, 200).map(lambda n: f"{n} TB/s"),
                "latency": st.integers(1, 500).map(lambda n: f"{n} ns"),
                "energy": st.integers(10, 5_000).map(lambda n: f"{n} fJ/bit")}
    return {"capacity": st.integers(2**30, 2**41),
            "bandwidth": st.integers(1, 10_000).map(lambda n: f"{n} GB/s"),
            "latency": st.integers(50, 100_000).map(lambda n: f"{n} ns"),
            "energy": st.integers(100, 50_000).map(lambda n: f"{n} fJ/bit")}


@st.composite
def tier_tables(draw, kind: SearchStrategy[str], name: SearchStrategy[str] | None,
                figures: dict[str, SearchStrategy[Any] | None]) -> dict[str, str]:
    """One tier table; ``figures`` maps each figure to a strategy, or None for a typical one."""
    kind = draw(kind)
    typical = _typical(kind == "sram")
    table = {"name": draw(name) if name is not None else kind, "kind": kind}
    for key, unit in (("capacity", "B"), ("bandwidth", "B/s"), ("latency", "s"),
                      ("energy", "J/bit")):
        drawn = figures[key] if figures[key] is not None else typical[key]
        table[key] = text(draw(drawn), unit)
    peak = parse_quantity(table["bandwidth"], "bandwidth", field="bandwidth")
    if figures["sustained_bandwidth"] is not None:
        table["sustained_bandwidth"] = text(draw(figures["sustained_bandwidth"]), "B/s")
    else:
        percent = draw(st.none() | st.integers(50, 100))
        if percent is not None:
            table["sustained_bandwidth"] = text(peak * percent / 100, "B/s")
    if figures["granularity"] is not None:
        table["granularity"] = text(draw(figures["granularity"]), "B")
    else:
        size = parse_quantity(table["capacity"], "capacity", field="capacity")
        table["granularity"] = text(draw(st.sampled_from(
            [g for g in (32, 1, 8, 64, 128, 256, 4096) if g <= size])), "B")
    return table


def _figure(table: dict[str, Any], key: str, dimension: str) -> float:
    return parse_quantity(table[key], dimension, field=key)


def grow_outwards(tables: Sequence[dict[str, Any]]) -> None:
    """Raise capacities (in place) so that no tier is both faster and smaller than the one
    inside it, unless its table carries a ``note`` saying why."""
    for inner, outer in zip(tables, tables[1:]):
        if "note" in outer:
            continue
        if (_figure(outer, "bandwidth", "bandwidth") > _figure(inner, "bandwidth", "bandwidth")
                and _figure(outer, "capacity", "capacity")
                < _figure(inner, "capacity", "capacity")):
            outer["capacity"] = text(int(_figure(inner, "capacity", "capacity")), "B")


@st.composite
def scratch_data(draw, *, policy: SearchStrategy[str] | None,
                 on_chip_capacity: SearchStrategy | None,
                 off_chip_tiers: SearchStrategy[int] | None,
                 cores: SearchStrategy[int]) -> dict[str, Any]:
    """A whole device file's data, drawn from scratch around a memory policy (drawn among those
    the number of tiers allows when not given)."""
    if policy is None:
        count = draw(off_chip_tiers if off_chip_tiers is not None else st.integers(0, 3))
        policy = draw(st.sampled_from([p for p, n in OFF_CHIP_NEEDED.items() if n <= count]))
    else:
        policy = draw(policy)
        if policy not in OFF_CHIP_NEEDED:
            raise InvalidArgument(f"policy must be one of {', '.join(OFF_CHIP_NEEDED)}, "
                                  f"got {policy!r}")
        count = draw(off_chip_tiers if off_chip_tiers is not None
                     else st.integers(OFF_CHIP_NEEDED[policy], 3))
    need = OFF_CHIP_NEEDED[policy]
    if count < need:
        raise InvalidArgument(f"policy {policy!r} needs at least {need} tier(s) beyond the "
                              f"on-chip one, got off_chip_tiers={count}")
    if on_chip_capacity is None and policy in ON_CHIP_HOMES:
        on_chip_capacity = st.integers(2**28, 2**36)       # room for what lives on chip
    none = dict.fromkeys(("bandwidth", "sustained_bandwidth", "latency", "energy",
                          "granularity"))
    tables = [draw(tier_tables(st.just("sram"), st.just("sram"),
                               {**none, "capacity": on_chip_capacity}))]
    outer = [draw(tier_tables(st.sampled_from(OFF_CHIP_KINDS), None,
                              {**none, "capacity": None})) for _ in range(count)]
    outer.sort(key=lambda t: _figure(t, "capacity", "capacity"))
    for i, table in enumerate(outer, start=1):
        if any(t["name"] == table["name"] for t in tables):
            table["name"] = f"{table['kind']}{i}"
        tables.append(table)
    grow_outwards(tables)
    names = [t["name"] for t in tables]
    return {
        "schema_version": 1, "name": "generated", "display_name": "generated device",
        "vendor": "memsim.testing",
        "clock": f"{draw(st.integers(300, 3000))} MHz", "cores": draw(cores),
        "core_name": "core", "core_memory": f"{draw(st.integers(16, 4096))} KiB",
        "compute": draw(_compute()),
        "matrix_unit": {axis: draw(st.sampled_from([8, 1, 16, 32, 64, 128, 256]))
                        for axis in ("m", "n", "k")},
        "tile": {axis: draw(st.sampled_from([128, 16, 32, 64, 256])) for axis in ("k", "n")},
        "tiers": tables,
        "layout": draw(_layout(policy, names)),
        "overheads": {"op_launch": f"{draw(st.integers(0, 10_000))} ns",
                      **({"kernel_fixed": f"{draw(st.integers(0, 5_000))} ns"}
                         if draw(st.booleans()) else {})},
        "host_link": {"bandwidth": f"{draw(st.integers(4, 256))} GB/s"},
        "energy": {"per_flop": f"{draw(st.integers(10, 5_000))} fJ/FLOP"},
        **draw(_optional_tables()),
    }


@st.composite
def _compute(draw) -> dict[str, str]:
    """A BF16 and/or FP16 peak, other native classes at a power-of-two multiple, a vector rate."""
    peak = draw(st.integers(100, 5_000_000))                       # GFLOPS
    halves = draw(st.sampled_from([("bf16",), ("fp16",), ("bf16", "fp16")]))
    table = {name: f"{peak} GFLOPS" for name in halves}
    others = [c for c in COMPUTE_CLASSES if c not in ("bf16", "fp16")]
    for name in draw(st.lists(st.sampled_from(others), unique=True)):
        table[name] = f"{round(peak * draw(st.sampled_from([1, 2, 4, 0.5, 0.25])))} GFLOPS"
    table["vector"] = f"{draw(st.integers(100, 200_000))} GFLOPS"
    return table


@st.composite
def _layout(draw, policy: str, names: list[str]) -> dict[str, str]:
    """Homes for the policy; a spill tier (optional where the outermost one serves) further out
    than the weights' home."""
    on_chip = policy in ON_CHIP_HOMES
    weights = names[0] if on_chip else names[1]
    layout = {"policy": policy, "weights": weights,
              "kv": names[0] if on_chip else draw(st.sampled_from(names[1:])),
              "activations": names[0]}
    further = names[names.index(weights) + 1:]
    if further:
        spill = draw(st.none() | st.sampled_from(further))
        if spill is not None:
            layout["spill"] = spill
    return layout


@st.composite
def _optional_tables(draw) -> dict[str, Any]:
    """A chip-to-chip link (with a scale-out network behind it or not), a TDP and idle power,
    a runtime and a price, each present or not."""
    tables: dict[str, Any] = {}
    if draw(st.booleans()):
        tables["link"] = {"bandwidth": f"{draw(st.integers(10, 2_000))} GB/s",
                          "latency": f"{draw(st.integers(50, 5_000))} ns",
                          "topology": draw(st.sampled_from(TOPOLOGIES)),
                          "max_chips": draw(st.integers(2, 256))}
        if draw(st.booleans()):
            tables["link"]["kind"] = draw(st.sampled_from(LINK_KINDS))
        if draw(st.booleans()):
            tables["scale_out"] = {
                "kind": draw(st.sampled_from(LINK_KINDS)),
                "bandwidth": f"{draw(st.integers(1, 200))} GB/s",
                "latency": f"{draw(st.integers(500, 20_000))} ns",
                "max_chips": tables["link"]["max_chips"] * draw(st.integers(1, 1024))}
    if draw(st.booleans()):
        tdp = draw(st.integers(10, 2_000))
        tables["tdp"] = f"{tdp} W"
        if draw(st.booleans()):
            tables["idle_power"] = f"{draw(st.integers(1, tdp))} W"
    if draw(st.booleans()):
        tables["runtime"] = draw(st.sampled_from(RUNTIME_NAMES))
    if draw(st.booleans()):
        tables["cost"] = {"usd_per_chip_hour": draw(st.integers(1, 10_000)) / 100}
    return tables


# Perturbing a device's figures --------------------------------------------------------------

_TIER_FIELDS = {"capacity": "B", "bandwidth": "B/s", "sustained_bandwidth": "B/s",
                "latency": "s", "energy": "J/bit", "granularity": "B"}


def perturbable_fields(device: Device) -> tuple[str, ...]:
    """The figures a perturbation scales by default: clock, cores, launch cost (and the kernel
    fixed time of a device that has one), energy per operation, every compute peak a matmul can
    run at (:func:`memsim.device.matmul_classes`), each tier's capacity, bandwidth, latency and
    energy, and the link's bandwidth and latency."""
    fields = ["clock", "cores", "overheads.op_launch", "energy.per_flop", "compute.vector"]
    if device.kernel_fixed_s:
        fields.append("overheads.kernel_fixed")
    fields += [f"compute.{name}" for name, _ in device.compute if name in matmul_classes()]
    for tier in device.tiers:
        fields += [f"tiers.{tier.name}.{key}" for key in ("capacity", "bandwidth", "latency",
                                                           "energy")]
    if device.link is not None:
        fields += ["link.bandwidth", "link.latency"]
    return tuple(fields)


def _current(device: Device, path: str) -> tuple[float, str]:
    """The figure at a dotted path, in base units, and the unit to write it back in."""
    simple = {"clock": (device.clock_hz, "Hz"), "cores": (device.cores, ""),
              "overheads.op_launch": (device.op_launch_s, "s"),
              "overheads.kernel_fixed": (device.kernel_fixed_s, "s"),
              "energy.per_flop": (device.energy_j_per_flop, "J/FLOP"),
              "compute.vector": (device.vector_ops_per_s, "FLOPS")}
    if device.link is not None:
        simple.update({"link.bandwidth": (device.link.bandwidth, "B/s"),
                       "link.latency": (device.link.latency_s, "s")})
    if path in simple:
        return simple[path]
    parts = path.split(".")
    if parts[0] == "compute" and len(parts) == 2 and device.peak(parts[1]) is not None:
        return device.peak(parts[1]), "FLOPS"
    if parts[0] == "tiers" and len(parts) == 3 and parts[2] in _TIER_FIELDS \
            and parts[1] in device.tier_names:
        tier = device.tier(parts[1])
        value = {"capacity": tier.capacity, "bandwidth": tier.bandwidth,
                 "sustained_bandwidth": tier.sustained_bandwidth, "latency": tier.latency_s,
                 "energy": tier.energy_j_per_byte / 8, "granularity": tier.granularity}[parts[2]]
        return value, _TIER_FIELDS[parts[2]]
    raise InvalidArgument(f"cannot perturb {path!r} of {device.name}; fields are "
                          f"{', '.join(perturbable_fields(device))} (and a tier's "
                          f"sustained_bandwidth or granularity)")


@st.composite
def perturbed_overrides(draw, device: Device, fields: Sequence[str], scale: float,
                        fixed: dict[str, Any]) -> dict[str, Any]:
    """Overrides that scale each of ``fields`` by a factor in [1/scale, scale] (or leave it),
    plus the ``fixed`` ones, repaired so that the device they make is valid."""
    if not scale >= 1:
        raise InvalidArgument(f"scale must be at least 1, got {scale!r}")
    entries: dict[str, Any] = {}
    for path in fields if scale > 1 else ():
        value, unit = _current(device, path)
        exponent = draw(st.integers(-100, 100))          # shrinks to 0: the figure unchanged
        if exponent == 0 or path in fixed:
            continue
        new = value * scale ** (exponent / 100)
        if unit in ("", "B"):                                  # counts and byte sizes
            entries[path] = max(1, round(new)) if unit == "" else text(max(1, round(new)), "B")
        else:
            entries[path] = text(float(f"{new:.4g}"), unit)       # readable when it fails
    entries.update(fixed)
    _repair(device, entries)
    return entries


def _repair(device: Device, entries: dict[str, Any]) -> None:
    """Keep granularities within capacities, sustained bandwidths within peaks, and capacities
    growing outwards where a bandwidth rose, by adjusting ``entries`` in place."""
    tables = []
    for raw, tier in zip(device.data["tiers"], device.tiers):
        table = {key: entries.get(f"tiers.{tier.name}.{key}", raw.get(key))
                 for key in ("capacity", "bandwidth", "sustained_bandwidth", "granularity")}
        if "note" in raw:
            table["note"] = raw["note"]
        grain = _figure(table, "granularity", "capacity")
        if _figure(table, "capacity", "capacity") < grain:
            table["capacity"] = entries[f"tiers.{tier.name}.capacity"] = text(int(grain), "B")
        sustained = f"tiers.{tier.name}.sustained_bandwidth"
        if sustained in entries and (_figure(table, "sustained_bandwidth", "bandwidth")
                                     > _figure(table, "bandwidth", "bandwidth")):
            entries[sustained] = table["bandwidth"]
        tables.append(table)
    before = [t["capacity"] for t in tables]
    grow_outwards(tables)
    for tier, table, old in zip(device.tiers, tables, before):
        if table["capacity"] != old:
            entries[f"tiers.{tier.name}.capacity"] = table["capacity"]
