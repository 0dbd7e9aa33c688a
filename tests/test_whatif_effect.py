"""Every what-if a user can give changes the figures physics says it must, or is refused.

One table per schema: every field a device what-if can set (``--set``, ``with_overrides``, a
study's ``[grid.set]``), every runtime field (``--set runtime.KEY``) and every workload field
(``memsim.Decode``) has an entry saying what it must move (and, for a timing figure, what it
must not), in a scenario where physics says it matters; or that it is refused with a
ConfigError; or that it is a label (a name, a source), which moves no figure. A field of the
schema without an entry fails :func:`test_every_field_has_an_entry`, so a new field cannot be
added without saying what it does.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, fields
from typing import Any

import pytest

import memsim
from memsim.compare import compare_device
from memsim.errors import ConfigError
from memsim.formats import COMPUTE_CLASSES
from memsim.inputs import decode_from, device_from, model_from
from memsim.sweep import figures_of
from memsim.workload import Decode

DEVICE = importlib.import_module("memsim.device")
RUNTIME = importlib.import_module("memsim.runtime")

TIME = ("time_per_token_s",)
ENERGY = ("energy_per_token_j",)
COUNTS = ("bytes_read", "bytes_written", "hits", "misses", "flops", "link_bytes")
DENSE = "llama-3.2-1b"
MOE = "mixtral-8x7b"


@dataclass(frozen=True)
class Moves:
    """Setting the field to ``value`` must change every figure in ``moves`` and none in
    ``keeps``, for ``model`` on ``device`` (tiers ``add`` added) under ``workload``."""

    value: Any
    moves: tuple[str, ...]
    keeps: tuple[str, ...] = ()
    device: str = "h100-sxm"
    model: str = DENSE
    workload: tuple[tuple[str, Any], ...] = ()
    add: tuple[str, ...] = ()
    measure: str = "run"          # run | compare | speculative | draft-device
    base_sets: tuple[tuple[str, Any], ...] = ()   # what-ifs of the base device


@dataclass(frozen=True)
class Refused:
    """Setting the field to ``value`` is a ConfigError naming it (when the device is built, or
    with ``at_run`` when the run is planned)."""

    value: Any
    match: str
    at_run: bool = False
    device: str = "h100-sxm"
    model: str = DENSE
    workload: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Label:
    """A name or a source text: the device takes it and no figure moves."""

    value: Any


def wl(**fields: Any) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted({"context": 256, **fields}.items()))


BIG = wl(batch=512)
TP2, TP8, TP16 = wl(tp=2), wl(tp=8), wl(tp=16)
SIMPLE2, SIMPLE8, SIMPLE16 = (wl(tp=2, runtime="vendor"), wl(tp=8, runtime="vendor"),
                              wl(tp=16, runtime="vendor"))
EAGER = wl(runtime="hf-eager")
LLAMA_CPP_Q4 = wl(weights="q4_0", runtime="llama.cpp-cuda")
ENGINE_FP8 = wl(weights="fp8-e4m3", runtime="trt-llm-engine-0.16-0.17")
AITER_INT8 = wl(weights="int8", activations="int8", runtime="vllm-rocm-aiter")
LLAMA_CPP_F16 = wl(weights="fp16", runtime="llama.cpp-cuda")
LLAMA_CPP_PP2 = wl(weights="q4_0", runtime="llama.cpp-cuda", pp=2)
MOE_WL = wl(batch=4, weights="int4-g128")
CXL = ("cxl-gen5-x16",)
SPEC = "speculative"

#: Device fields (dotted paths as ``--set`` takes them; ``tiers.sram`` / ``tiers.hbm`` stand for
#: the on-chip and the off-chip tier of any device).
DEVICE_EFFECTS: dict[str, Moves | Refused | Label] = {
    "schema_version": Refused(1, "changes nothing"),
    "name": Label("h100-what-if"),
    "display_name": Label("My H100"),
    "vendor": Label("Someone"),
    "core_name": Label("unit"),
    "clock": Moves("1.0 GHz", ("cycles",), keeps=TIME + COUNTS),   # peaks are per second
    "cores": Moves(66, TIME),
    "core_memory": Refused("64 KiB", "changes nothing"),
    "tdp": Refused("1000 W", "changes nothing"),
    "idle_power": Moves("200 W", ENERGY, keeps=TIME + COUNTS),
    "runtime": Moves("vllm", TIME, keeps=COUNTS),
    "compute.vector": Moves("1 TFLOPS", TIME, keeps=COUNTS, workload=wl(batch=4,
                                                                      weights="int4-g128")),
    "matrix_unit.m": Moves(256, TIME, keeps=("bytes_read",), workload=BIG),
    "matrix_unit.n": Moves(1024, ENERGY, device="mi300x", workload=wl(batch=64)),
    "matrix_unit.k": Refused(64, "changes nothing"),
    "tile.k": Moves(256, ("misses",)),
    "tile.n": Moves(256, ("misses",)),
    "tile.activation_width": Moves(128, ENERGY, workload=wl(batch=64)),
    "tile.per_core": Moves("fixed", ("hits",) + TIME, device="wse-3"),
    "issue.per_clock": Moves(1, TIME, keeps=COUNTS, workload=LLAMA_CPP_Q4),
    "occupancy.threads_per_core": Moves(256, TIME, keeps=COUNTS, workload=LLAMA_CPP_F16),
    "occupancy.blocks_per_core": Moves(2, TIME, keeps=COUNTS, workload=LLAMA_CPP_F16),
    "issue.pipes": Moves({"lsu": {"per_clock": 1, "classes": ["load"]}}, TIME, keeps=COUNTS,
                         workload=LLAMA_CPP_Q4),
    "tiers.sram.name": Refused("smem", "layout"),
    "tiers.sram.kind": Refused("hbm", "sram"),
    "tiers.sram.capacity": Moves("8 MB", ("hits",), workload=wl(residency="pinned")),
    "tiers.sram.bandwidth": Moves("2 TB/s", TIME, keeps=COUNTS),
    "tiers.sram.sustained_bandwidth": Moves("2 TB/s", TIME, keeps=COUNTS),
    "tiers.sram.latency": Moves("5 us", TIME, keeps=COUNTS, device="groq-lpu",
                                model="llama-3-8b", workload=wl(weights="int8", tp=64)),
    "tiers.sram.energy": Moves("5 pJ/bit", ENERGY, keeps=TIME + COUNTS),
    "tiers.sram.granularity": Moves("4 KiB", ("bytes_read",), device="groq-lpu",
                                    model="llama-3-8b", workload=wl(weights="int8", tp=64)),
    "tiers.sram.note": Label("a what-if"),
    "tiers.hbm.name": Refused("dram", "layout"),
    "tiers.hbm.kind": Refused("lpddr", "changes nothing"),
    "tiers.hbm.capacity": Refused("1 GB", "needs", at_run=True),
    "tiers.hbm.bandwidth": Moves("5 TB/s", TIME, keeps=COUNTS),
    "tiers.hbm.sustained_bandwidth": Moves("2 TB/s", TIME, keeps=COUNTS),
    "tiers.hbm.latency": Moves("5 us", TIME, keeps=COUNTS),
    "tiers.hbm.energy": Moves("10 pJ/bit", ENERGY, keeps=TIME + COUNTS),
    "tiers.hbm.granularity": Moves("4 KiB", ("bytes_written",)),
    "tiers.hbm.note": Label("a what-if"),
    "layout.policy": Moves("hybrid", ("hits",)),
    "layout.weights": Moves("cxl", TIME, add=CXL),
    "layout.kv": Moves("cxl", TIME, add=CXL),
    "layout.activations": Refused("hbm", "on chip"),
    "layout.spill": Refused("sram", "further out"),
    "overheads.op_launch": Moves("8 us", TIME, keeps=COUNTS),
    "energy.per_flop": Moves("0.1 pJ/FLOP", ENERGY, keeps=TIME + COUNTS),
    "link.bandwidth": Moves("50 GB/s", TIME, keeps=COUNTS, workload=TP2),
    "link.latency": Moves("5 us", TIME, keeps=COUNTS, workload=TP2),
    "link.topology": Moves("fully-connected", TIME, keeps=COUNTS, workload=SIMPLE8),
    "link.max_chips": Moves(4, TIME, keeps=COUNTS, workload=TP8),
    "link.energy": Moves("10 pJ/bit", ENERGY, keeps=TIME + COUNTS, workload=TP2),
    "link.collective_latency": Moves("50 us", TIME, keeps=COUNTS, workload=SIMPLE2),
    "link.kind": Moves("pcie", TIME, keeps=COUNTS, workload=TP2),
    "link.ranks_per_chip": Moves(3, ("flops",), workload=TP2),
    "scale_out.bandwidth": Moves("5 GB/s", TIME, keeps=COUNTS, workload=TP16),
    "scale_out.latency": Moves("20 us", TIME, keeps=COUNTS, workload=TP16),
    "scale_out.collective_latency": Moves("60 us", TIME, keeps=COUNTS, workload=SIMPLE16),
    "scale_out.max_chips": Refused(8, "scale-out network reaches", at_run=True, workload=TP16),
    "scale_out.topology": Moves("torus-2d", TIME, keeps=COUNTS, workload=SIMPLE16),
    "scale_out.energy": Moves("10 pJ/bit", ENERGY, keeps=TIME + COUNTS, workload=TP16),
    "scale_out.kind": Moves("nvlink", TIME, keeps=COUNTS, workload=TP16),
    "host_link.bandwidth": Moves("1 MB/s", TIME, measure="draft-device"),
    "host_link.latency": Moves("5 ms", TIME, measure="draft-device"),
    "host_link.kind": Refused("pcie", "changes nothing"),
    "cost.usd_per_chip_hour": Moves(1.0, ("usd_per_million_tokens",), measure="compare"),
    "sources.clock": Label("a what-if"),
}
# Every compute class a matmul runs in (its activations'): its peak and its measured rate move
# the matmuls of that class. No activation format is tf32, fp6 or int4: their peaks are listed
# (as spec sheets give them) but a what-if of one would change nothing.
CLASS_WORKLOADS = {
    "bf16": ("h100-sxm", wl(batch=512)),
    "fp16": ("h100-sxm", wl(batch=512, weights="fp16", activations="fp16")),
    "fp8": ("h100-sxm", wl(batch=512, weights="fp8-e4m3")),
    "int8": ("h100-sxm", wl(batch=512, weights="int8", activations="int8")),
    "fp32": ("mi300x", wl(batch=512, weights="uniform:fp32", activations="fp32")),
    "fp4": ("b200", wl(batch=512, weights="nvfp4")),
}
for _class in COMPUTE_CLASSES:
    for _table in ("compute", "sustained_compute"):
        if _class in CLASS_WORKLOADS:
            _device, _workload = CLASS_WORKLOADS[_class]
            DEVICE_EFFECTS[f"{_table}.{_class}"] = Moves("50 TFLOPS", TIME, keeps=COUNTS,
                                                         device=_device, workload=_workload)
        else:
            DEVICE_EFFECTS[f"{_table}.{_class}"] = Refused(
                "50 TFLOPS", "no matmul runs in" if _table == "compute" else _class)

#: Runtime fields, as ``--set runtime.KEY=VALUE`` (the runtime the step runs under).
RUNTIME_EFFECTS: dict[str, Moves | Refused | Label] = {
    "schema_version": Refused(2, "schema_version"),
    "name": Label("my-stack"),
    "description": Label("a what-if"),
    "graph": Moves(False, TIME, keeps=COUNTS),
    "launch": Moves("30 us", TIME, keeps=COUNTS, workload=EAGER),
    "graph_launch": Moves("1 ms", TIME, keeps=COUNTS),
    "host_per_step": Moves("3 ms", TIME, keeps=COUNTS, workload=EAGER),
    "host_overlap": Moves(False, TIME, keeps=COUNTS),
    "small_batch_gemv": Moves(False, TIME, keeps=COUNTS,             # a slow matrix unit
                              base_sets=(("compute.bf16", "5 TFLOPS"),)),
    "gemv_max_rows": Moves(1, TIME, keeps=COUNTS, workload=wl(batch=4),   # batch 4 past it
                           base_sets=(("compute.bf16", "5 TFLOPS"),)),
    "fusion.fused_qkv": Moves(False, TIME),
    "fusion.fused_gate_up": Moves(False, TIME),
    "fusion.fused_norm_residual": Moves(False, TIME),
    "fusion.fused_moe": Moves(False, TIME, model=MOE, workload=MOE_WL),
    "fusion.fused_attention_prologue": Moves(True, TIME),
    "fusion.extra_kernels_per_layer": Moves(9, TIME),
    "fusion.attention_split": Refused("none", "changes nothing"),
    "collective.library": Moves("neuron", TIME, keeps=COUNTS, workload=wl(tp=2,
                                                                        runtime="hf-eager")),
    "collective.algorithm": Moves("tree", TIME, keeps=COUNTS, workload=wl(
        tp=8, batch=256, runtime="hf-eager")),
    "collective.custom_allreduce_max_bytes": Moves("1 kB", TIME, keeps=COUNTS, workload=TP2),
    "collective.custom_allreduce_chips": Moves([4, 8], TIME, keeps=COUNTS, workload=TP2),
    "collective.custom_allreduce_links": Moves(["pcie"], TIME, keeps=COUNTS, workload=TP2),
    "collective.one_shot_max_bytes": Moves({"2": "1 kB", "4": "1 kB", "8": "1 kB"}, TIME,
                                           keeps=COUNTS, workload=TP2),
    "collective.one_shot_latency": Moves("50 us", TIME, keeps=COUNTS, workload=TP2),
    "collective.two_shot_latency": Moves("50 us", TIME, keeps=COUNTS,
                                         workload=wl(tp=8, batch=64)),
    "collective.custom_allreduce_efficiency": Moves(0.01, TIME, keeps=COUNTS,
                                                    workload=wl(tp=2, batch=64)),
    "speculative.draft_step_host": Moves("1 ms", TIME, measure=SPEC),
    "speculative.iteration_host": Moves("1 ms", TIME, measure=SPEC),
    "sources.launch": Label("a what-if"),
    "pipeline.handoff": Moves("link", TIME, keeps=COUNTS, workload=LLAMA_CPP_PP2),
    "pipeline.handoff_bits": Moves(16, TIME, workload=LLAMA_CPP_PP2),
    "pipeline.graph": Moves(True, TIME, keeps=COUNTS, workload=LLAMA_CPP_PP2),
    "gemv.q4_0": Moves({"per_weight": {}, "per_weight_row": {"load": 100.0}}, TIME,
                       keeps=COUNTS, workload=LLAMA_CPP_Q4),
    "gemm.fp8-e4m3.rows": Moves(512, TIME, keeps=COUNTS, workload=ENGINE_FP8),
    "gemm.fp8-e4m3.split_k": Moves(True, TIME, keeps=COUNTS, workload=ENGINE_FP8),
    "gemm.int8.in_flight": Moves({"threads_per_block": 32, "rows_per_block": 64,
                                  "bytes_per_thread": 1.0, "max_rows": 16}, TIME,
                                 keeps=COUNTS, workload=AITER_INT8),
}

#: Workload fields of ``memsim.Decode`` (the base workload is ``Decode(context=256)``).
WORKLOAD_EFFECTS: dict[str, Moves | Refused] = {
    "batch": Moves(4, ("flops",) + TIME),
    "context": Moves(1024, ("bytes_read",) + TIME),
    "weights": Moves("int8", ("bytes_read",) + TIME),
    "kv": Moves("fp8-e4m3", ("bytes_read",)),
    "activations": Moves("fp8-e4m3", TIME, workload=wl(batch=512)),
    "steps": Moves(40, ("bytes_read",)),
    "new_tokens": Moves(4, ("flops",)),
    "kv_block": Moves(256, ("bytes_read",)),
    "tile_k": Moves(256, ("misses",)),
    "tile_n": Moves(256, ("misses",)),
    "tile_m": Moves(16, ("bytes_read",), workload=wl(prefill_chunk=64)),
    "residency": Moves("pinned", ("hits",)),
    "seed": Moves(7, ("bytes_read",), model=MOE, workload=MOE_WL),
    "tp": Moves(2, ("link_bytes",) + TIME),
    "pp": Moves(2, ("link_bytes",) + TIME),
    "microbatches": Moves(1, TIME, workload=wl(pp=2, batch=4)),
    "policy": Moves("hybrid", ("hits",)),
    "placement": Moves({"kv": "cxl"}, TIME, add=CXL),
    "draft_heads": Moves(1, ("flops",)),
    "ep": Moves(2, ("link_bytes",), model=MOE, workload=MOE_WL),
    "routing": Moves("zipf:1.5", ("bytes_read",), model=MOE, workload=MOE_WL),
    "runtime": Moves("vllm", TIME),
    "prefill_chunk": Moves(64, ("flops",)),
    "prefill_context": Moves(128, ("flops",), workload=wl(prefill_chunk=64)),
    "prefill": Moves(True, ("flops",), workload=wl(new_tokens=64, steps=1)),
}


def device_paths() -> set[str]:
    """Every field of the device format, as a what-if path."""
    tables = {"compute", "sustained_compute", "matrix_unit", "tile", "tiers", "layout",
              "overheads", "host_link", "energy", "link", "scale_out", "cost", "sources",
              "issue", "occupancy"}
    paths = {k for k in DEVICE._TOP_REQUIRED + DEVICE._TOP_OPTIONAL if k not in tables}
    paths |= {f"compute.{c}" for c in COMPUTE_CLASSES + ("vector",)}
    paths |= {f"sustained_compute.{c}" for c in COMPUTE_CLASSES}
    paths |= {"matrix_unit.m", "matrix_unit.n", "matrix_unit.k", "tile.k", "tile.n",
              "tile.activation_width", "tile.per_core", "issue.per_clock", "issue.pipes",
              "occupancy.threads_per_core", "occupancy.blocks_per_core", "layout.policy", "layout.weights", "layout.kv",
              "layout.activations", "layout.spill", "overheads.op_launch", "energy.per_flop",
              "cost.usd_per_chip_hour", "sources.clock"}
    paths |= {f"tiers.{tier}.{key}" for tier in ("sram", "hbm")
              for key in DEVICE._TIER_REQUIRED + DEVICE._TIER_OPTIONAL}
    for name, (required, optional) in DEVICE._LINK_KEYS.items():
        paths |= {f"{name}.{key}" for key in required + optional}
    return paths


def runtime_paths() -> set[str]:
    """Every field of the runtime format, as a ``runtime.`` what-if path."""
    tables = {"fusion", "collective", "speculative", "sources", "pipeline", "gemv", "gemm"}
    paths = {k for k in RUNTIME._TOP_REQUIRED + RUNTIME._TOP_OPTIONAL if k not in tables}
    paths |= {f"fusion.{k}" for k in RUNTIME._FUSION_KEYS + ("fused_attention_prologue",)}
    paths |= {f"collective.{k}" for k in ("library", "algorithm") + RUNTIME._CUSTOM_KEYS}
    paths |= {"speculative.draft_step_host", "speculative.iteration_host", "sources.launch"}
    paths |= {"pipeline.handoff", "pipeline.handoff_bits", "pipeline.graph", "gemv.q4_0",
              "gemm.fp8-e4m3.rows", "gemm.fp8-e4m3.split_k", "gemm.int8.in_flight"}
    return paths


def test_every_field_has_an_entry():
    assert set(DEVICE_EFFECTS) == device_paths()
    assert set(RUNTIME_EFFECTS) == runtime_paths()
    assert set(WORKLOAD_EFFECTS) == {f.name for f in fields(Decode)}


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): data}


def _figures(dev: memsim.Device, entry: Moves, workload: dict[str, Any]) -> dict[str, Any]:
    """The figures ``entry`` looks at, of ``entry.model`` on ``dev``."""
    model = model_from(entry.model)
    if entry.measure == "compare":
        row = compare_device(dev, model, decode_from(workload))
        return {"usd_per_million_tokens": row.usd_per_million_tokens}
    if entry.measure in (SPEC, "draft-device"):
        draft_device = dev if entry.measure == "draft-device" else None
        report = memsim.speculative(dev, model, model_from("llama-3.2-1b"), 2, 0.8,
                                    draft_device=draft_device, **workload)
        return {"time_per_token_s": report.time_per_token}
    return _flat(figures_of(memsim.emulate(dev, model, decode_from(workload))))


def _changed(before: dict[str, Any], after: dict[str, Any], name: str) -> bool:
    keys = [k for k in set(before) | set(after) if k == name or k.startswith(name + ".")]
    assert keys, f"no figure {name}"
    return any(before.get(k) != after.get(k) for k in keys)


def _check_moves(entry: Moves, what_if: dict[str, Any], workload: dict[str, Any],
                 base_device: memsim.Device | None = None) -> None:
    stack = workload.get("runtime", "auto")
    base = base_device or device_from(entry.device, add_tiers=entry.add, sets=entry.base_sets)
    before = _figures(base, entry, workload)
    after = _figures(device_from(base, sets=tuple(what_if.items()), runtime=stack)
                     if what_if else base, entry, workload)
    still = [name for name in entry.moves if not _changed(before, after, name)]
    moved = [name for name in entry.keeps if _changed(before, after, name)]
    assert not still, f"{what_if or workload}: accepted but {still} did not move"
    assert not moved, f"{what_if}: a timing what-if moved counts {moved}"


def _check(path: str, entry: Moves | Refused | Label) -> None:
    if isinstance(entry, Label):
        dev = device_from("h100-sxm", sets=((path, entry.value),))
        assert figures_of(memsim.emulate(dev, DENSE, context=256)) == figures_of(
            memsim.emulate("h100-sxm", DENSE, context=256))
        return
    if isinstance(entry, Refused):
        with pytest.raises(ConfigError) as info:
            dev = device_from(entry.device, sets=((path, entry.value),))
            assert entry.at_run, f"{path}={entry.value!r} was accepted"
            memsim.emulate(dev, entry.model, decode_from(dict(entry.workload)))
        assert entry.match in str(info.value)
        if "changes nothing" in entry.match:
            assert info.value.field == path
        return
    _check_moves(entry, {path: entry.value}, dict(entry.workload))


@pytest.mark.parametrize("path", sorted(DEVICE_EFFECTS))
def test_a_device_what_if_moves_what_physics_says_or_is_refused(path):
    _check(path, DEVICE_EFFECTS[path])


@pytest.mark.parametrize("path", sorted(RUNTIME_EFFECTS))
def test_a_runtime_what_if_moves_what_physics_says_or_is_refused(path):
    _check(f"runtime.{path}", RUNTIME_EFFECTS[path])


@pytest.mark.parametrize("name", sorted(WORKLOAD_EFFECTS))
def test_a_workload_field_moves_what_physics_says(name):
    entry = WORKLOAD_EFFECTS[name]
    base = dict(entry.workload)
    before = _figures(device_from(entry.device, add_tiers=entry.add), entry, base)
    after = _figures(device_from(entry.device, add_tiers=entry.add), entry,
                     {**base, name: entry.value})
    still = [figure for figure in entry.moves if not _changed(before, after, figure)]
    assert not still, f"{name}={entry.value!r}: accepted but {still} did not move"


def test_scale_out_energy_is_charged_for_exactly_the_bytes_that_cross_it():
    # 16 chips span two 8-chip NVLink domains: every all-reduce runs over the network
    workload = {"context": 256, "tp": 16}
    base = memsim.emulate("h100-sxm", DENSE, **workload)
    priced = memsim.emulate(device_from("h100-sxm", sets=(("scale_out.energy", "10 pJ/bit"),)),
                            DENSE, **workload)
    assert priced.link_bytes == base.link_bytes > 0
    assert priced.energy_per_token - base.energy_per_token == pytest.approx(
        base.link_bytes * 8 * 10e-12, rel=1e-9)       # h100's link.energy is not given: 0
