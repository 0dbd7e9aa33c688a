"""One mistake in an otherwise valid device file, and the field the loader must name for it.

Each mutation changes one thing in a copy of valid device data and returns the dotted field a
:class:`memsim.ConfigError` must name; the strategies draw a valid device, then one mutation
that applies to it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from hypothesis import reject
from hypothesis import strategies as st

from memsim.device import Device, parse_device
from memsim.testing._devices import OFF_CHIP_KINDS, text


class InvalidDevice(NamedTuple):
    """Device data with one mistake: the loader must raise a ConfigError naming ``field``."""

    data: dict[str, Any]
    field: str
    mistake: str


@dataclass(frozen=True)
class Mutation:
    mistake: str
    apply: Callable[[Any, dict[str, Any], Device], str]
    applies: Callable[[Device], bool] = lambda dev: True


_TOP_REQUIRED = ("schema_version", "name", "display_name", "vendor", "clock", "cores",
                 "core_name", "core_memory", "compute", "matrix_unit", "tile", "tiers", "layout",
                 "overheads", "host_link", "energy")
_TIER_REQUIRED = ("name", "kind", "capacity", "bandwidth", "latency", "energy", "granularity")


def _tier(draw, data: dict[str, Any], first: int = 0) -> tuple[dict[str, Any], int]:
    i = draw(st.integers(first, len(data["tiers"]) - 1))
    return data["tiers"][i], i


def _missing_key(draw, data, dev):
    key = draw(st.sampled_from(_TOP_REQUIRED))
    del data[key]
    return key


def _unknown_key(draw, data, dev):
    key = draw(st.sampled_from(["bandwith", "clock_hz", "cache", "notes"]))
    data[key] = "1"
    return key


def _schema_version(draw, data, dev):
    data["schema_version"] = draw(st.sampled_from([2, 0, "1", True, 1.0]))
    return "schema_version"


def _tier_figure(draw, data, dev):
    """A tier figure in the wrong dimension, malformed, negative or zero where it must be
    positive."""
    table, _ = _tier(draw, data)
    key, value = draw(st.sampled_from([
        ("capacity", "3.35 TB/s"), ("capacity", "0 B"), ("capacity", "eighty"),
        ("bandwidth", "80 GB"), ("bandwidth", "0 B/s"), ("bandwidth", "-1 GB/s"),
        ("latency", "1 GHz"), ("latency", "-5 ns"), ("energy", "1 W"), ("granularity", "32"),
        ("granularity", "0 B")]))
    table[key] = value
    return f"tiers.{table['name']}.{key}"


def _device_figure(draw, data, dev):
    """A device-level figure in the wrong dimension, malformed or non-positive."""
    path, value = draw(st.sampled_from([
        ("clock", "80 GB"), ("clock", "fast"), ("clock", "0 Hz"), ("core_memory", "1 GHz"),
        ("overheads.op_launch", "2 GB"), ("overheads.kernel_fixed", "-1 us"),
        ("energy.per_flop", "0.7 pJ/bit"),
        ("compute.vector", "3 TB/s"), ("compute.vector", "0 FLOPS")]))
    table, key = (data, path) if "." not in path else (data[path.split(".")[0]],
                                                        path.split(".")[1])
    table[key] = value
    return path


def _sustained_above_peak(draw, data, dev):
    table, i = _tier(draw, data)
    table["sustained_bandwidth"] = text(2 * dev.tiers[i].bandwidth, "B/s")
    return f"tiers.{table['name']}.sustained_bandwidth"


def _capacity_below_granularity(draw, data, dev):
    """A tier smaller than one access: the capacity is blamed, not the granularity."""
    i = draw(st.sampled_from([i for i, t in enumerate(dev.tiers) if t.granularity > 1]))
    table = data["tiers"][i]
    table["capacity"] = text(dev.tiers[i].granularity - 1, "B")
    return f"tiers.{table['name']}.capacity"


def _fractional_bytes(draw, data, dev):
    """A granularity or scratchpad that is not a whole number of bytes."""
    if draw(st.booleans()):
        data["core_memory"] = draw(st.sampled_from(["0.5 B", "2.5 B", "0.9 B"]))
        return "core_memory"
    table, _ = _tier(draw, data)
    table["granularity"] = draw(st.sampled_from(["0.5 B", "0.9 B", "1.5 B"]))
    return f"tiers.{table['name']}.granularity"


def _figure_out_of_range(draw, data, dev):
    """A well-formed figure outside its documented physical range (docs/limits.md)."""
    path, value = draw(st.sampled_from([
        ("clock", "1e-30 Hz"), ("clock", "1 THz"), ("compute.vector", "1e-300 FLOPS"),
        ("compute.vector", "1e30 FLOPS"), ("energy.per_flop", "1e300 J/FLOP"),
        ("overheads.op_launch", "1e300 s"), ("overheads.op_launch", "1 h"), ("tdp", "0 W"),
        ("tdp", "1 GW"), ("core_memory", "1 TB"), ("cores", 9223372036854775807),
        ("cores", 99999999999999999999), ("tile.n", 2**40), ("matrix_unit.m", 10**6)]))
    table, key = (data, path) if "." not in path else (data[path.split(".")[0]],
                                                        path.split(".")[1])
    table[key] = value
    return path


def _tier_figure_out_of_range(draw, data, dev):
    table, _ = _tier(draw, data)
    key, value = draw(st.sampled_from([
        ("capacity", "2 EB"), ("capacity", "1e10 GB"), ("capacity", "9.3 EB"),
        ("bandwidth", "1e308 B/s"), ("bandwidth", "1 B/s"), ("latency", "1e300 s"),
        ("latency", "1 s"), ("energy", "1 J/bit"), ("granularity", "1 GB")]))
    table.pop("sustained_bandwidth", None)
    table[key] = value
    return f"tiers.{table['name']}.{key}"


def _tier_name_not_text(draw, data, dev):
    """A tier ``name`` that is not a string is reported at the tier's position."""
    i = draw(st.integers(0, len(data["tiers"]) - 1))
    data["tiers"][i]["name"] = draw(st.sampled_from([7, True, "", 1.5]))
    return f"tiers.{i}.name"


def _spill_inward(draw, data, dev):
    """``layout.spill`` naming the on-chip tier or the weights' own tier."""
    names = dev.tier_names
    inward = names[:names.index(dev.layout.weights) + 1]
    data["layout"]["spill"] = draw(st.sampled_from(inward))
    return "layout.spill"


def _idle_power(draw, data, dev):
    """Idle power of zero, above the TDP, or of the wrong dimension."""
    data["tdp"] = "100 W"
    data["idle_power"] = draw(st.sampled_from(["0 W", "101 W", "1 kW", "50 J", "50"]))
    return "idle_power"


def _runtime(draw, data, dev):
    data["runtime"] = draw(st.sampled_from(["vLLM", "tensorrt", "", 3, "llama.cpp"]))
    return "runtime"


def _link_kind(draw, data, dev):
    data["link"]["kind"] = draw(st.sampled_from(["NVLink", "nvlink4", "", 5]))
    return "link.kind"


def _scale_out(draw, data, dev):
    """A scale-out network that is malformed or smaller than one link domain."""
    table = {"kind": "infiniband", "bandwidth": "50 GB/s", "latency": "2.7 us",
             "max_chips": 1024}
    key, value = draw(st.sampled_from([
        ("kind", "myrinet"), ("bandwidth", "400 Gb"), ("latency", "1e300 s"), ("max_chips", 0),
        ("max_chips", 2**40), ("topology", "hypercube"), ("kind", None), ("bandwith", "1 GB/s")]))
    if value is None:
        del table[key]
    else:
        table[key] = value
    data["scale_out"] = table
    return f"scale_out.{key}"


def _scale_out_below_domain(draw, data, dev):
    data["scale_out"] = {"kind": "ethernet", "bandwidth": "10 GB/s", "latency": "3 us",
                         "max_chips": dev.link.max_chips - 1}
    return "scale_out.max_chips"


def _first_tier_off_chip(draw, data, dev):
    data["tiers"][0]["kind"] = draw(st.sampled_from(OFF_CHIP_KINDS))
    return "tiers.0.kind"


def _duplicate_tier_name(draw, data, dev):
    table, i = _tier(draw, data, first=1)
    table["name"] = data["tiers"][draw(st.integers(0, i - 1))]["name"]
    return f"tiers.{i}.name"


def _faster_and_smaller(draw, data, dev):
    """A tier further out both faster and smaller than the one inside it, with no note."""
    i = draw(st.sampled_from([i for i in range(1, len(dev.tiers)) if _can_shrink(data, dev, i)]))
    table, inner = data["tiers"][i], dev.tiers[i - 1]
    table.pop("sustained_bandwidth", None)
    table.update(capacity=text(inner.capacity - 1, "B"), granularity="1 B",
                 bandwidth=text(2 * inner.bandwidth, "B/s"))
    return f"tiers.{table['name']}"


def _can_shrink(data, dev, i):
    return "note" not in data["tiers"][i] and dev.tiers[i - 1].capacity >= 2


def _tier_kind(draw, data, dev):
    table, _ = _tier(draw, data)
    table["kind"] = draw(st.sampled_from(["sdram", "HBM", "l2"]))
    return f"tiers.{table['name']}.kind"


def _tier_unknown_key(draw, data, dev):
    table, _ = _tier(draw, data)
    table["bandwith"] = "1 GB/s"
    return f"tiers.{table['name']}.bandwith"


def _tier_missing_key(draw, data, dev):
    table, i = _tier(draw, data)
    key = draw(st.sampled_from(_TIER_REQUIRED))
    where = i if key == "name" else table["name"]        # a tier without a name by position
    del table[key]
    return f"tiers.{where}.{key}"


def _no_tiers(draw, data, dev):
    data["tiers"] = draw(st.sampled_from([[], {"name": "sram"}, "sram"]))
    return "tiers"


def _layout_tier(draw, data, dev):
    key = draw(st.sampled_from(["weights", "kv", "activations", "spill"]))
    data["layout"][key] = "nowhere"
    return f"layout.{key}"


def _activations_off_chip(draw, data, dev):
    data["layout"]["activations"] = data["tiers"][draw(
        st.integers(1, len(data["tiers"]) - 1))]["name"]
    return "layout.activations"


def _policy(draw, data, dev):
    data["layout"]["policy"] = draw(st.sampled_from(["streaming", "HBM-centric", ""]))
    return "layout.policy"


def _no_half_precision(draw, data, dev):
    data["compute"].pop("bf16", None)
    data["compute"].pop("fp16", None)
    return "compute.bf16"


def _compute_class(draw, data, dev):
    name = draw(st.sampled_from(["fp2", "int2", "bfloat16"]))
    data["compute"][name] = "1 TFLOPS"
    return f"compute.{name}"


def _missing_vector(draw, data, dev):
    del data["compute"]["vector"]
    return "compute.vector"


def _count(draw, data, dev):
    path = draw(st.sampled_from(["cores", "matrix_unit.m", "matrix_unit.n", "matrix_unit.k",
                                 "tile.k", "tile.n"]))
    value = draw(st.sampled_from([0, -1, 1.5, "8", True]))
    table, key = (data, path) if "." not in path else (data[path.split(".")[0]],
                                                        path.split(".")[1])
    table[key] = value
    return path


def _link(draw, data, dev):
    key, value = draw(st.sampled_from([("topology", "hypercube"), ("max_chips", 0),
                                       ("bandwidth", "1 GHz")]))
    data["link"][key] = value
    return f"link.{key}"


def _cost(draw, data, dev):
    data["cost"] = {"usd_per_chip_hour": draw(st.sampled_from([-1, 0, "12 USD",
                                                                float("nan"), True]))}
    return "cost.usd_per_chip_hour"


def _source(draw, data, dev):
    data.setdefault("sources", {})["clock"] = draw(st.sampled_from([5, "", None]))
    return "sources.clock"


def _host_link(draw, data, dev):
    del data["host_link"]["bandwidth"]
    return "host_link.bandwidth"


def _not_a_table(draw, data, dev):
    key = draw(st.sampled_from(["compute", "layout", "overheads", "energy", "host_link"]))
    data[key] = "hbm"
    return key


MUTATIONS = (
    Mutation("a required key is missing", _missing_key),
    Mutation("an unknown key", _unknown_key),
    Mutation("an unsupported schema_version", _schema_version),
    Mutation("a tier figure of the wrong form", _tier_figure),
    Mutation("a device figure of the wrong form", _device_figure),
    Mutation("a sustained bandwidth above the peak", _sustained_above_peak),
    Mutation("a tier smaller than one access", _capacity_below_granularity,
             lambda dev: any(t.granularity > 1 for t in dev.tiers)),
    Mutation("a size that is not a whole number of bytes", _fractional_bytes),
    Mutation("a device figure outside its physical range", _figure_out_of_range),
    Mutation("a tier figure outside its physical range", _tier_figure_out_of_range),
    Mutation("a tier name that is not text", _tier_name_not_text),
    Mutation("a spill tier that is not further out than the weights", _spill_inward),
    Mutation("an idle power that is zero, above the TDP or not a power", _idle_power),
    Mutation("an unknown runtime", _runtime),
    Mutation("an unknown link kind", _link_kind, lambda dev: dev.link is not None),
    Mutation("a bad scale-out network", _scale_out),
    Mutation("a scale-out network smaller than one link domain", _scale_out_below_domain,
             lambda dev: dev.link is not None and dev.link.max_chips > 1),
    Mutation("the first tier is not on chip", _first_tier_off_chip),
    Mutation("two tiers share a name", _duplicate_tier_name,
              lambda dev: len(dev.tiers) > 1),
    Mutation("a tier further out is faster and smaller", _faster_and_smaller,
              lambda dev: any(_can_shrink(dev.data, dev, i) for i in range(1, len(dev.tiers)))),
    Mutation("an unknown tier kind", _tier_kind),
    Mutation("an unknown tier key", _tier_unknown_key),
    Mutation("a tier key is missing", _tier_missing_key),
    Mutation("no tiers", _no_tiers),
    Mutation("the layout names a tier the device lacks", _layout_tier),
    Mutation("activations homed off chip", _activations_off_chip,
              lambda dev: len(dev.tiers) > 1),
    Mutation("an unknown policy", _policy),
    Mutation("no bf16 or fp16 peak", _no_half_precision),
    Mutation("an unknown compute class", _compute_class),
    Mutation("no vector rate", _missing_vector),
    Mutation("a count that is not a positive integer", _count),
    Mutation("a bad link figure", _link, lambda dev: dev.link is not None),
    Mutation("a price that is not a positive number", _cost),
    Mutation("a source that is not text", _source),
    Mutation("no host link bandwidth", _host_link),
    Mutation("a table that is not a table", _not_a_table),
)


@st.composite
def invalid_device_data(draw, valid: st.SearchStrategy[dict[str, Any]],
                        mutations: tuple[Mutation, ...] = MUTATIONS) -> InvalidDevice:
    """Valid data from ``valid`` with one of ``mutations`` that applies to it."""
    data = copy.deepcopy(draw(valid))
    dev = parse_device(data, file="valid")
    applicable = [m for m in mutations if m.applies(dev)]
    if not applicable:
        reject()
    mutation = draw(st.sampled_from(applicable))
    field = mutation.apply(draw, data, dev)
    return InvalidDevice(data=data, field=field, mistake=mutation.mistake)
