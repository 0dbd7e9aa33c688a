"""Accelerators as data: loading, validating and overriding device files.

A device file (``devices/*.toml``, format in ``docs/device-format.md``) is parsed into a frozen
:class:`Device`. What-ifs (``with_overrides``, ``with_tier``, ``without_tier``) edit the file's
data and validate it again, so a derived device obeys the same rules as a catalog one.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

from memsim.datafile import (catalog_names, check_keys, check_what_if_path, read_catalog_entry,
                             read_toml_file, require_int, require_schema_version, require_str,
                             require_table)
from memsim.errors import ConfigError
from memsim.runtime import runtime
from memsim.formats import COMPUTE_CLASSES
from memsim.instructions import Occupancy, Pipe, default_pipes, parse_occupancy, parse_pipes
from memsim.limits import check_figure
from memsim.units import parse_quantity

TIER_KINDS = ("sram", "hbm", "lpddr", "ddr", "cxl", "nvme")
POLICIES = ("hbm-centric", "sram-resident", "hybrid", "tiered", "weight-streaming")
TOPOLOGIES = ("switch", "ring", "torus-2d", "torus-3d", "mesh", "fully-connected")
#: What a link is made of; a collective model maps each to its library's hardware rows
#: (NCCL: nvlink and infinity-fabric as NVLink, pcie as PCI, the rest as NET).
LINK_KINDS = ("nvlink", "infinity-fabric", "pcie", "ici", "neuronlink", "ipu-link", "realscale",
              "ethernet", "infiniband", "dcn")
#: Software stacks a device file's ``runtime`` may name (``vendor``: the vendor's own stack,
#: not one of the others).
RUNTIME_NAMES = ("llama.cpp-cuda", "llama.cpp-metal", "hf-eager", "gpt-fast", "vllm", "sglang",
                 "trt-llm", "neuron", "jetstream", "mlc-llm", "vendor")
#: Sustained / peak bandwidth of a tier whose file gives no ``sustained_bandwidth``, by kind;
#: each from public measurements, cited in docs/device-format.md ("Defaults").
SUSTAINED_FRACTION = MappingProxyType({
    "sram": 1.0,    # on-chip figures are taken as given: no public measured/peak ratio applies
    "hbm": 0.82,    # median of measured/peak on H100 PCIe, H200, A100, B200 (device sources)
    "lpddr": 0.80,  # STREAM triad >= 410 GB/s of 512 GB/s on Grace LPDDR5X (NVIDIA tuning guide)
    "ddr": 0.78,    # STREAM triad 74-78% of wire rate on DDR4 (TI SPRAD45A, SPRACV1B)
    "cxl": 0.75,    # 20-28 GB/s read of ~32 GB/s on PCIe5 x8 CXL expanders (MICRO 2023)
    "nvme": 0.85,   # sequential reads below the datasheet maximum for mixed reads [E]
})
#: ``tile.per_core``: the tile is a device constant, or one core's share of the resident weights.
TILE_PER_CORE = ("fixed", "resident")


@dataclass(frozen=True)
class Tier:
    """One memory tier of a chip, in base SI units.

    ``sustained_bandwidth`` is what a streaming kernel achieves; when the file gives none it is
    ``SUSTAINED_FRACTION[kind]`` x ``bandwidth`` and ``sustained_defaulted`` is True.
    """

    name: str
    kind: str
    capacity: int
    bandwidth: float
    sustained_bandwidth: float
    latency_s: float
    energy_j_per_byte: float
    granularity: int
    sustained_defaulted: bool = False   # True: sustained_bandwidth is SUSTAINED_FRACTION x peak

    @property
    def on_chip(self) -> bool:
        """True for on-chip SRAM."""
        return self.kind == "sram"


@dataclass(frozen=True)
class Layout:
    """Home tier of each kind of tensor, and the device's memory strategy."""

    policy: str
    weights: str
    kv: str
    activations: str
    spill: str | None = None


@dataclass(frozen=True)
class Link:
    """A chip-to-chip, scale-out or host link; bandwidth per direction, per chip.

    ``max_chips`` is the number of chips the link reaches: the link domain for ``[link]``, the
    whole system for ``[scale_out]``. ``kind`` is one of :data:`LINK_KINDS` (None when a file
    does not say).
    """

    bandwidth: float
    latency_s: float
    topology: str = "switch"
    max_chips: int = 1
    energy_j_per_byte: float = 0.0
    collective_latency_s: float = 0.0   # fixed start-up of one collective call
    kind: str | None = None
    ranks_per_chip: int = 1             # tensor-parallel ranks one chip runs (one per core)


@dataclass(frozen=True)
class Device:
    """One accelerator chip: compute, memory tiers from the compute outwards, layout, links.

    ``tdp_w`` and ``idle_power_w`` are one chip's thermal design power and idle power in W
    (None where the file gives none; 0 < idle <= TDP). ``link`` is the chip-to-chip fabric of
    one link domain (``link.max_chips`` chips), ``scale_out`` the network between link domains
    (None: no second level), ``host_link`` the link to the host. ``runtime`` names the software
    stack the device family usually runs (one of :data:`RUNTIME_NAMES`, or None).
    """

    name: str
    display_name: str
    vendor: str
    clock_hz: float
    cores: int
    core_name: str
    core_memory: int
    tdp_w: float | None
    usd_per_chip_hour: float | None
    compute: tuple[tuple[str, float], ...]
    vector_ops_per_s: float
    matrix_unit: tuple[int, int, int]
    tile_k: int
    tile_n: int
    tiers: tuple[Tier, ...]
    layout: Layout
    op_launch_s: float
    kernel_fixed_s: float             # a kernel's own time that streams nothing (ramp-up, drain)
    link: Link | None
    host_link: Link
    energy_j_per_flop: float
    sources: tuple[tuple[str, str], ...]
    file: str
    data: dict[str, Any] = field(repr=False, compare=False)
    idle_power_w: float | None = None
    scale_out: Link | None = None
    runtime: str | None = None
    activation_width: int = 0    # output columns one staged activation read feeds (0: matrix_unit n)
    sustained_compute: tuple[tuple[str, float], ...] = ()   # measured matmul rates, by class
    runtime_overrides: tuple[tuple[str, Any], ...] = ()  # what-ifs of the stack ("launch", "6 us")
    issue: tuple[Pipe, ...] = ()   # per-core instruction pipes ([issue]; () gives default_pipes)
    tile_per_core: str = "fixed"    # "resident": the tile is one core's share of the weights
    occupancy: Occupancy | None = None   # resident threads and blocks per core ([occupancy])

    @property
    def pipes(self) -> tuple[Pipe, ...]:
        """The file's ``[issue]`` pipes, else one issue limit at the vector FMA rate."""
        return self.issue or default_pipes(self.vector_ops_per_s, self.cores, self.clock_hz)

    def tier(self, name: str) -> Tier:
        """The tier called ``name``."""
        for tier in self.tiers:
            if tier.name == name:
                return tier
        raise ConfigError(f"no tier {name!r}; tiers are {', '.join(self.tier_names)}",
                          file=self.file, field="tiers")

    @property
    def tier_names(self) -> tuple[str, ...]:
        """Tier names from the compute outwards."""
        return tuple(t.name for t in self.tiers)

    def tier_index(self, name: str) -> int:
        """Position of the tier called ``name`` (0 is on chip)."""
        return self.tier_names.index(self.tier(name).name)

    def peak(self, compute_class: str) -> float | None:
        """Dense matrix peak in operations/s for a compute class, None when not native."""
        return dict(self.compute).get(compute_class)

    def matmul_rate(self, compute_class: str) -> float | None:
        """What a large matmul of the class achieves, operations/s: the file's
        ``sustained_compute`` (a measured maximum achievable rate) where it gives one, else the
        peak; None when the class is not native."""
        return dict(self.sustained_compute).get(compute_class, self.peak(compute_class))

    @property
    def matrix_peak(self) -> float:
        """The BF16 (else FP16) dense matrix peak, operations/s."""
        peaks = dict(self.compute)
        return peaks.get("bf16") or peaks["fp16"]

    @property
    def lowest_precision(self) -> tuple[str, float]:
        """The fastest native compute class and its peak."""
        return max(self.compute, key=lambda item: item[1])

    @property
    def main_memory(self) -> Tier:
        """The tier that holds the weights (the largest one for SRAM-resident chips)."""
        return self.tier(self.layout.weights)

    @property
    def ridge_point(self) -> float:
        """FLOP per byte above which a BF16 matmul is compute bound on the weights' tier."""
        return self.matrix_peak / self.main_memory.bandwidth

    def source(self, field_path: str) -> str | None:
        """The cited source of a figure, by dotted path."""
        return dict(self.sources).get(field_path)

    def with_overrides(self, overrides: Mapping[str, Any], *,
                       runtime_name: str | None = None) -> Device:
        """A new, validated device with fields replaced, e.g. ``{"tiers.hbm.bandwidth": "5 TB/s"}``.

        ``runtime.*`` paths are what-ifs of the software stack the device runs
        (``{"runtime.launch": "6 us"}``): kept as :attr:`runtime_overrides`, checked now against
        ``runtime_name`` (the runtime the workload names; None or ``auto``: the device's own),
        and applied to whichever runtime a workload runs under. A what-if that can change no
        figure of the device (:data:`INERT_PATHS`, a compute class no matmul runs in) is refused.
        """
        stack = {p[len("runtime."):]: v for p, v in overrides.items() if p.startswith("runtime.")}
        chip = {p: v for p, v in overrides.items() if not p.startswith("runtime.")}
        data = copy.deepcopy(self.data)
        for path, value in chip.items():
            check_what_if_path(path, file=self.file)
            if path == "cost.usd_per_chip_hour":
                value = _number_from_text(value)
            _set_path(data, path, value, file=self.file)
            data.setdefault("sources", {})[path] = f"what-if override: {value}"
        for path in chip:
            self._scale_sustained(data, path, chip)
            self._scale_sustained_compute(data, path, chip)
        new = parse_device(data, file=f"{self.file} (with overrides)") if chip else self
        for path in overrides:
            _refuse_inert(self, new, path, overrides)
        merged = {**dict(self.runtime_overrides), **stack}
        if stack:
            stack_name = (runtime_name if runtime_name not in (None, "auto")
                          else self.runtime or "vendor")
            runtime(stack_name).with_overrides(thaw(FrozenTable(merged.items())))
        return dataclasses.replace(new, runtime_overrides=tuple(
            sorted((path, freeze(value)) for path, value in merged.items())))

    def _scale_sustained(self, data: dict, path: str, overrides: Mapping[str, Any]) -> None:
        """A new peak bandwidth keeps the tier's measured sustained/peak efficiency.

        Unless the what-if sets ``sustained_bandwidth`` itself, it scales with the peak, so that
        raising a bandwidth never leaves the old sustained figure binding.
        """
        parts = path.split(".")
        if len(parts) != 3 or parts[0] != "tiers" or parts[2] != "bandwidth":
            return
        sustained_path = f"tiers.{parts[1]}.sustained_bandwidth"
        if sustained_path in overrides:
            return
        old = self.tier(parts[1])
        table = data["tiers"][_tier_position(data["tiers"], parts[1], self.file)]
        if old.sustained_defaulted:      # the default fraction applies to the new peak too
            table.pop("sustained_bandwidth", None)
            return
        if old.sustained_bandwidth == old.bandwidth:
            table["sustained_bandwidth"] = overrides[path]
            return
        new_peak = parse_quantity(overrides[path], "bandwidth", file=self.file, field=path)
        scaled = new_peak * old.sustained_bandwidth / old.bandwidth
        data["tiers"][_tier_position(data["tiers"], parts[1], self.file)][
            "sustained_bandwidth"] = f"{scaled!r} B/s"
        data["sources"][sustained_path] = (
            f"what-if: scaled with the peak override, keeping the efficiency "
            f"{old.sustained_bandwidth / old.bandwidth:.3f} of {self.source(sustained_path)}")

    def _scale_sustained_compute(self, data: dict, path: str,
                                 overrides: Mapping[str, Any]) -> None:
        """A new matrix peak keeps the class's measured achievable/peak ratio, as a new
        bandwidth keeps its tier's (unless the what-if sets ``sustained_compute.X`` itself)."""
        parts = path.split(".")
        if len(parts) != 2 or parts[0] != "compute" or parts[1] not in dict(self.sustained_compute):
            return
        sustained_path = f"sustained_compute.{parts[1]}"
        if sustained_path in overrides:
            return
        ratio = dict(self.sustained_compute)[parts[1]] / dict(self.compute)[parts[1]]
        new_peak = parse_quantity(overrides[path], "compute_rate", file=self.file, field=path)
        data["sustained_compute"][parts[1]] = f"{new_peak * ratio!r} FLOPS"
        data["sources"][sustained_path] = (
            f"what-if: scaled with the peak override, keeping the ratio {ratio:.3f} of "
            f"{self.source(sustained_path)}")

    def with_tier(self, tier: str | Mapping[str, Any], *, after: str | None = None,
                  name: str | None = None) -> Device:
        """A new device with a tier added (a template name or a tier table), outermost by default."""
        table, sources = (load_tier_template(tier) if isinstance(tier, str)
                          else (dict(tier), {}))
        if name is not None:
            table["name"] = name
        data = copy.deepcopy(self.data)
        tiers = data["tiers"]
        position = len(tiers) if after is None else _tier_position(tiers, after, self.file) + 1
        tiers.insert(position, table)
        for key, text in sources.items():
            data.setdefault("sources", {})[f"tiers.{table.get('name')}.{key}"] = text
        return parse_device(data, file=f"{self.file} (with tier {table.get('name')})")

    def without_tier(self, name: str) -> Device:
        """A new device without the tier ``name`` (the layout must not use it)."""
        data = copy.deepcopy(self.data)
        del data["tiers"][_tier_position(data["tiers"], name, self.file)]
        return parse_device(data, file=f"{self.file} (without tier {name})")


class FrozenList(tuple):
    """A list value of a what-if (``custom_allreduce_chips = [4, 8]``), hashable."""


class FrozenTable(tuple):
    """A table value of a what-if (``one_shot_max_bytes = {"2" = "1 kB"}``) as ``(key, value)``
    pairs, hashable; told apart from a list of pairs so that it is a table again when applied."""


def freeze(value: Any) -> Any:
    """A what-if value a request or a study point can hash: lists and tables frozen, each as
    itself, so that :func:`thaw` gives back what the user wrote."""
    if isinstance(value, (FrozenList, FrozenTable)):
        return value
    if isinstance(value, (list, tuple)):
        return FrozenList(freeze(v) for v in value)
    if isinstance(value, Mapping):
        return FrozenTable((str(k), freeze(v)) for k, v in value.items())
    return value


def thaw(value: Any) -> Any:
    """A frozen what-if value as the list or table it was."""
    if isinstance(value, FrozenTable):
        return {k: thaw(v) for k, v in value}
    if isinstance(value, (list, tuple)):
        return [thaw(v) for v in value]
    return value


#: Device fields no figure of memsim reads (each with what a user should set instead): a file
#: may give them, as a spec sheet does, but a what-if of one would change nothing, so it is
#: refused rather than accepted silently.
INERT_PATHS = MappingProxyType({
    "schema_version": "it is the file format's version, not a figure",
    "core_memory": "memsim stages tiles in the on-chip tier (its first tier's capacity), not in a "
                   "core's scratchpad; no figure reads core_memory",
    "matrix_unit.k": "a matmul's time pads its rows to matrix_unit.m and its activation reuse "
                     "follows matrix_unit.n; no figure reads matrix_unit.k",
    "tdp": "a step's energy is idle_power x time plus its bytes' and operations' energies; tdp "
           "only bounds idle_power (set it together with idle_power)",
    "host_link.kind": "a draft on its own device reaches the target over host_link's bandwidth "
                      "and latency; the link's kind selects nothing",
    "runtime.fusion.attention_split": "no figure reads it: a flash-decoding split's combine "
                                      "kernel is not counted (docs/runtime-format.md)",
})
#: What-ifs that count only together with another (path -> the path it serves).
_INERT_UNLESS = MappingProxyType({"tdp": "idle_power"})


def matmul_classes() -> frozenset[str]:
    """The compute classes a matmul can run in: those of the activation formats (a matmul's
    multiply-accumulate type is its activations', :mod:`memsim.precision`)."""
    from memsim.formats import get_format
    from memsim.workload import ACTIVATION_FORMATS
    return frozenset(get_format(name).compute for name in ACTIVATION_FORMATS)


def _refuse_inert(dev: Device, new: Device, path: str, overrides: Mapping[str, Any]) -> None:
    """A ConfigError for a what-if that cannot change any figure of ``new`` (``dev`` with the
    what-ifs ``overrides``)."""
    why = INERT_PATHS.get(path)
    parts = path.split(".")
    if why is None and parts[0] in ("compute", "sustained_compute") and len(parts) == 2 \
            and parts[1] != "vector" and parts[1] not in matmul_classes():
        why = (f"no matmul runs in {parts[1]}: a matmul runs in its activations' type, and "
               f"no activation format is {parts[1]} (the classes used are "
               f"{', '.join(sorted(matmul_classes()))})")
    if why is None and parts[0] == "tiers" and len(parts) == 3 and parts[2] == "kind" \
            and not new.tier(parts[1]).sustained_defaulted:
        why = (f"a tier's kind only picks its default sustained bandwidth, and tiers.{parts[1]} "
               "gives its own sustained_bandwidth")
    if why is not None and _INERT_UNLESS.get(path) not in overrides:
        raise ConfigError(f"a what-if of {path} changes nothing: {why}", file=dev.file,
                          field=path)
    if (path == "matrix_unit.n" and dev.activation_width
            and "tile.activation_width" not in overrides):
        raise ConfigError(f"a what-if of matrix_unit.n changes nothing on {dev.name}: its "
                          f"tile.activation_width ({dev.activation_width}) sets how many output "
                          "columns one staged activation read feeds; set that instead",
                          file=dev.file, field=path)


def _number_from_text(value: Any) -> Any:
    """A price given as text on the command line (``--set cost.usd_per_chip_hour=3.5``) as a number.

    Anything that is not a plain number is passed on unchanged, for the parser to reject.
    """
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _tier_position(tiers: list, name: str, file: str) -> int:
    for i, table in enumerate(tiers):
        if isinstance(table, Mapping) and table.get("name") == name:
            return i
    names = ", ".join(str(t.get("name")) for t in tiers if isinstance(t, Mapping))
    raise ConfigError(f"no tier {name!r}; tiers are {names}", file=file, field="tiers")


# Optional top-level tables that an override may create when the device has none yet: a price is
# a fact about the market, not the chip, so a what-if may add one to any device. Other missing
# tables (a [link] on a chip without a fabric) stay an error.
_OVERRIDE_CREATES = ("cost",)


def _set_path(data: dict, path: str, value: Any, *, file: str) -> None:
    """Set a dotted path in the raw device data; ``tiers.NAME.FIELD`` addresses a tier by name.

    ``cost.usd_per_chip_hour`` creates the [cost] table when the device has none.
    """
    parts = path.split(".")
    if not path or any(not p for p in parts):
        raise ConfigError("expected a dotted field path such as 'tiers.hbm.bandwidth'",
                          file=file, field=path)
    node: Any = data
    if parts[0] == "tiers":
        if len(parts) != 3:
            raise ConfigError("a tier field is written 'tiers.NAME.FIELD'", file=file, field=path)
        try:
            node = data["tiers"][_tier_position(data["tiers"], parts[1], file)]
        except ConfigError as exc:
            raise ConfigError(exc.reason, file=file, field=path) from None
        parts = parts[2:]
    for part in parts[:-1]:
        child = node.get(part) if isinstance(node, dict) else None
        if child is None and node is data and part in _OVERRIDE_CREATES:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"no table {part!r} in this device", file=file, field=path)
        node = child
    node[parts[-1]] = value


def _q(table: Mapping[str, Any], key: str, dimension: str, *, file: str, prefix: str,
       minimum_exclusive: bool = True, limit: str | None = None) -> float:
    """A figure with its unit, positive (or non-negative), within its FIGURE_RANGES range."""
    value = parse_quantity(table[key], dimension, file=file, field=prefix + key)
    if minimum_exclusive and value <= 0:
        raise ConfigError(f"must be positive, got {table[key]!r}", file=file, field=prefix + key)
    if limit is not None:
        check_figure(value, limit, file=file, field=prefix + key)
    return value


def _whole_bytes(table: Mapping[str, Any], key: str, limit: str, *, file: str,
                 prefix: str) -> int:
    """A size that must be a whole number of bytes (a granularity, a scratchpad)."""
    value = _q(table, key, "capacity", file=file, prefix=prefix, limit=limit)
    if value != int(value):
        raise ConfigError(f"expected a whole number of bytes, got {table[key]!r}", file=file,
                          field=prefix + key)
    return int(value)


_TIER_REQUIRED = ("name", "kind", "capacity", "bandwidth", "latency", "energy", "granularity")
_TIER_OPTIONAL = ("sustained_bandwidth", "note")


def _tier_prefix(table: Any, index: int) -> str:
    """``tiers.NAME.`` for a tier with a usable name, else ``tiers.INDEX.``."""
    name = table.get("name") if isinstance(table, Mapping) else None
    return f"tiers.{name}." if isinstance(name, str) and name.strip() else f"tiers.{index}."


def parse_tier(table: Mapping[str, Any], *, file: str, prefix: str) -> Tier:
    """Validate one tier table."""
    table = require_table(table, file=file, field=prefix.rstrip("."))
    check_keys(table, required=_TIER_REQUIRED, optional=_TIER_OPTIONAL, file=file, prefix=prefix)
    name = require_str(table["name"], file=file, field=prefix + "name")
    kind = require_str(table["kind"], file=file, field=prefix + "kind", choices=TIER_KINDS)
    capacity = _q(table, "capacity", "capacity", file=file, prefix=prefix, limit="capacity")
    bandwidth = _q(table, "bandwidth", "bandwidth", file=file, prefix=prefix, limit="bandwidth")
    defaulted = "sustained_bandwidth" not in table
    sustained = bandwidth * SUSTAINED_FRACTION[kind]
    if not defaulted:
        sustained = _q(table, "sustained_bandwidth", "bandwidth", file=file, prefix=prefix,
                       limit="bandwidth")
        if sustained > bandwidth:
            raise ConfigError(f"sustained bandwidth {table['sustained_bandwidth']!r} exceeds the "
                              f"peak {table['bandwidth']!r}", file=file,
                              field=prefix + "sustained_bandwidth")
    granularity = _whole_bytes(table, "granularity", "granularity", file=file, prefix=prefix)
    if granularity > capacity:
        raise ConfigError(f"capacity {table['capacity']!r} is smaller than one access of "
                          f"{table['granularity']!r} (the tier's granularity)", file=file,
                          field=prefix + "capacity")
    return Tier(
        name=name, kind=kind, capacity=int(capacity), bandwidth=bandwidth,
        sustained_bandwidth=sustained,
        latency_s=_q(table, "latency", "time", file=file, prefix=prefix, minimum_exclusive=False,
                     limit="latency"),
        energy_j_per_byte=8 * _q(table, "energy", "energy_per_bit", file=file, prefix=prefix,
                                 minimum_exclusive=False, limit="energy_per_bit"),
        granularity=granularity, sustained_defaulted=defaulted,
    )


_LINK_KEYS = {
    "host_link": (("bandwidth",), ("latency", "kind")),
    "link": (("bandwidth", "latency", "topology", "max_chips"),
             ("energy", "collective_latency", "kind", "ranks_per_chip")),
    "scale_out": (("bandwidth", "latency", "kind", "max_chips"),
                  ("energy", "collective_latency", "topology")),
}


def _parse_link(table: Any, *, file: str, name: str) -> Link:
    """Validate ``[link]`` (the chip-to-chip fabric of one link domain), ``[scale_out]`` (the
    network between link domains) or ``[host_link]``."""
    prefix = name + "."
    table = require_table(table, file=file, field=name)
    required, optional = _LINK_KEYS[name]
    check_keys(table, required=required, optional=optional, file=file, prefix=prefix)

    def time(key: str) -> float:
        return (_q(table, key, "time", file=file, prefix=prefix, minimum_exclusive=False,
                   limit="latency") if key in table else 0.0)

    bandwidth = _q(table, "bandwidth", "bandwidth", file=file, prefix=prefix, limit="bandwidth")
    kind = (require_str(table["kind"], file=file, field=prefix + "kind", choices=LINK_KINDS)
            if "kind" in table else None)
    if name == "host_link":
        return Link(bandwidth=bandwidth, latency_s=time("latency"), kind=kind)
    energy = 0.0
    if "energy" in table:
        energy = 8 * _q(table, "energy", "energy_per_bit", file=file, prefix=prefix,
                        minimum_exclusive=False, limit="energy_per_bit")
    max_chips = require_int(table["max_chips"], file=file, field=prefix + "max_chips")
    check_figure(max_chips, "chips", file=file, field=prefix + "max_chips")
    return Link(
        bandwidth=bandwidth, latency_s=time("latency"),
        topology=require_str(table.get("topology", "switch"), file=file,
                             field=prefix + "topology", choices=TOPOLOGIES),
        max_chips=max_chips, energy_j_per_byte=energy,
        collective_latency_s=time("collective_latency"), kind=kind,
        ranks_per_chip=int(check_figure(
            require_int(table.get("ranks_per_chip", 1), file=file,
                        field=prefix + "ranks_per_chip"),
            "ranks_per_chip", file=file, field=prefix + "ranks_per_chip")),
    )


_COST_FORM = "a positive number of US dollars per chip per hour, e.g. usd_per_chip_hour = 2.99"


def _parse_cost(table: Any, *, file: str) -> float:
    """Validate the optional [cost] table; the price of one chip for one hour, in US dollars."""
    table = require_table(table, file=file, field="cost")
    check_keys(table, required=("usd_per_chip_hour",), file=file, prefix="cost.")
    value = table["usd_per_chip_hour"]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"expected {_COST_FORM} (a plain number, no unit), got {value!r}",
                          file=file, field="cost.usd_per_chip_hour")
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"expected {_COST_FORM}, got {value!r}", file=file,
                          field="cost.usd_per_chip_hour")
    return float(value)


def _check_tier_order(tiers: list[Tier], raw: list, *, file: str) -> None:
    """A tier further out may not be both faster and smaller than the one inside, unless noted."""
    if tiers[0].kind != "sram":
        raise ConfigError(f"the first tier is the on-chip memory and must be of kind 'sram', "
                          f"got {tiers[0].kind!r}", file=file, field="tiers.0.kind")
    names = [t.name for t in tiers]
    for i, name in enumerate(names):
        if names.index(name) != i:
            raise ConfigError(f"tier name {name!r} used twice", file=file, field=f"tiers.{i}.name")
    for i in range(1, len(tiers)):
        inner, outer = tiers[i - 1], tiers[i]
        if (outer.bandwidth > inner.bandwidth and outer.capacity < inner.capacity
                and "note" not in raw[i]):
            raise ConfigError(f"tier {outer.name!r} is further out than {inner.name!r} but both "
                              "faster and smaller; reorder the tiers or explain in a 'note'",
                              file=file, field=f"tiers.{outer.name}")


_TOP_REQUIRED = ("schema_version", "name", "display_name", "vendor", "clock", "cores", "core_name",
                 "core_memory", "compute", "matrix_unit", "tile", "tiers", "layout", "overheads",
                 "host_link", "energy")
_TOP_OPTIONAL = ("tdp", "idle_power", "runtime", "link", "scale_out", "cost", "sustained_compute",
                 "issue", "occupancy", "sources")
TOP_LEVEL_KEYS = _TOP_REQUIRED + _TOP_OPTIONAL   # every key a device file may hold at its top


def _parse_compute(data: Mapping[str, Any], *, file: str) -> tuple[tuple[tuple[str, float], ...],
                                                                    float]:
    """The native matrix peaks and the vector rate."""
    table = require_table(data["compute"], file=file, field="compute")
    check_keys(table, required=("vector",), optional=COMPUTE_CLASSES, file=file,
               prefix="compute.")
    compute = tuple((key, _q(table, key, "compute_rate", file=file, prefix="compute.",
                             limit="compute"))
                    for key in COMPUTE_CLASSES if key in table)
    if not any(key in ("bf16", "fp16") for key, _ in compute):
        raise ConfigError("a device needs a bf16 or fp16 matrix peak", file=file,
                          field="compute.bf16")
    return compute, _q(table, "vector", "compute_rate", file=file, prefix="compute.",
                       limit="compute")


def _parse_sustained_compute(data: Mapping[str, Any], compute: tuple[tuple[str, float], ...], *,
                             file: str) -> tuple[tuple[str, float], ...]:
    """Measured matmul rates of native classes, each at most the class's peak."""
    if "sustained_compute" not in data:
        return ()
    table = require_table(data["sustained_compute"], file=file, field="sustained_compute")
    peaks = dict(compute)
    check_keys(table, required=(), optional=tuple(peaks), file=file, prefix="sustained_compute.")
    out = []
    for key in COMPUTE_CLASSES:
        if key in table:
            rate = _q(table, key, "compute_rate", file=file, prefix="sustained_compute.",
                      limit="compute")
            if rate > peaks[key]:
                raise ConfigError(f"sustained {key} rate {table[key]!r} exceeds the peak "
                                  f"{data['compute'][key]!r}", file=file,
                                  field=f"sustained_compute.{key}")
            out.append((key, rate))
    return tuple(out)


def _count(table: Mapping[str, Any], key: str, limit: str, *, file: str, prefix: str) -> int:
    """A positive integer within its range."""
    value = require_int(table[key], file=file, field=prefix + key)
    return int(check_figure(value, limit, file=file, field=prefix + key))


def _parse_layout(data: Mapping[str, Any], names: list[str], *, file: str) -> Layout:
    """Homes of weights, KV and activations, and the spill tier, which must lie further out
    than the weights' home (spilling to the on-chip tier or onto the weights' own tier would
    move nothing)."""
    table = require_table(data["layout"], file=file, field="layout")
    check_keys(table, required=("policy", "weights", "kv", "activations"), optional=("spill",),
               file=file, prefix="layout.")
    homes = {}
    for key in ("weights", "kv", "activations", "spill"):
        if key in table:
            homes[key] = require_str(table[key], file=file, field=f"layout.{key}")
            if homes[key] not in names:
                raise ConfigError(f"names tier {homes[key]!r}, which this device does not have "
                                  f"(tiers: {', '.join(names)})", file=file, field=f"layout.{key}")
    if homes["activations"] != names[0]:
        raise ConfigError(f"activations live on chip: expected {names[0]!r}", file=file,
                          field="layout.activations")
    spill = homes.get("spill")
    if spill is not None and names.index(spill) <= names.index(homes["weights"]):
        further = names[names.index(homes["weights"]) + 1:]
        raise ConfigError(f"the spill tier must lie further out than the weights' home "
                          f"{homes['weights']!r}; expected one of {', '.join(further)}"
                          if further else
                          f"the spill tier must lie further out than the weights' home "
                          f"{homes['weights']!r}, and this device has no tier beyond it",
                          file=file, field="layout.spill")
    layout = Layout(policy=require_str(table["policy"], file=file, field="layout.policy",
                                       choices=POLICIES),
                    weights=homes["weights"], kv=homes["kv"], activations=homes["activations"],
                    spill=spill)
    if (layout.policy in ("tiered", "weight-streaming") and layout.spill is None
            and names.index(names[-1]) <= names.index(layout.weights)):
        raise ConfigError(f"the {layout.policy} policy needs a slower tier to spill to: name one "
                          "in layout.spill, or add a tier further out than the weights' home",
                          file=file, field="layout.policy")
    return layout


def _parse_power(data: Mapping[str, Any], *, file: str) -> tuple[float | None, float | None]:
    """TDP and idle power, each optional; 0 < idle <= TDP."""
    tdp = idle = None
    if "tdp" in data:
        tdp = _q(data, "tdp", "power", file=file, prefix="", limit="power")
    if "idle_power" in data:
        idle = _q(data, "idle_power", "power", file=file, prefix="", limit="power")
        if tdp is not None and idle > tdp:
            raise ConfigError(f"idle power {data['idle_power']!r} exceeds the TDP "
                              f"{data['tdp']!r}", file=file, field="idle_power")
    return tdp, idle


def _parse_scale_out(data: Mapping[str, Any], link: Link | None, *, file: str) -> Link | None:
    """The optional network between link domains; it reaches at least one whole link domain."""
    if "scale_out" not in data:
        return None
    scale_out = _parse_link(data["scale_out"], file=file, name="scale_out")
    domain = link.max_chips if link is not None else 1
    if scale_out.max_chips < domain:
        raise ConfigError(f"the scale-out network reaches {scale_out.max_chips} chips, fewer "
                          f"than one link domain ({domain}); expected at least {domain}",
                          file=file, field="scale_out.max_chips")
    return scale_out


def parse_device(data: Mapping[str, Any], *, file: str) -> Device:
    """Validate a device file's data and build a Device; every mistake is a ConfigError."""
    data = require_table(data, file=file, field="(top level)")
    check_keys(data, required=_TOP_REQUIRED, optional=_TOP_OPTIONAL, file=file)
    require_schema_version(data["schema_version"], file=file)
    compute, vector = _parse_compute(data, file=file)
    unit = require_table(data["matrix_unit"], file=file, field="matrix_unit")
    check_keys(unit, required=("m", "n", "k"), file=file, prefix="matrix_unit.")
    tile = require_table(data["tile"], file=file, field="tile")
    check_keys(tile, required=("k", "n"), optional=("activation_width", "per_core"), file=file,
               prefix="tile.")

    raw_tiers = data["tiers"]
    if not isinstance(raw_tiers, list) or not raw_tiers:
        raise ConfigError("expected at least one [[tiers]] table", file=file, field="tiers")
    tiers = [parse_tier(t, file=file, prefix=_tier_prefix(t, i)) for i, t in enumerate(raw_tiers)]
    _check_tier_order(tiers, raw_tiers, file=file)
    layout = _parse_layout(data, [t.name for t in tiers], file=file)

    overheads = require_table(data["overheads"], file=file, field="overheads")
    check_keys(overheads, required=("op_launch",), optional=("kernel_fixed",), file=file,
               prefix="overheads.")
    energy = require_table(data["energy"], file=file, field="energy")
    check_keys(energy, required=("per_flop",), file=file, prefix="energy.")
    sources = require_table(data.get("sources", {}), file=file, field="sources")
    for key, text in sources.items():
        require_str(text, file=file, field=f"sources.{key}")
    tdp, idle = _parse_power(data, file=file)
    link = _parse_link(data["link"], file=file, name="link") if "link" in data else None
    return Device(
        name=require_str(data["name"], file=file, field="name"),
        display_name=require_str(data["display_name"], file=file, field="display_name"),
        vendor=require_str(data["vendor"], file=file, field="vendor"),
        clock_hz=_q(data, "clock", "frequency", file=file, prefix="", limit="clock"),
        cores=_count(data, "cores", "cores", file=file, prefix=""),
        core_name=require_str(data["core_name"], file=file, field="core_name"),
        core_memory=_whole_bytes(data, "core_memory", "core_memory", file=file, prefix=""),
        tdp_w=tdp, idle_power_w=idle,
        usd_per_chip_hour=_parse_cost(data["cost"], file=file) if "cost" in data else None,
        compute=compute, vector_ops_per_s=vector,
        sustained_compute=_parse_sustained_compute(data, compute, file=file),
        matrix_unit=tuple(_count(unit, k, "matrix_unit", file=file, prefix="matrix_unit.")
                          for k in ("m", "n", "k")),
        tile_k=_count(tile, "k", "tile", file=file, prefix="tile."),
        tile_n=_count(tile, "n", "tile", file=file, prefix="tile."),
        activation_width=(_count(tile, "activation_width", "tile", file=file, prefix="tile.")
                          if "activation_width" in tile else 0),
        tile_per_core=(require_str(tile["per_core"], file=file, field="tile.per_core",
                                   choices=TILE_PER_CORE) if "per_core" in tile else "fixed"),
        tiers=tuple(tiers),
        layout=layout,
        op_launch_s=_q(overheads, "op_launch", "time", file=file, prefix="overheads.",
                       minimum_exclusive=False, limit="latency"),
        kernel_fixed_s=(_q(overheads, "kernel_fixed", "time", file=file, prefix="overheads.",
                           minimum_exclusive=False, limit="latency")
                        if "kernel_fixed" in overheads else 0.0),
        link=link,
        scale_out=_parse_scale_out(data, link, file=file),
        host_link=_parse_link(data["host_link"], file=file, name="host_link"),
        energy_j_per_flop=_q(energy, "per_flop", "energy_per_op", file=file, prefix="energy.",
                             minimum_exclusive=False, limit="energy_per_op"),
        runtime=(require_str(data["runtime"], file=file, field="runtime", choices=RUNTIME_NAMES)
                 if "runtime" in data else None),
        sources=tuple((str(k), str(v)) for k, v in sources.items()),
        file=file,
        data=copy.deepcopy(dict(data)),
        issue=parse_pipes(data["issue"], file=file) if "issue" in data else (),
        occupancy=(parse_occupancy(data["occupancy"], file=file) if "occupancy" in data
                   else None),
    )


def load_device(path: str | Path) -> Device:
    """Load and validate a device file from disk."""
    return parse_device(read_toml_file(path), file=str(path))


def device_names() -> list[str]:
    """Names of the catalog's devices."""
    return catalog_names("memsim.devices")


def device(name: str) -> Device:
    """A catalog device by name (``h100-sxm``), or a device file by path.

    A catalog device is parsed once per process and then shared (a Device is frozen; what-ifs
    make new ones), so a second call is a dictionary lookup. A file is read on every call.
    """
    if name.endswith(".toml"):
        return load_device(name)
    return _catalog_device(name)


@lru_cache(maxsize=None)
def _catalog_device(name: str) -> Device:
    """The catalog's device ``name``, parsed on first use (unknown names are not cached)."""
    data, file = read_catalog_entry("memsim.devices", name, kind="device", folder="devices")
    return parse_device(data, file=file)


def tier_template_names() -> list[str]:
    """Names of the tier templates a what-if can add."""
    return catalog_names("memsim.devices.templates")


def load_tier_template(name: str) -> tuple[dict[str, Any], dict[str, str]]:
    """A tier template's tier table and its sources (keyed by tier field)."""
    data, file = read_catalog_entry("memsim.devices.templates", name, kind="tier template",
                                    folder="devices/templates")
    check_keys(data, required=("schema_version", "name", "description", "tier"),
               optional=("sources",), file=file)
    require_schema_version(data["schema_version"], file=file)
    table = dict(require_table(data["tier"], file=file, field="tier"))
    parse_tier(table, file=file, prefix="tier.")
    sources = {key.removeprefix("tier."): str(text)
               for key, text in dict(data.get("sources", {})).items()}
    return table, sources
