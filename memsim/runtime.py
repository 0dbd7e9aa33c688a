"""Software stacks as data: runtime profiles, and the time of a collective as its library runs it.

A runtime file (``runtimes/*.toml``, format in ``docs/runtime-format.md``) describes one software
stack (llama.cpp, vLLM, TensorRT-LLM, ...): whether a decode step replays as a captured graph,
what one kernel launch and one graph replay cost on the host, how the stack fuses a layer's
kernels, its host time per step, its collective library and custom all-reduce, and its
speculative-decoding bookkeeping. A file holds no device names: a stack's figures are the same
on every chip it runs on. It is parsed into a frozen :class:`Runtime`; what-ifs
(:meth:`Runtime.with_overrides`) edit the file's data and validate it again.

A collective library file (``runtimes/collectives/*.toml``) holds the library's own time model:
NCCL's and RCCL's tuning tables (base latency per algorithm and protocol, latency per step per
link kind, bandwidth factor per protocol) or a simple ring model. :func:`collective_time` costs
one collective call the way the library's tuner does: every (algorithm, protocol) it would
consider, plus the runtime's custom all-reduce where it applies, and the least time wins::

    >>> t = collective_time(runtime("vllm"), "all_reduce", 16384, 8, "nvlink", 450e9, 0.5e-6, 7)
    >>> t.algorithm, t.protocol
    ('one-shot', 'custom')
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memsim.datafile import (catalog_names, check_keys, check_what_if_path, file_stamp,
                             read_catalog_entry, read_toml_file, require_bool, require_int,
                             require_str, require_table)
from memsim.derive import figure_paths, resolve_base
from memsim.errors import ConfigError
from memsim.gemmtile import GemmTile, parse_gemm_tiles
from memsim.handoff import Pipeline, pipeline_of
from memsim.instructions import InstructionMix, parse_mixes
from memsim.units import format_quantity, parse_quantity

__all__ = ["Runtime", "Fusion", "Collective", "CustomAllReduce", "Speculative",
           "CollectiveLibrary", "CollectiveTime", "runtime", "load_runtime", "parse_runtime",
           "runtime_names", "collective_library", "collective_library_names", "collective_time",
           "collective_candidates", "describe", "LINK_KINDS", "COLLECTIVE_KINDS", "LIBRARIES"]

LIBRARIES = ("nccl", "rccl", "xla", "neuron", "none")
ALGORITHMS = ("auto", "ring", "tree")
ATTENTION_SPLITS = ("flash-decoding", "none")
LINK_KINDS = ("nvlink", "pcie", "infinity-fabric", "ici", "ethernet", "infiniband", "other")
COLLECTIVE_KINDS = ("all_reduce", "all_gather", "all_to_all")
PROTOCOLS = ("ll", "ll128", "simple")
TUNED_ALGORITHMS = ("ring", "tree")
HW_ROWS = ("nvlink", "pci", "net")

# NCCL costs a path by its kind: NVLink (RCCL reports xGMI as NVLink), the network between nodes,
# and every other intra-node path as PCI (tuning.cc: typeIntra == LINK_NVL ? NVLINK : PCI).
_HW_ROW = {"nvlink": "nvlink", "infinity-fabric": "nvlink", "pcie": "pci", "ici": "pci",
           "other": "pci", "ethernet": "net", "infiniband": "net"}
_NETWORK_LINKS = ("ethernet", "infiniband")


# --- the runtime -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Fusion:
    """How the stack launches one transformer layer's kernels.

    ``extra_kernels_per_layer`` counts elementwise kernels that neither memsim's op list nor the
    flags below name (RoPE, SiLU*mul, casts, copies, activation quantization).
    """

    fused_qkv: bool
    fused_gate_up: bool
    fused_norm_residual: bool
    fused_moe: bool
    fused_attention_prologue: bool
    extra_kernels_per_layer: int
    attention_split: str

    @property
    def dense_layer_launches(self) -> int:
        """Kernel launches of one dense decoder layer (collectives excluded).

        Two norms, Q/K/V projections (1 fused or 3), the KV-cache append (folded into attention
        when ``fused_attention_prologue``), attention, the output projection, gate and up (1 or
        2), down, two residual adds unless fused into the norms, and the extra kernels. A
        flash-decoding split's combine kernel is not counted: it depends on the context length.
        """
        return (2 + (1 if self.fused_qkv else 3) + (0 if self.fused_attention_prologue else 1)
                + 1 + 1 + (1 if self.fused_gate_up else 2) + 1
                + (0 if self.fused_norm_residual else 2) + self.extra_kernels_per_layer)


@dataclass(frozen=True)
class CustomAllReduce:
    """A stack's own all-reduce kernels (vLLM, SGLang, TensorRT-LLM): one-shot and two-shot.

    One-shot: every chip reads the whole buffer from every peer and reduces it, after one
    barrier. Two-shot: a reduce-scatter then an all-gather, each chip moving ``2 (n-1)/n`` of it.
    """

    max_bytes: int
    chips: tuple[int, ...]
    links: tuple[str, ...]
    one_shot_max_bytes: tuple[tuple[int, int], ...]   # (up to this many chips, below this size)
    one_shot_latency_s: float
    two_shot_latency_s: float
    efficiency: float                                 # achieved fraction of the link bandwidth

    def serves(self, chips: int, link_kind: str, message_bytes: int) -> bool:
        """True when the stack runs this all-reduce with its own kernels."""
        return chips in self.chips and link_kind in self.links and message_bytes < self.max_bytes

    def one_shot(self, chips: int, message_bytes: int) -> bool:
        """True when the stack's rule picks the one-shot kernel for this size."""
        for limit_chips, limit_bytes in self.one_shot_max_bytes:
            if chips <= limit_chips:
                return message_bytes < limit_bytes
        return False


@dataclass(frozen=True)
class Collective:
    """The stack's collective library and algorithm choice, and its custom all-reduce if any."""

    library: str
    algorithm: str
    custom_allreduce: CustomAllReduce | None


@dataclass(frozen=True)
class Speculative:
    """Host and launch bookkeeping of speculative decoding beyond the models' own kernels, s."""

    draft_step_host_s: float
    iteration_host_s: float


@dataclass(frozen=True)
class Runtime:
    """One software stack, in base SI units; see ``docs/runtime-format.md`` for each field."""

    name: str
    description: str
    graph: bool
    launch_s: float
    graph_launch_s: float
    host_per_step_s: float
    host_overlap: bool
    fusion: Fusion
    collective: Collective
    speculative: Speculative
    sources: tuple[tuple[str, str], ...]
    file: str
    data: dict[str, Any] = field(repr=False, compare=False, hash=False)
    small_batch_gemv: bool = False    # small-M matmuls run as GEMVs on the vector units
    gemv_max_rows: int = 1            # ... of at most this many activation rows (else a GEMM)
    pipeline: Pipeline = Pipeline()   # pipeline hand-offs and graphs (memsim.handoff)
    gemv: tuple[tuple[str, InstructionMix], ...] = ()   # GEMV instructions per weight, by format
    gemm: tuple[tuple[str, GemmTile], ...] = ()   # a format's GEMM CTA tile rows and split-K
    base: str | None = None           # the catalog runtime this file derives from (memsim.derive)
    dropped: tuple[str, ...] = ()     # figures of the base this version has not

    def graphed(self, stages: int) -> bool:
        """True when a step of ``stages`` pipeline stages replays a captured graph."""
        return self.graph and (stages == 1 or self.pipeline.graph)

    def source(self, field_path: str) -> str | None:
        """The cited source of a figure, by dotted path (``"launch"``, ``"fusion.fused_qkv"``)."""
        return dict(self.sources).get(field_path)

    def with_overrides(self, overrides: Mapping[str, Any]) -> Runtime:
        """A new, validated runtime with fields replaced, e.g. ``{"launch": "6 us"}``.

        Keys are the file's dotted paths (``"graph"``, ``"fusion.extra_kernels_per_layer"``,
        ``"collective.algorithm"``). Text from the command line is read as the field's type:
        ``"true"``/``"false"`` for a flag, digits for a count.
        """
        data = copy.deepcopy(self.data)
        for path, value in overrides.items():
            check_what_if_path(path, file=self.file)
            current = _get_path(data, path)
            if current is None and "." not in path:      # an optional key the file omits:
                current = getattr(self, path, None)       # typed as its default
            value = _typed_text(current, value)
            _set_path(data, path, value, file=self.file)
            data.setdefault("sources", {})[path] = f"what-if override: {value}"
        return _build(data, file=f"{self.file} (with overrides)", base=self.base,
                      dropped=tuple(p for p in self.dropped if p not in overrides))


def _typed_text(old: Any, value: Any) -> Any:
    """Command-line text for a flag or a count, as a flag or a count; anything else unchanged."""
    if not isinstance(value, str):
        return value
    text = value.strip().lower()
    if isinstance(old, bool) and text in ("true", "false"):
        return text == "true"
    if isinstance(old, int) and not isinstance(old, bool) and text.isdigit():
        return int(text)
    return value


def _get_path(data: Mapping[str, Any], path: str) -> Any:
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _set_path(data: dict, path: str, value: Any, *, file: str) -> None:
    """Set a dotted path in the raw runtime data."""
    parts = path.split(".")
    if not path or any(not p for p in parts):
        raise ConfigError("expected a dotted field path such as 'launch' or "
                          "'fusion.fused_qkv'", file=file, field=path)
    node: Any = data
    for part in parts[:-1]:
        child = node.get(part) if isinstance(node, dict) else None
        if not isinstance(child, dict):
            raise ConfigError(f"no table {part!r} in this runtime", file=file, field=path)
        node = child
    node[parts[-1]] = value


# --- parsing -------------------------------------------------------------------------------------

_TOP_REQUIRED = ("schema_version", "name", "description", "graph", "launch", "graph_launch",
                 "host_per_step", "host_overlap", "fusion", "collective", "speculative")
_TOP_OPTIONAL = ("sources", "small_batch_gemv", "gemv_max_rows", "pipeline", "gemv", "gemm")
_FUSION_KEYS = ("fused_qkv", "fused_gate_up", "fused_norm_residual", "fused_moe",
                "extra_kernels_per_layer", "attention_split")
_CUSTOM_KEYS = ("custom_allreduce_max_bytes", "custom_allreduce_chips", "custom_allreduce_links",
                "one_shot_max_bytes", "one_shot_latency", "two_shot_latency",
                "custom_allreduce_efficiency")


def _time(table: Mapping[str, Any], key: str, *, file: str, prefix: str) -> float:
    return parse_quantity(table[key], "time", file=file, field=prefix + key)


def _ratio(value: Any, *, file: str, field: str, positive: bool = False) -> float:
    number = parse_quantity(value, "ratio", file=file, field=field)
    if number > 1 or (positive and number <= 0):
        raise ConfigError(f"expected a fraction {'in (0, 1]' if positive else 'in [0, 1]'}, "
                          f"got {value!r}", file=file, field=field)
    return number


def _parse_fusion(table: Any, *, file: str) -> Fusion:
    table = require_table(table, file=file, field="fusion")
    check_keys(table, required=_FUSION_KEYS, optional=("fused_attention_prologue",), file=file,
               prefix="fusion.")
    flags = {key: require_bool(table[key], file=file, field=f"fusion.{key}")
             for key in ("fused_qkv", "fused_gate_up", "fused_norm_residual", "fused_moe")}
    return Fusion(
        **flags,
        fused_attention_prologue=require_bool(table.get("fused_attention_prologue", False),
                                              file=file, field="fusion.fused_attention_prologue"),
        extra_kernels_per_layer=require_int(table["extra_kernels_per_layer"], file=file,
                                            field="fusion.extra_kernels_per_layer", minimum=0),
        attention_split=require_str(table["attention_split"], file=file,
                                    field="fusion.attention_split", choices=ATTENTION_SPLITS))


def _parse_custom(table: Mapping[str, Any], *, file: str) -> CustomAllReduce | None:
    present = [key for key in _CUSTOM_KEYS if key in table]
    if not present:
        return None
    for key in _CUSTOM_KEYS:
        if key not in table:
            raise ConfigError(f"a custom all-reduce needs all of {', '.join(_CUSTOM_KEYS)}",
                              file=file, field=f"collective.{key}")
    prefix = "collective."
    chips = table["custom_allreduce_chips"]
    if not isinstance(chips, list) or not chips:
        raise ConfigError("expected a list of chip counts such as [2, 4, 6, 8]", file=file,
                          field=prefix + "custom_allreduce_chips")
    links = table["custom_allreduce_links"]
    if not isinstance(links, list) or not links:
        raise ConfigError(f"expected a list of link kinds from {', '.join(LINK_KINDS)}",
                          file=file, field=prefix + "custom_allreduce_links")
    one_shot = require_table(table["one_shot_max_bytes"], file=file,
                             field=prefix + "one_shot_max_bytes")
    limits = []
    for key, value in one_shot.items():
        where = f"{prefix}one_shot_max_bytes.{key}"
        if not str(key).isdigit() or int(key) < 2:
            raise ConfigError("keys are chip counts (at least 2), such as \"8\"", file=file,
                              field=where)
        limits.append((int(key), int(parse_quantity(value, "capacity", file=file, field=where))))
    return CustomAllReduce(
        max_bytes=int(parse_quantity(table["custom_allreduce_max_bytes"], "capacity", file=file,
                                     field=prefix + "custom_allreduce_max_bytes")),
        chips=tuple(require_int(c, file=file, field=prefix + "custom_allreduce_chips", minimum=2)
                    for c in chips),
        links=tuple(require_str(k, file=file, field=prefix + "custom_allreduce_links",
                                choices=LINK_KINDS) for k in links),
        one_shot_max_bytes=tuple(sorted(limits)),
        one_shot_latency_s=_time(table, "one_shot_latency", file=file, prefix=prefix),
        two_shot_latency_s=_time(table, "two_shot_latency", file=file, prefix=prefix),
        efficiency=_ratio(table["custom_allreduce_efficiency"], file=file,
                          field=prefix + "custom_allreduce_efficiency", positive=True))


def _parse_collective(table: Any, *, file: str) -> Collective:
    table = require_table(table, file=file, field="collective")
    check_keys(table, required=("library", "algorithm"), optional=_CUSTOM_KEYS, file=file,
               prefix="collective.")
    library = require_str(table["library"], file=file, field="collective.library",
                          choices=LIBRARIES)
    algorithm = require_str(table["algorithm"], file=file, field="collective.algorithm",
                            choices=ALGORITHMS)
    custom = _parse_custom(table, file=file)
    if custom is not None and library not in ("nccl", "rccl"):
        raise ConfigError("a custom all-reduce replaces NCCL/RCCL calls; the library must be "
                          "nccl or rccl", file=file, field="collective.custom_allreduce_max_bytes")
    return Collective(library=library, algorithm=algorithm, custom_allreduce=custom)


def _parse_speculative(table: Any, *, file: str) -> Speculative:
    table = require_table(table, file=file, field="speculative")
    check_keys(table, required=("draft_step_host", "iteration_host"), file=file,
               prefix="speculative.")
    return Speculative(
        draft_step_host_s=_time(table, "draft_step_host", file=file, prefix="speculative."),
        iteration_host_s=_time(table, "iteration_host", file=file, prefix="speculative."))


def parse_runtime(data: Mapping[str, Any], *, file: str) -> Runtime:
    """Validate a runtime file's data and build a Runtime; every mistake is a ConfigError.

    A file with ``base`` is merged with that catalog runtime first (:mod:`memsim.derive`) and
    the merged data validated as a whole file.
    """
    derived = resolve_base(data, file=file)
    return _build(derived.data, file=file, base=derived.base, dropped=derived.dropped)


def _build(data: Mapping[str, Any], *, file: str, base: str | None,
           dropped: tuple[str, ...]) -> Runtime:
    """Validate a whole runtime's data (a derived file's merged with its base's)."""
    data = require_table(data, file=file, field="(top level)")
    check_keys(data, required=_TOP_REQUIRED, optional=_TOP_OPTIONAL, file=file)
    if data["schema_version"] != 1:
        raise ConfigError(f"unsupported schema_version {data['schema_version']!r}; expected 1",
                          file=file, field="schema_version")
    sources = require_table(data.get("sources", {}), file=file, field="sources")
    for key, text in sources.items():
        require_str(text, file=file, field=f"sources.{key}")
    return Runtime(
        name=require_str(data["name"], file=file, field="name"),
        description=require_str(data["description"], file=file, field="description"),
        graph=require_bool(data["graph"], file=file, field="graph"),
        launch_s=_time(data, "launch", file=file, prefix=""),
        graph_launch_s=_time(data, "graph_launch", file=file, prefix=""),
        host_per_step_s=_time(data, "host_per_step", file=file, prefix=""),
        host_overlap=require_bool(data["host_overlap"], file=file, field="host_overlap"),
        fusion=_parse_fusion(data["fusion"], file=file),
        collective=_parse_collective(data["collective"], file=file),
        speculative=_parse_speculative(data["speculative"], file=file),
        sources=tuple((str(k), str(v)) for k, v in sources.items()),
        file=file,
        data=copy.deepcopy(dict(data)),
        small_batch_gemv=require_bool(data.get("small_batch_gemv", False), file=file,
                                      field="small_batch_gemv"),
        gemv_max_rows=require_int(data.get("gemv_max_rows", 1), file=file,
                                  field="gemv_max_rows"),
        pipeline=pipeline_of(data, file=file),
        gemv=parse_mixes(data["gemv"], file=file) if "gemv" in data else (),
        gemm=parse_gemm_tiles(data["gemm"], file=file) if "gemm" in data else (),
        base=base,
        dropped=dropped,
    )


def load_runtime(path: str | Path) -> Runtime:
    """Load and validate a runtime file from disk."""
    return parse_runtime(read_toml_file(path), file=str(path))


def runtime_names() -> list[str]:
    """Names of the catalog's runtimes (for validating a device's default ``runtime``)."""
    return catalog_names("memsim.runtimes")


@functools.lru_cache(maxsize=None)
def _catalog_runtime(name: str) -> Runtime:
    data, file = read_catalog_entry("memsim.runtimes", name, kind="runtime", folder="runtimes")
    return parse_runtime(data, file=file)


def runtime(name: str) -> Runtime:
    """A catalog runtime by name (``vllm``), parsed once per process, or a runtime file by path
    (``.toml``), parsed again when the file changes."""
    if name.endswith(".toml"):
        return _file_runtime(name, file_stamp(name))
    return _catalog_runtime(name)


@functools.lru_cache(maxsize=32)
def _file_runtime(path: str, stamp: tuple[int, int, int] | None) -> Runtime:
    """The runtime file at ``path``; ``stamp`` (:func:`memsim.datafile.file_stamp`) keys the
    cache only."""
    return load_runtime(path)


# --- collective libraries ---------------------------------------------------------------------

@dataclass(frozen=True)
class MscclAlgorithm:
    """One of RCCL's MSCCL all-reduce algorithms: the message sizes its file takes and its time,
    ``latency_s + 2 (n-1)/n x bytes / (link bandwidth x efficiency)`` (each chip sends its
    shares to every peer, then the reduced shares back: two all-pairs exchanges)."""

    name: str
    protocol: str
    min_bytes: int
    max_bytes: int
    latency_s: float
    efficiency: float


@dataclass(frozen=True)
class CollectiveLibrary:
    """A collective library's time model, in base SI units.

    ``model`` is ``"tuning-table"`` (NCCL, RCCL: tables keyed ``"ALGO.PROTO"`` and
    ``"ROW.ALGO.PROTO"``) or ``"simple"`` (a ring over the topology's hops).
    """

    name: str
    description: str
    model: str
    base_latency_s: tuple[tuple[str, float], ...]
    hw_latency_s: tuple[tuple[str, float], ...]
    bandwidth_factor: tuple[tuple[str, float], ...]       # "intra.ring.ll", "network.tree.simple"
    ll_max_bandwidth: tuple[tuple[str, float], ...]       # by GPU generation, bytes/s
    ll_max_bandwidth_network: tuple[tuple[str, float], ...]   # "two_nodes", "more_nodes"
    tree_correction: tuple[tuple[str, tuple[float, ...]], ...]
    ring_network_row: str
    ll128_rows: tuple[str, ...]
    net_overhead_s: float         # a network post's floor on an intra-node ring step (multi-node)
    simple_latency_s: float
    simple_efficiency: float
    sources: tuple[tuple[str, str], ...]
    file: str
    data: dict[str, Any] = field(repr=False, compare=False, hash=False)
    small_batch_gemv: bool = False    # small-M matmuls run as GEMVs on the vector units
    msccl: tuple[MscclAlgorithm, ...] = ()   # RCCL's MSCCL all-reduces, by size
    msccl_chips: int = 0                     # ... on this many chips
    msccl_link: str = ""                     # ... of one domain of this link kind


def _algo_proto_table(table: Any, *, file: str, field: str, dimension: str) -> dict[str, float]:
    """``{ring = {ll=..., ll128=..., simple=...}, tree = {...}}`` as ``{"ring.ll": value}``."""
    table = require_table(table, file=file, field=field)
    check_keys(table, required=TUNED_ALGORITHMS, file=file, prefix=field + ".")
    out = {}
    for algo in TUNED_ALGORITHMS:
        row = require_table(table[algo], file=file, field=f"{field}.{algo}")
        check_keys(row, required=PROTOCOLS, file=file, prefix=f"{field}.{algo}.")
        for proto in PROTOCOLS:
            where = f"{field}.{algo}.{proto}"
            out[f"{algo}.{proto}"] = (
                _ratio(row[proto], file=file, field=where) if dimension == "ratio"
                else parse_quantity(row[proto], dimension, file=file, field=where))
    return out


def _bandwidths(table: Any, *, file: str, field: str) -> tuple[tuple[str, float], ...]:
    table = require_table(table, file=file, field=field)
    return tuple((str(k), parse_quantity(v, "bandwidth", file=file, field=f"{field}.{k}"))
                 for k, v in table.items())


def _corrections(table: Any, *, file: str) -> tuple[tuple[str, tuple[float, ...]], ...]:
    table = require_table(table, file=file, field="tree_correction")
    check_keys(table, required=(), optional=PROTOCOLS, file=file, prefix="tree_correction.")
    out = []
    for proto, values in table.items():
        if not isinstance(values, list):
            raise ConfigError("expected a list of factors, one per power of two from 64 B",
                              file=file, field=f"tree_correction.{proto}")
        out.append((proto, tuple(_ratio(v, file=file, field=f"tree_correction.{proto}")
                                 for v in values)))
    return tuple(out)


def _parse_msccl(table: Any, *, file: str) -> tuple[tuple[MscclAlgorithm, ...], int, str]:
    """``[msccl]``: the chips and link its algorithms run on, and one table per algorithm."""
    table = require_table(table, file=file, field="msccl")
    algorithms = [key for key in table if key not in ("chips", "link")]
    check_keys(table, required=("chips", "link"), optional=algorithms, file=file,
               prefix="msccl.")
    out = []
    for name in algorithms:
        where = f"msccl.{name}"
        row = require_table(table[name], file=file, field=where)
        check_keys(row, required=("protocol", "min_size", "max_size", "latency", "efficiency"),
                   file=file, prefix=where + ".")
        low, high = (int(parse_quantity(row[key], "capacity", file=file, field=f"{where}.{key}"))
                     for key in ("min_size", "max_size"))
        if high < max(low, 1):
            raise ConfigError(f"expected a max_size of at least min_size and 1 B, got "
                              f"{row['max_size']!r}", file=file, field=f"{where}.max_size")
        out.append(MscclAlgorithm(
            name=name, protocol=require_str(row["protocol"], file=file,
                                            field=f"{where}.protocol", choices=PROTOCOLS),
            min_bytes=low, max_bytes=high,
            latency_s=_time(row, "latency", file=file, prefix=where + "."),
            efficiency=_ratio(row["efficiency"], file=file, field=f"{where}.efficiency",
                              positive=True)))
    return (tuple(sorted(out, key=lambda a: a.min_bytes)),
            require_int(table["chips"], file=file, field="msccl.chips", minimum=2),
            require_str(table["link"], file=file, field="msccl.link", choices=LINK_KINDS))


_TUNED_REQUIRED = ("base_latency", "hw_latency", "bandwidth_factor", "repository", "commit",
                   "file", "version", "ring_network_row", "ll128_rows")
_TUNED_OPTIONAL = ("ll_max_bandwidth", "ll_max_bandwidth_network", "tree_correction",
                   "net_overhead", "msccl")


def parse_collective_library(data: Mapping[str, Any], *, file: str) -> CollectiveLibrary:
    """Validate a collective library file and build its time model."""
    data = require_table(data, file=file, field="(top level)")
    head = ("schema_version", "name", "description", "model")
    model = require_str(data.get("model"), file=file, field="model",
                        choices=("tuning-table", "simple"))
    if model == "simple":
        check_keys(data, required=head + ("base_latency", "bandwidth_efficiency"),
                   optional=("sources",), file=file)
    else:
        check_keys(data, required=head + _TUNED_REQUIRED, optional=_TUNED_OPTIONAL + ("sources",),
                   file=file)
    if data["schema_version"] != 1:
        raise ConfigError(f"unsupported schema_version {data['schema_version']!r}; expected 1",
                          file=file, field="schema_version")
    sources = require_table(data.get("sources", {}), file=file, field="sources")
    common = dict(name=require_str(data["name"], file=file, field="name"),
                  description=require_str(data["description"], file=file, field="description"),
                  model=model, sources=tuple((str(k), str(v)) for k, v in sources.items()),
                  file=file, data=copy.deepcopy(dict(data)))
    if model == "simple":
        return CollectiveLibrary(
            **common, base_latency_s=(), hw_latency_s=(), bandwidth_factor=(),
            ll_max_bandwidth=(), ll_max_bandwidth_network=(), tree_correction=(),
            ring_network_row="ring", ll128_rows=(), net_overhead_s=0.0,
            simple_latency_s=_time(data, "base_latency", file=file, prefix=""),
            simple_efficiency=_ratio(data["bandwidth_efficiency"], file=file,
                                     field="bandwidth_efficiency", positive=True))
    hw = require_table(data["hw_latency"], file=file, field="hw_latency")
    check_keys(hw, required=HW_ROWS, file=file, prefix="hw_latency.")
    factors = require_table(data["bandwidth_factor"], file=file, field="bandwidth_factor")
    check_keys(factors, required=("intra", "network"), file=file, prefix="bandwidth_factor.")
    msccl, msccl_chips, msccl_link = (_parse_msccl(data["msccl"], file=file) if "msccl" in data
                                      else ((), 0, ""))
    rows = data["ll128_rows"]
    if not isinstance(rows, list):
        raise ConfigError(f"expected a list of rows from {', '.join(HW_ROWS)}", file=file,
                          field="ll128_rows")
    return CollectiveLibrary(
        **common,
        base_latency_s=tuple(_algo_proto_table(data["base_latency"], file=file,
                                               field="base_latency", dimension="time").items()),
        hw_latency_s=tuple((f"{row}.{key}", value) for row in HW_ROWS for key, value in
                           _algo_proto_table(hw[row], file=file, field=f"hw_latency.{row}",
                                             dimension="time").items()),
        bandwidth_factor=tuple((f"{level}.{key}", value) for level in ("intra", "network")
                               for key, value in _algo_proto_table(
                                   factors[level], file=file, field=f"bandwidth_factor.{level}",
                                   dimension="ratio").items()),
        ll_max_bandwidth=_bandwidths(data.get("ll_max_bandwidth", {}), file=file,
                                     field="ll_max_bandwidth"),
        ll_max_bandwidth_network=_bandwidths(data.get("ll_max_bandwidth_network", {}), file=file,
                                             field="ll_max_bandwidth_network"),
        tree_correction=_corrections(data.get("tree_correction", {}), file=file),
        ring_network_row=require_str(data["ring_network_row"], file=file,
                                     field="ring_network_row", choices=TUNED_ALGORITHMS),
        ll128_rows=tuple(require_str(r, file=file, field="ll128_rows", choices=HW_ROWS)
                         for r in rows),
        net_overhead_s=_time(data, "net_overhead", file=file, prefix="") if "net_overhead" in data
        else 0.0,
        simple_latency_s=0.0, simple_efficiency=1.0,
        msccl=msccl, msccl_chips=msccl_chips, msccl_link=msccl_link)


def collective_library_names() -> list[str]:
    """Names of the shipped collective library models."""
    return catalog_names("memsim.runtimes.collectives")


@functools.lru_cache(maxsize=None)
def collective_library(name: str) -> CollectiveLibrary:
    """A shipped collective library model by name (``nccl``), parsed once per process."""
    data, file = read_catalog_entry("memsim.runtimes.collectives", name,
                                    kind="collective library", folder="runtimes/collectives")
    return parse_collective_library(data, file=file)


# --- the time of one collective -------------------------------------------------------------

@dataclass(frozen=True)
class CollectiveTime:
    """The time of one collective call and how the library runs it.

    ``seconds = latency_s + bandwidth_s``. ``algorithm`` is ``ring``, ``tree``, ``p2p``
    (all-to-all as grouped sends), ``direct`` (all-to-all in the simple model), ``one-shot`` or
    ``two-shot`` (a custom all-reduce: protocol ``custom``, ``library`` the stack's name),
    ``allpairs`` (RCCL's MSCCL all-reduce), or ``none`` for a call on one chip.
    """

    seconds: float
    protocol: str
    algorithm: str
    bandwidth_s: float
    latency_s: float
    library: str

    def to_dict(self) -> dict[str, Any]:
        """Plain data for reports."""
        return {"seconds": self.seconds, "protocol": self.protocol, "algorithm": self.algorithm,
                "bandwidth_s": self.bandwidth_s, "latency_s": self.latency_s,
                "library": self.library}


def _candidate(library: str, algorithm: str, protocol: str, latency_s: float,
               bandwidth_s: float) -> CollectiveTime:
    return CollectiveTime(seconds=latency_s + bandwidth_s, protocol=protocol,
                          algorithm=algorithm, bandwidth_s=bandwidth_s, latency_s=latency_s,
                          library=library)


def collective_time(runtime: Runtime, kind: str, message_bytes: int, chips: int, link_kind: str,
                    link_bandwidth_bytes_per_s: float, link_latency_s: float, hops: int, *,
                    generation: str | None = None, chips_per_node: int = 1,
                    intra_link_kind: str = "nvlink",
                    intra_link_latency_s: float = 0.0) -> CollectiveTime:
    """The time of one collective call as the runtime's library runs it.

    Parameters
    ----------
    runtime
        The stack; its ``collective`` table names the library (``nccl`` becomes ``rccl`` on AMD
        GPUs, whose node link is ``infinity-fabric``, whatever link the call crosses: RCCL is
        NCCL's API on ROCm), the algorithm choice and its custom all-reduce.
    kind
        ``"all_reduce"``, ``"all_gather"`` or ``"all_to_all"``.
    message_bytes
        The buffer each chip holds: the reduced buffer (all-reduce), the gathered output
        (all-gather, as NCCL counts it), or the whole send buffer (all-to-all).
    chips
        Chips taking part. On a network link (``infiniband``, ``ethernet``) each is its own node;
        on any other link all are in one node.
    link_kind
        One of :data:`LINK_KINDS`; it picks NCCL's latency row (``nvlink`` and
        ``infinity-fabric``: NVLink; ``pcie``, ``ici``, ``other``: PCI; network: NET).
    link_bandwidth_bytes_per_s, link_latency_s, hops
        The link per chip per direction, its latency per hop, and the hops one pass of a
        bandwidth-optimal collective waits for in sequence. A tuned library's step costs its
        table's latency, or the link's when that is larger; ``hops`` counts only in the simple
        model (NCCL's ring has its own step count).
    generation
        NCCL's GPU generation (``volta``, ``ampere``, ``hopper``, ``blackwell``) for its LL
        bandwidth cap on one node; ``None`` applies no cap.
    chips_per_node, intra_link_kind, intra_link_latency_s
        On a network link: the chips of one node (its link domain) and the link between them.
        A tuned library then costs both levels as NCCL's tuner does: a ring's steps inside a
        node at the node's latency and its ``2 (nodes - 1)`` network steps at the network's; a
        tree ``2 ((chips / nodes - 1) intra + log2(nodes) network)`` steps. With one chip per
        node (the default) every step crosses the network.

    Returns
    -------
    CollectiveTime
        The least of :func:`collective_candidates`: the time never falls as the message grows.
    """
    return min(collective_candidates(runtime, kind, message_bytes, chips, link_kind,
                                     link_bandwidth_bytes_per_s, link_latency_s, hops,
                                     generation=generation, chips_per_node=chips_per_node,
                                     intra_link_kind=intra_link_kind,
                                     intra_link_latency_s=intra_link_latency_s),
               key=lambda c: c.seconds)


def collective_candidates(runtime: Runtime, kind: str, message_bytes: int, chips: int,
                          link_kind: str, link_bandwidth_bytes_per_s: float,
                          link_latency_s: float, hops: int, *,
                          generation: str | None = None, chips_per_node: int = 1,
                          intra_link_kind: str = "nvlink",
                          intra_link_latency_s: float = 0.0) -> tuple[CollectiveTime, ...]:
    """Every way the library (and the stack's custom all-reduce) could run this call, timed.

    The (algorithm, protocol) pairs the library's tuner considers for this link, and the
    custom one-shot (where the stack's size rule allows it) and two-shot kernels where the
    stack has them and the message fits; where no custom kernel takes an all-reduce, the
    library's MSCCL all-pairs algorithm for this size on its domain (RCCL on 8 chips of one
    Infinity Fabric domain), which RCCL runs without asking its tuner. Arguments as
    :func:`collective_time`.
    """
    _check_call(kind, message_bytes, chips, link_kind, link_bandwidth_bytes_per_s,
                link_latency_s, hops)
    name = _library_name(runtime, link_kind, intra_link_kind)
    if chips == 1 or message_bytes == 0:
        return (_candidate(name, "none", "none", 0.0, 0.0),)
    library = collective_library(name)
    if library.model == "simple":
        candidates = [_simple_time(library, kind, message_bytes, chips,
                                   link_bandwidth_bytes_per_s, link_latency_s, hops)]
    elif kind == "all_to_all":
        candidates = [_p2p_time(library, message_bytes, chips, link_kind,
                                link_bandwidth_bytes_per_s, link_latency_s)]
    else:
        nodes = (-(-chips // chips_per_node) if link_kind in _NETWORK_LINKS else 1)
        intra = _Intra(_HW_ROW[intra_link_kind], intra_link_latency_s, chips // max(nodes, 1))
        candidates = _tuned_times(library, runtime.collective.algorithm, kind, message_bytes,
                                  chips, link_kind, link_bandwidth_bytes_per_s, link_latency_s,
                                  generation, nodes, intra)
    custom = runtime.collective.custom_allreduce
    if kind == "all_reduce" and custom is not None and custom.serves(chips, link_kind,
                                                                     message_bytes):
        candidates += _custom_times(custom, runtime.name, message_bytes, chips,
                                    link_bandwidth_bytes_per_s)
    elif (kind == "all_reduce" and chips == library.msccl_chips
          and link_kind == library.msccl_link):
        candidates += _msccl_time(library, message_bytes, chips, link_bandwidth_bytes_per_s)
    return tuple(candidates)


def _library_name(runtime: Runtime, link_kind: str, intra_link_kind: str) -> str:
    """The library that runs the call: the stack's, with ``nccl`` run as ``rccl`` on AMD GPUs.

    A stack loads its library by the GPU platform it is built for, not by the link a call
    crosses (vLLM's ``find_nccl_library``: ``libnccl.so.2`` under CUDA, ``librccl.so.1`` under
    ROCm), so a call between MI300X nodes still runs RCCL's tuner. The GPU shows in its node's
    own link, ``infinity-fabric`` (xGMI) being AMD's: ``intra_link_kind`` for a call over the
    network, ``link_kind`` for any other."""
    node_link = intra_link_kind if link_kind in _NETWORK_LINKS else link_kind
    name = runtime.collective.library
    return "rccl" if name == "nccl" and node_link == "infinity-fabric" else name


def _check_call(kind: str, message_bytes: int, chips: int, link_kind: str, bandwidth: float,
                latency_s: float, hops: int) -> None:
    """The planner's arguments; a wrong one is a programming error, not a user's."""
    if kind not in COLLECTIVE_KINDS:
        raise ValueError(f"unknown collective {kind!r}; expected one of "
                         f"{', '.join(COLLECTIVE_KINDS)}")
    if link_kind not in LINK_KINDS:
        raise ValueError(f"unknown link kind {link_kind!r}; expected one of "
                         f"{', '.join(LINK_KINDS)}")
    if isinstance(message_bytes, bool) or not isinstance(message_bytes, int) or message_bytes < 0:
        raise ValueError(f"message_bytes must be a non-negative int, got {message_bytes!r}")
    if isinstance(chips, bool) or not isinstance(chips, int) or chips < 1:
        raise ValueError(f"chips must be a positive int, got {chips!r}")
    if not bandwidth > 0 or not math.isfinite(bandwidth):
        raise ValueError(f"link bandwidth must be positive, got {bandwidth!r}")
    if not latency_s >= 0 or not math.isfinite(latency_s) or hops < 0:
        raise ValueError(f"link latency and hops must be non-negative, got {latency_s!r}, {hops!r}")


def _steps(kind: str, chips: int) -> int:
    """Ring steps of one call (NCCL's nsteps): 2 (n-1) for all-reduce, n-1 for all-gather."""
    return 2 * (chips - 1) if kind == "all_reduce" else chips - 1


@dataclass(frozen=True)
class _Intra:
    """The node-level link of a multi-node call: its latency row, latency and chips per node."""

    row: str
    latency_s: float
    chips: int


def _tuned_times(library: CollectiveLibrary, algorithm: str, kind: str, message_bytes: int,
                 chips: int, link_kind: str, bandwidth: float, link_latency_s: float,
                 generation: str | None, nodes: int, intra: _Intra) -> list[CollectiveTime]:
    """NCCL's cost table: every enabled (algorithm, protocol), as ncclTopoTuneModel builds it.

    On a network link with ``nodes`` nodes of ``intra.chips`` chips: a ring's network steps are
    ``2 (nodes - 1)`` for all-reduce (``nodes - 1`` otherwise), at the network's ring latency
    (NCCL takes the tree row only with one rank per node), and its other steps run inside a
    node, each at least a network post (``net_overhead``, x3 for Simple); a tree climbs
    ``intra.chips - 1`` node steps and ``log2(nodes)`` network steps each way.
    """
    network = link_kind in _NETWORK_LINKS
    row = _HW_ROW[link_kind]
    level = "network" if network else "intra"
    factors, base = dict(library.bandwidth_factor), dict(library.base_latency_s)
    hw = dict(library.hw_latency_s)
    cap = _ll_cap(library, network, nodes if network else chips, generation)
    algorithms = ("ring", "tree") if kind == "all_reduce" else ("ring",)
    if algorithm in algorithms:
        algorithms = (algorithm,)
    out = []
    for algo in algorithms:
        for proto in PROTOCOLS:
            factor = factors[f"{level}.{algo}.{proto}"]
            if factor <= 0 or (proto == "ll128" and row not in library.ll128_rows):
                continue
            bus = bandwidth * factor
            if proto == "ll" and cap is not None:
                bus = min(bus, cap)
            if algo == "ring":
                steps = _steps(kind, chips)
                algo_bw = bus * chips / steps
                step_row = library.ring_network_row if network else "ring"
                step_s = max(hw[f"{row}.{step_row}.{proto}"], link_latency_s)
                latency = base[f"ring.{proto}"] + steps * step_s
                if network and nodes < chips:
                    inter = _steps(kind, nodes)
                    post = library.net_overhead_s * (3 if proto == "simple" else 1)
                    intra_s = max(hw[f"{intra.row}.ring.{proto}"], intra.latency_s, post)
                    inter_s = max(hw[f"{row}.ring.{proto}"], link_latency_s)   # ppn > 1
                    latency = base[f"ring.{proto}"] + (steps - inter) * intra_s + inter * inter_s
            else:
                algo_bw = bus * 0.5
                step_s = max(hw[f"{row}.tree.{proto}"], link_latency_s)
                depth = 2 * int(math.log2(chips)) if network else 2 * (chips - 1)
                latency = base[f"tree.{proto}"] + depth * step_s
                if network and nodes < chips:
                    intra_s = max(hw[f"{intra.row}.tree.{proto}"], intra.latency_s)
                    latency = (base[f"tree.{proto}"] + 2 * (intra.chips - 1) * intra_s
                               + 2 * int(math.log2(nodes)) * step_s)
            corrections = dict(library.tree_correction).get(proto, ()) if algo == "tree" else ()
            bandwidth_s = _bandwidth_time(message_bytes, algo_bw, corrections)
            if bandwidth_s is not None:
                out.append(_candidate(library.name, algo, proto, latency, bandwidth_s))
    return out


def _ll_cap(library: CollectiveLibrary, network: bool, chips: int,
            generation: str | None) -> float | None:
    """NCCL's absolute cap on the LL protocol's bus bandwidth (llMaxBws), bytes/s, or None."""
    if network:
        caps = dict(library.ll_max_bandwidth_network)
        return caps.get("two_nodes" if chips <= 2 else "more_nodes")
    if generation is None or not library.ll_max_bandwidth:
        return None
    caps = dict(library.ll_max_bandwidth)
    if generation not in caps:
        raise ConfigError(f"unknown GPU generation {generation!r} for {library.name}; expected "
                          f"one of {', '.join(caps)}", file=library.file, field="generation")
    return caps[generation]


def _bucket(size: int) -> int:
    """NCCL's correction bucket: log2(bytes / 64), -1 below 64 B."""
    return (size >> 6).bit_length() - 1


def _bandwidth_time(message_bytes: int, algo_bw: float,
                    corrections: tuple[float, ...]) -> float | None:
    """Bandwidth time of a candidate whose bandwidth the library corrects per power-of-two bucket.

    The corrected time falls where a factor rises with size; the least over this size and the
    first size of every larger bucket keeps a candidate's time monotone in size. ``None`` when
    the library disables the candidate at this size (a factor of 0).
    """
    def corrected(size: int) -> float | None:
        bucket = _bucket(size)
        factor = corrections[bucket] if 0 <= bucket < len(corrections) else 1.0
        return None if factor <= 0 else size / (algo_bw * factor)

    here = corrected(message_bytes)
    if here is None or not corrections:
        return here
    larger = (corrected(64 << b) for b in range(_bucket(message_bytes) + 1, len(corrections) + 1))
    return min([here] + [t for t in larger if t is not None])


def _p2p_time(library: CollectiveLibrary, message_bytes: int, chips: int, link_kind: str,
              bandwidth: float, link_latency_s: float) -> CollectiveTime:
    """An all-to-all as NCCL runs it: one group of sends and receives to every peer at once.

    NCCL's tuner has no all-to-all entry; the call is priced as one ring step of the Simple
    protocol (base latency plus one step) moving ``(n-1)/n`` of the buffer at the Simple rate.
    """
    row = _HW_ROW[link_kind]
    level = "network" if link_kind in _NETWORK_LINKS else "intra"
    latency = (dict(library.base_latency_s)["ring.simple"]
               + max(dict(library.hw_latency_s)[f"{row}.ring.simple"], link_latency_s))
    rate = bandwidth * dict(library.bandwidth_factor)[f"{level}.ring.simple"]
    return _candidate(library.name, "p2p", "simple", latency,
                      (chips - 1) * message_bytes / chips / rate)


def _simple_time(library: CollectiveLibrary, kind: str, message_bytes: int, chips: int,
                 bandwidth: float, link_latency_s: float, hops: int) -> CollectiveTime:
    """A bandwidth-optimal ring over the topology: per pass ``hops`` link latencies in sequence;
    all-reduce is two passes (reduce-scatter, all-gather), the others one."""
    passes = 2 if kind == "all_reduce" else 1
    latency = library.simple_latency_s + passes * hops * link_latency_s
    traffic = passes * (chips - 1) * message_bytes / chips
    algorithm = "direct" if kind == "all_to_all" else "ring"
    return _candidate(library.name, algorithm, "simple", latency,
                      traffic / (bandwidth * library.simple_efficiency))


def _msccl_time(library: CollectiveLibrary, message_bytes: int, chips: int,
                bandwidth: float) -> list[CollectiveTime]:
    """RCCL's MSCCL all-pairs all-reduce for this size (algorithm ``allpairs``), or none above
    its last algorithm's range.

    RCCL takes the algorithm whose range holds the size; the least over it and the first size of
    every later range keeps the candidate's time monotone in size (as the tuner's corrected
    candidates are kept), a later range being cheaper only where the fitted lines cross.
    """
    timed = []
    for algo in library.msccl:
        if message_bytes <= algo.max_bytes:
            size = max(message_bytes, algo.min_bytes)
            bandwidth_s = 2 * (chips - 1) * size / chips / (bandwidth * algo.efficiency)
            timed.append(_candidate(library.name, "allpairs", algo.protocol, algo.latency_s,
                                    bandwidth_s))
    return [min(timed, key=lambda c: c.seconds)] if timed else []


def _custom_times(custom: CustomAllReduce, stack: str, message_bytes: int, chips: int,
                  bandwidth: float) -> list[CollectiveTime]:
    """The stack's one-shot (where its size rule allows) and two-shot all-reduce kernels; their
    ``library`` is the stack's name."""
    rate = bandwidth * custom.efficiency
    out = [_candidate(stack, "two-shot", "custom", custom.two_shot_latency_s,
                      2 * (chips - 1) * message_bytes / chips / rate)]
    if custom.one_shot(chips, message_bytes):
        out.append(_candidate(stack, "one-shot", "custom", custom.one_shot_latency_s,
                              (chips - 1) * message_bytes / rate))
    return out


# --- description for `memsim show --runtime` -----------------------------------------------

_LIBRARY_ORIGIN = ("model", "repository", "commit", "file", "version")
_NOT_FIGURES = ("sources", "schema_version", "name", "description") + _LIBRARY_ORIGIN


def _source_of(path: str, sources: Mapping[str, str]) -> str | None:
    """The source of a figure: its own entry, else the nearest enclosing table's."""
    parts = path.split(".")
    while parts:
        found = sources.get(".".join(parts))
        if found is not None:
            return found
        parts.pop()
    return None


def _figure_rows(data: Mapping[str, Any], sources: Mapping[str, str]) -> list[dict[str, Any]]:
    """One row per figure of a data file, in file order: path, value as written, source."""
    return [{"field": path, "value": _shown(_get_path(data, path)),
             "source": _source_of(path, sources)}
            for path in figure_paths(data, skip=_NOT_FIGURES)]


def _shown(value: Any) -> str:
    """A figure as the file writes it: quantities keep their unit, flags read true/false."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}: {_shown(v)}" for k, v in value.items())
    if isinstance(value, list):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    return str(value)


def describe(runtime: Runtime) -> dict[str, Any]:
    """Every figure of a runtime and of its collective library, with its unit and source.

    Returns plain data for ``memsim show --runtime NAME``: ``name``, ``description``, ``file``,
    ``base`` (the runtime it derives from, or None), ``figures`` (rows of ``field``, ``value``,
    ``source``; a figure dropped from the base reads ``dropped``), ``launches_per_dense_layer``,
    ``launch_s``, ``graph_launch_s`` and ``host_per_step_s`` in seconds, a one-line ``summary``,
    and ``collective_library`` (its name, file, description, ``origin`` (repository, commit,
    source file, version) and figures).
    """
    library = collective_library(runtime.collective.library)
    return {
        "name": runtime.name,
        "description": runtime.description,
        "file": runtime.file,
        "base": runtime.base,
        "figures": (_figure_rows(runtime.data, dict(runtime.sources))
                    + [{"field": path, "value": "dropped", "source": runtime.source(path)}
                       for path in runtime.dropped]),
        "launches_per_dense_layer": runtime.fusion.dense_layer_launches,
        "launch_s": runtime.launch_s,
        "graph_launch_s": runtime.graph_launch_s,
        "host_per_step_s": runtime.host_per_step_s,
        "summary": (f"{'graph replay' if runtime.graph else 'eager launches'}, "
                    f"{format_quantity(runtime.launch_s, 'time')} per launch when not graphed, "
                    f"{format_quantity(runtime.graph_launch_s, 'time')} per graph replay, "
                    f"{format_quantity(runtime.host_per_step_s, 'time')} host per step"
                    f"{' (overlapped)' if runtime.host_overlap else ''}"),
        "collective_library": {
            "name": library.name, "file": library.file, "description": library.description,
            "origin": {key: library.data[key] for key in _LIBRARY_ORIGIN if key in library.data},
            "figures": _figure_rows(library.data, dict(library.sources)),
        },
    }
