"""Runtime profiles and collective libraries: the shipped files load, cite a tagged source for
every figure and name no device; what-ifs validate; the collective time model matches NCCL's
closed forms, picks protocols as NCCL's tuner does, and never beats the link."""

from __future__ import annotations

import math
import re
import sys
from importlib import resources

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import memsim
from memsim.errors import ConfigError
from memsim.runtime import (LINK_KINDS, collective_candidates, collective_library,
                            collective_library_names, collective_time, describe, load_runtime,
                            runtime, runtime_names)
from memsim.testing import examples

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TAG = re.compile(r"\[(?:V|I|D|E|\?)(?:/(?:V|I|D|E|\?))*\]")
STACKS = ("llama.cpp-cuda", "llama.cpp-metal", "hf-eager", "gpt-fast", "vllm", "sglang",
          "trt-llm", "neuron", "jetstream", "mlc-llm")
RUNTIMES = runtime_names()
LIBRARIES = collective_library_names()
US = 1e-6
NVLINK = 450e9          # NVLink 4, per GPU per direction


def raw(package: str, name: str) -> tuple[str, dict]:
    text = (resources.files(package) / f"{name}.toml").read_text(encoding="utf-8")
    return text, tomllib.loads(text)


def figure_paths(data: dict, prefix: str = "") -> list[str]:
    """Dotted paths of a runtime file's figures (every value outside [sources] and the header)."""
    paths = []
    for key, value in data.items():
        if not prefix and key in ("schema_version", "name", "description", "sources"):
            continue
        if (isinstance(value, dict) and prefix + key != "collective.one_shot_max_bytes"
                and prefix != "gemv."):     # a format's GEMV count has one source
            paths += figure_paths(value, prefix + key + ".")
        else:
            paths.append(prefix + key)
    return paths


def valid_runtime() -> dict:
    return raw("memsim.runtimes", "vllm")[1]


def write(tmp_path, text: str):
    path = tmp_path / "stack.toml"
    path.write_text(text, encoding="utf-8")
    return path


# --- the catalog ----------------------------------------------------------------------------

def test_catalog_has_the_stacks_of_the_validation_rows():
    assert set(STACKS) <= set(RUNTIMES)
    assert {"nccl", "rccl", "xla", "neuron", "none"} <= set(LIBRARIES)


@pytest.mark.parametrize("name", RUNTIMES)
def test_runtime_loads_with_its_stem_as_name(name):
    rt = runtime(name)
    assert rt.name == name == raw("memsim.runtimes", name)[1]["name"]
    assert rt.file == f"runtimes/{name}.toml"
    if name == "vendor":     # a compiled stack whose host costs are not public: none charged
        assert rt.graph and rt.launch_s == rt.graph_launch_s == rt.host_per_step_s == 0
    else:
        assert rt.launch_s > 0 and rt.graph_launch_s > 0 and rt.host_per_step_s > 0
    assert rt.collective.library in LIBRARIES


@pytest.mark.parametrize("name", RUNTIMES)
def test_every_runtime_figure_has_a_tagged_source(name):
    """A derived file's figures are its base's merged with its own, so the merged data counts."""
    rt = runtime(name)
    sources = dict(rt.sources)
    paths = figure_paths(rt.data)
    assert len(paths) >= 15
    assert not [p for p in paths if p not in sources], f"{name}: figures without a source"
    assert not [k for k, text in sources.items() if not TAG.search(text)]
    assert not [k for k in sources if k not in paths + list(rt.dropped)], \
        f"{name}: sources for no figure"


@pytest.mark.parametrize("name", LIBRARIES)
def test_every_collective_figure_has_a_tagged_source(name):
    """Each figure, or the table holding it (one source for a row of NCCL's table), cites one."""
    data = raw("memsim.runtimes.collectives", name)[1]
    origin = ("model", "repository", "commit", "file", "version")
    for path in figure_paths({k: v for k, v in data.items() if k not in origin}):
        parts = path.split(".")
        cited = [data["sources"][".".join(parts[:i])] for i in range(len(parts), 0, -1)
                 if ".".join(parts[:i]) in data["sources"]]
        assert cited and TAG.search(cited[0]), f"{name}: {path} has no tagged source"
    if data["model"] == "tuning-table":
        assert re.fullmatch(r"[0-9a-f]{40}", data["commit"]) and data["file"].endswith(".cc")


def _device_names() -> list[str]:
    names = []
    for stem in memsim.device_names():
        names.append(stem)
        names.append(raw("memsim.devices", stem)[1]["display_name"])
    return [n.lower() for n in names]


@pytest.mark.parametrize("package,name", [("memsim.runtimes", n) for n in RUNTIMES]
                         + [("memsim.runtimes.collectives", n) for n in LIBRARIES])
def test_runtime_files_name_no_device(package, name):
    """A stack's figures are the same on every chip: no (device, runtime) pair is tuned. The
    figures and comments name no device; a [sources] entry may say which hardware a cited
    measurement ran on (RCCL's MSCCL times were measured on the one platform RCCL runs them)."""
    text = raw(package, name)[0].lower().split("\n[sources]")[0]
    named = [d for d in _device_names() if d in text]
    assert not named, f"{package}/{name} names devices {named}"


def test_catalog_runtime_is_parsed_once():
    assert runtime("vllm") is runtime("vllm")
    assert collective_library("nccl") is collective_library("nccl")


def test_unknown_runtime_lists_the_catalog():
    with pytest.raises(ConfigError, match="unknown runtime 'vlm'.*vllm"):
        runtime("vlm")


# --- units, fusion ----------------------------------------------------------------------------

def test_figures_are_si_inside():
    rt = runtime("vllm")
    assert rt.launch_s == 10e-6 and rt.host_per_step_s == 0.4e-3
    custom = rt.collective.custom_allreduce
    assert custom.max_bytes == 8 * 2**20
    assert custom.one_shot_max_bytes == ((2, 8 * 2**20), (4, 512 * 2**10), (8, 256 * 2**10))
    assert runtime("trt-llm").collective.custom_allreduce.max_bytes == 8_000_000


@pytest.mark.parametrize("name", RUNTIMES)
def test_dense_layer_launches_follow_the_fusion_flags(name):
    f = runtime(name).fusion
    expected = (2 + (1 if f.fused_qkv else 3) + (0 if f.fused_attention_prologue else 1) + 2
                + (1 if f.fused_gate_up else 2) + 1 + (0 if f.fused_norm_residual else 2)
                + f.extra_kernels_per_layer)
    assert f.dense_layer_launches == expected


def test_eager_stacks_launch_more_kernels_than_fused_ones():
    assert runtime("hf-eager").fusion.dense_layer_launches == 42
    assert runtime("trt-llm").fusion.dense_layer_launches == 8
    assert not runtime("hf-eager").graph and runtime("trt-llm").graph


# --- what-ifs and bad input -----------------------------------------------------------------------

def test_with_overrides_validates_and_records_the_source():
    base = runtime("vllm")
    rt = base.with_overrides({"launch": "6 us", "graph": "false",
                              "fusion.extra_kernels_per_layer": "5",
                              "collective.algorithm": "ring"})
    assert rt.launch_s == 6e-6 and rt.graph is False
    assert rt.fusion.extra_kernels_per_layer == 5 and rt.collective.algorithm == "ring"
    assert rt.source("launch") == "what-if override: 6 us"
    assert base.launch_s == 10e-6 and base.graph is True     # the original is untouched


@pytest.mark.parametrize("overrides,field", [
    ({"launch": "6 GB"}, "launch"),
    ({"launch": "6"}, "launch"),
    ({"fusion.attention_split": "paged"}, "fusion.attention_split"),
    ({"collective.library": "mpi"}, "collective.library"),
    ({"graph": "maybe"}, "graph"),
    ({"fusion.wat": True}, "fusion.wat"),
    ({"nosuch.launch": "1 us"}, "nosuch.launch"),
    ({"collective.custom_allreduce_efficiency": 1.5}, "collective.custom_allreduce_efficiency"),
])
def test_bad_override_names_the_field(overrides, field):
    with pytest.raises(ConfigError) as info:
        runtime("vllm").with_overrides(overrides)
    assert info.value.field == field


def test_load_runtime_from_a_file(tmp_path):
    text = raw("memsim.runtimes", "gpt-fast")[0].replace('name = "gpt-fast"', 'name = "mine"')
    rt = load_runtime(write(tmp_path, text))
    assert rt.name == "mine" and rt.file.endswith("stack.toml")
    assert runtime(str(write(tmp_path, text))).name == "mine"


@pytest.mark.parametrize("edit,field", [
    (lambda d: d.pop("launch"), "launch"),
    (lambda d: d.update(extra=1), "extra"),
    (lambda d: d["fusion"].pop("fused_qkv"), "fusion.fused_qkv"),
    (lambda d: d["fusion"].update(extra_kernels_per_layer=-1), "fusion.extra_kernels_per_layer"),
    (lambda d: d["collective"].pop("two_shot_latency"), "collective.two_shot_latency"),
    (lambda d: d["collective"].update(library="xla"), "collective.custom_allreduce_max_bytes"),
    (lambda d: d["collective"].update(custom_allreduce_links=["warp"]),
     "collective.custom_allreduce_links"),
    (lambda d: d["collective"]["one_shot_max_bytes"].update(x="1 MiB"),
     "collective.one_shot_max_bytes.x"),
    (lambda d: d["speculative"].update(iteration_host="1 GHz"), "speculative.iteration_host"),
    (lambda d: d.update(schema_version=2), "schema_version"),
])
def test_bad_runtime_data_names_file_and_field(edit, field):
    data = valid_runtime()
    edit(data)
    with pytest.raises(ConfigError) as info:
        memsim.runtime.parse_runtime(data, file="mine.toml")
    assert info.value.file == "mine.toml" and info.value.field == field


def test_malformed_toml_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="malformed TOML"):
        load_runtime(write(tmp_path, "graph = \n"))


# --- describe ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", RUNTIMES)
def test_describe_gives_every_figure_with_its_source(name):
    info = describe(runtime(name))
    assert info["name"] == name
    fields = {row["field"] for row in info["figures"]}
    assert set(figure_paths(runtime(name).data)) | set(runtime(name).dropped) == fields
    assert all(TAG.search(row["source"] or "") for row in info["figures"])
    library = info["collective_library"]
    assert library["figures"] and all(TAG.search(r["source"] or "") for r in library["figures"])


def test_describe_shows_units_and_the_library_origin():
    info = describe(runtime("vllm"))
    rows = {row["field"]: row["value"] for row in info["figures"]}
    assert rows["launch"] == "10 us" and rows["graph"] == "true"
    origin = info["collective_library"]["origin"]
    assert origin["repository"] == "NVIDIA/nccl" and origin["file"] == "src/graph/tuning.cc"


# --- collective time: closed forms ----------------------------------------------------------------

def by(candidates, algorithm, protocol):
    [found] = [c for c in candidates if c.algorithm == algorithm and c.protocol == protocol]
    return found


def test_nccl_ring_closed_forms_on_nvlink():
    n, size = 8, 1 << 20
    cands = collective_candidates(runtime("hf-eager"), "all_reduce", size, n, "nvlink", NVLINK,
                                  0.5e-6, n - 1, generation="hopper")
    steps, ratio = 2 * (n - 1), n / (2 * (n - 1))
    ll = by(cands, "ring", "ll")
    assert ll.latency_s == pytest.approx((6.6 + steps * 0.6) * US)
    assert ll.bandwidth_s == pytest.approx(size / (min(0.5 * NVLINK, 141e9) * ratio))
    ll128 = by(cands, "ring", "ll128")
    assert ll128.latency_s == pytest.approx((14 + steps * 1.9) * US)
    assert ll128.bandwidth_s == pytest.approx(size / (0.92 * NVLINK * ratio))
    simple = by(cands, "ring", "simple")
    assert simple.latency_s == pytest.approx((8.4 + steps * 3.4) * US)
    assert simple.bandwidth_s == pytest.approx(size / (NVLINK * ratio))
    assert ll.seconds == pytest.approx(ll.latency_s + ll.bandwidth_s)


def test_nccl_tree_closed_forms_with_the_correction():
    n, size = 8, 1 << 16          # log2(65536 / 64) = 10: corrections 0.6, 0.6, 0.6
    cands = collective_candidates(runtime("hf-eager"), "all_reduce", size, n, "nvlink", NVLINK,
                                  0.0, n - 1)
    for proto, factor, hw, base in (("ll", 0.92 / 3.8, 0.6, 6.8),
                                    ("ll128", 0.92 * 7 / 9, 1.25, 14.0),
                                    ("simple", 0.92, 4.0, 8.4)):
        tree = by(cands, "tree", proto)
        assert tree.latency_s == pytest.approx((base + 2 * (n - 1) * hw) * US)
        assert tree.bandwidth_s == pytest.approx(size / (NVLINK * factor * 0.5 * 0.6), rel=1e-5)


def test_nccl_all_gather_is_a_ring_of_n_minus_1_steps():
    n, size = 4, 1 << 22
    cands = collective_candidates(runtime("vllm"), "all_gather", size, n, "nvlink", NVLINK, 0.0,
                                  n - 1)
    assert {c.algorithm for c in cands} == {"ring"}
    simple = by(cands, "ring", "simple")
    assert simple.latency_s == pytest.approx((8.4 + (n - 1) * 3.4) * US)
    assert simple.bandwidth_s == pytest.approx(size * (n - 1) / n / NVLINK)


def test_pcie_has_no_ll128_and_uses_the_pci_row():
    cands = collective_candidates(runtime("hf-eager"), "all_reduce", 4096, 4, "pcie", 32e9, 0.0, 3)
    assert "ll128" not in {c.protocol for c in cands}
    assert by(cands, "ring", "ll").latency_s == pytest.approx((6.6 + 6 * 1.0) * US)


def test_network_ring_steps_use_the_tree_row_with_one_rank_per_node():
    n = 4
    cands = collective_candidates(runtime("hf-eager"), "all_reduce", 4096, n, "infiniband", 50e9,
                                  0.0, n - 1)
    assert by(cands, "ring", "ll").latency_s == pytest.approx((6.6 + 2 * (n - 1) * 5.0) * US)
    assert by(cands, "tree", "ll").latency_s == pytest.approx((6.8 + 2 * 2 * 5.0) * US)
    assert by(cands, "ring", "ll").bandwidth_s == pytest.approx(
        4096 / (min(0.5 * 50e9, 20.4e9) * n / (2 * (n - 1))))


def test_a_slower_link_than_the_table_sets_the_step():
    cands = collective_candidates(runtime("hf-eager"), "all_reduce", 4096, 4, "nvlink", NVLINK,
                                  3e-6, 3)
    assert by(cands, "ring", "ll").latency_s == pytest.approx((6.6 + 6 * 3.0) * US)


def test_rccl_runs_nccl_calls_on_infinity_fabric():
    xgmi = 448e9
    cands = collective_candidates(runtime("hf-eager"), "all_reduce", 1 << 20, 8, "infinity-fabric",
                                  xgmi, 0.0, 1)
    assert {c.library for c in cands} == {"rccl"} and "ll128" not in {c.protocol for c in cands}
    ll = by(cands, "ring", "ll")
    assert ll.latency_s == pytest.approx((12 + 14 * 0.8) * US)
    assert ll.bandwidth_s == pytest.approx((1 << 20) / (0.08 * xgmi * 8 / 14))
    assert ("tree", "simple") not in {(c.algorithm, c.protocol) for c in cands}


@pytest.mark.parametrize("stack", ["hf-eager", "vllm"])
def test_the_library_follows_the_gpu_not_the_link_between_nodes(stack):
    """A tp-16 all-reduce over InfiniBand between two 8-GPU nodes (devices/mi300x.toml's
    scale-out): on MI300X nodes (Infinity Fabric) it runs RCCL's tables, as vLLM on ROCm loads
    librccl whatever link a call crosses; on NVLink nodes (H100) NCCL's, which are faster."""
    def timed(rt, node_link):
        return collective_time(rt, "all_reduce", 8 * 8192 * 2, 16, "infiniband", 50e9, 2.7e-6,
                               15, chips_per_node=8, intra_link_kind=node_link,
                               intra_link_latency_s=1e-6)
    rccl = runtime(stack).with_overrides({"collective.library": "rccl"})
    amd = timed(runtime(stack), "infinity-fabric")
    assert amd.library == "rccl" and amd == timed(rccl, "infinity-fabric")
    nvidia = timed(runtime(stack), "nvlink")     # both take the NVLink row: only the
    assert nvidia.library == "nccl"             # library's tables tell them apart
    assert nvidia.seconds < amd.seconds == timed(rccl, "nvlink").seconds


def test_rccl_msccl_allpairs_closed_forms_on_8_chips_of_infinity_fabric():
    """RCCL's MSCCL all-pairs all-reduce: latency + 2 (n-1)/n x bytes / (link x efficiency), with
    the fitted figures of runtimes/collectives/rccl.toml reproducing the rccl-tests times they
    were fitted through (AMD's MI300X blog, graph mode, in-place) to their rounding."""
    xgmi, n = 448e9, 8

    def allpairs(size):
        cands = collective_candidates(runtime("vllm-0.6-rocm"), "all_reduce", size, n,
                                      "infinity-fabric", xgmi, 1e-6, n - 1)
        return [c for c in cands if c.algorithm == "allpairs"]

    [at_32k] = allpairs(32768)
    assert (at_32k.library, at_32k.protocol) == ("rccl", "ll")
    assert at_32k.latency_s == pytest.approx(7.74 * US)
    assert at_32k.bandwidth_s == pytest.approx(2 * 7 / 8 * 32768 / (xgmi * 0.183))
    for size, measured_us in ((1024, 7.76), (65536, 9.14), (131072, 9.53), (262144, 10.32),
                              (1 << 20, 19.72), (8 << 20, 86.66)):
        [c] = allpairs(size)
        assert c.seconds == pytest.approx(measured_us * US, rel=2e-3), size   # 3-digit figures
    [ll_64] = allpairs(65537)
    assert ll_64.latency_s == pytest.approx(8.74 * US)
    [simple] = allpairs(1 << 20)
    assert (simple.protocol, simple.latency_s) == ("simple", pytest.approx(10.16 * US))
    assert allpairs(11 << 20) and not allpairs((11 << 20) + 1)
    assert collective_time(runtime("vllm-0.6-rocm"), "all_reduce", 32768, n, "infinity-fabric",
                           xgmi, 1e-6, n - 1).algorithm == "allpairs"


def test_rccl_msccl_only_on_its_domain_and_where_no_custom_kernel_takes_the_call():
    def algorithms(name, size, chips, link):
        return {c.algorithm for c in collective_candidates(runtime(name), "all_reduce", size,
                                                           chips, link, 448e9, 1e-6, chips - 1)}
    assert "allpairs" in algorithms("vllm-0.6-rocm", 32768, 8, "infinity-fabric")
    assert "allpairs" not in algorithms("vllm-0.6-rocm", 32768, 4, "infinity-fabric")
    assert "allpairs" not in algorithms("vllm-0.6-rocm", 32768, 8, "nvlink")
    assert "allpairs" not in algorithms("vllm", 32768, 8, "infinity-fabric")    # one-shot's
    assert "allpairs" in algorithms("vllm", 8 << 20, 8, "infinity-fabric")      # not < 8 MiB
    assert "allpairs" not in {c.algorithm for c in collective_candidates(
        runtime("vllm-0.6-rocm"), "all_gather", 32768, 8, "infinity-fabric", 448e9, 1e-6, 7)}


def test_rccl_msccl_candidate_is_monotone_across_its_ranges():
    """The least over this size's algorithm and the start of every later one: at the first
    range's end (64 KiB) the LL 64-channel line starts no lower than the 32-channel one ends."""
    sizes = [1, 512, 65535, 65536, 65537, 524287, 524288, 4 << 20, 11 << 20]
    times = [collective_time(runtime("vllm-0.6-rocm"), "all_reduce", s, 8, "infinity-fabric",
                             448e9, 1e-6, 7).seconds for s in sizes]
    assert all(a <= b for a, b in zip(times, times[1:]))


def _rccl_with(edit):
    text = (resources.files("memsim.runtimes.collectives") / "rccl.toml").read_text("utf-8")
    data = tomllib.loads(text)
    edit(data["msccl"])
    return data


@pytest.mark.parametrize("edit,field", [
    (lambda m: m.pop("chips"), "msccl.chips"),
    (lambda m: m.update(link="xgmi"), "msccl.link"),
    (lambda m: m["ll_32tb"].update(protocol="ll256"), "msccl.ll_32tb.protocol"),
    (lambda m: m["ll_32tb"].pop("latency"), "msccl.ll_32tb.latency"),
    (lambda m: m["ll_32tb"].update(efficiency=1.5), "msccl.ll_32tb.efficiency"),
    (lambda m: m["simple"].update(max_size="1 KiB"), "msccl.simple.max_size"),
    (lambda m: m["simple"].update(min_size="fast"), "msccl.simple.min_size"),
    (lambda m: m.update(ll_32tb=3), "msccl.ll_32tb"),
])
def test_bad_msccl_table_names_the_field(edit, field):
    from memsim.runtime import parse_collective_library
    with pytest.raises(ConfigError) as err:
        parse_collective_library(_rccl_with(edit), file="rccl.toml")
    assert err.value.field == field and err.value.file == "rccl.toml"


def test_simple_model_is_a_ring_over_the_hops():
    n, hops, size = 8, 4, 1 << 20
    t = collective_time(runtime("jetstream"), "all_reduce", size, n, "ici", 100e9, 1e-6, hops)
    assert (t.library, t.algorithm, t.protocol) == ("xla", "ring", "simple")
    assert t.latency_s == pytest.approx(2 * hops * 1e-6)
    assert t.bandwidth_s == pytest.approx(2 * (n - 1) / n * size / 100e9)
    gather = collective_time(runtime("neuron"), "all_gather", size, n, "other", 100e9, 1e-6, hops)
    assert gather.latency_s == pytest.approx(58e-6 + hops * 1e-6)   # nccom-test's floor + hops
    assert gather.bandwidth_s == pytest.approx((n - 1) / n * size / 100e9)


def test_all_to_all_through_nccl_is_one_group_of_sends():
    n, size = 8, 1 << 20
    t = collective_time(runtime("vllm"), "all_to_all", size, n, "nvlink", NVLINK, 0.0, 1)
    assert (t.algorithm, t.protocol) == ("p2p", "simple")
    assert t.latency_s == pytest.approx((8.4 + 3.4) * US)
    assert t.bandwidth_s == pytest.approx((n - 1) / n * size / NVLINK)


def test_custom_allreduce_closed_forms():
    custom = runtime("vllm").collective.custom_allreduce
    n, size = 8, 64 << 10
    cands = collective_candidates(runtime("vllm"), "all_reduce", size, n, "nvlink", NVLINK, 0.0, 7)
    one, two = by(cands, "one-shot", "custom"), by(cands, "two-shot", "custom")
    rate = NVLINK * custom.efficiency
    assert one.seconds == pytest.approx(custom.one_shot_latency_s + (n - 1) * size / rate)
    assert two.seconds == pytest.approx(custom.two_shot_latency_s
                                        + 2 * (n - 1) / n * size / rate)
    assert one.library == "vllm"
    above = collective_candidates(runtime("vllm"), "all_reduce", 256 << 10, n, "nvlink", NVLINK,
                                  0.0, 7)
    assert "one-shot" not in {c.algorithm for c in above}          # vLLM's 256 KiB rule at 8


def test_custom_allreduce_only_where_the_stack_runs_it():
    def algorithms(name, chips, link, size):
        return {c.algorithm for c in collective_candidates(runtime(name), "all_reduce", size,
                                                           chips, link, NVLINK, 0.0, chips - 1)}
    assert "one-shot" in algorithms("vllm", 8, "nvlink", 4096)
    assert "one-shot" not in algorithms("vllm", 3, "nvlink", 4096)         # world size 3
    assert "one-shot" not in algorithms("vllm", 8, "pcie", 4096)
    assert "two-shot" not in algorithms("vllm", 8, "nvlink", 8 << 20)      # not below 8 MiB
    assert "one-shot" not in algorithms("hf-eager", 8, "nvlink", 4096)
    assert "one-shot" in algorithms("trt-llm", 4, "nvlink", 999_999)       # below 1 MB at 4
    assert "one-shot" not in algorithms("trt-llm", 4, "nvlink", 1_000_000)


@pytest.mark.parametrize("name", ["vllm", "sglang", "trt-llm"])
@pytest.mark.parametrize("chips", [2, 4, 8])
def test_custom_allreduce_wins_for_small_messages(name, chips):
    args = ("all_reduce", 16 << 10, chips, "nvlink", NVLINK, 0.5e-6, chips - 1)
    stack = collective_time(runtime(name), *args, generation="hopper")
    plain = collective_time(runtime("hf-eager"), *args, generation="hopper")
    assert stack.protocol == "custom" and stack.algorithm == "one-shot"
    assert stack.seconds < plain.seconds


def test_nccl_switches_from_ll_to_ll128_to_simple_as_the_message_grows():
    picks = [collective_time(runtime("hf-eager"), "all_reduce", 1 << k, 8, "nvlink", NVLINK,
                             0.5e-6, 7, generation="hopper").protocol for k in range(6, 33)]
    first = {p: picks.index(p) for p in ("ll", "ll128", "simple")}
    assert first["ll"] == 0 and first["ll"] < first["ll128"] < first["simple"]
    assert picks[-1] == "simple"


def test_one_chip_or_no_bytes_costs_nothing():
    for chips, size in ((1, 1 << 20), (8, 0)):
        t = collective_time(runtime("vllm"), "all_reduce", size, chips, "nvlink", NVLINK, 1e-6, 7)
        assert t.seconds == 0 and t.algorithm == "none"


def test_bad_call_arguments():
    rt = runtime("vllm")
    with pytest.raises(ValueError, match="unknown collective"):
        collective_time(rt, "broadcast", 1, 2, "nvlink", NVLINK, 0.0, 1)
    with pytest.raises(ValueError, match="unknown link kind"):
        collective_time(rt, "all_reduce", 1, 2, "warp", NVLINK, 0.0, 1)
    with pytest.raises(ValueError, match="bandwidth"):
        collective_time(rt, "all_reduce", 1, 2, "nvlink", 0.0, 0.0, 1)
    with pytest.raises(ConfigError, match="generation"):
        collective_time(rt, "all_reduce", 1, 2, "nvlink", NVLINK, 0.0, 1, generation="kepler")


# --- collective time: properties ---------------------------------------------------------------

def traffic_bytes(kind: str, size: int, chips: int) -> float:
    """Bytes each chip must send at least: the link's bandwidth bound."""
    return (2 if kind == "all_reduce" else 1) * (chips - 1) / chips * size


calls = st.fixed_dictionaries({
    "name": st.sampled_from(RUNTIMES),
    "kind": st.sampled_from(("all_reduce", "all_gather", "all_to_all")),
    "chips": st.integers(2, 64),
    "link": st.sampled_from(LINK_KINDS),
    "bandwidth": st.sampled_from((25e9, 100e9, 450e9, 900e9)),
    "latency": st.sampled_from((0.0, 0.5e-6, 5e-6)),
    "generation": st.sampled_from((None, "ampere", "hopper", "blackwell")),
})


@settings(max_examples=examples(200))
@given(call=calls, sizes=st.lists(st.integers(0, 1 << 31), min_size=2, max_size=6))
def test_time_is_monotone_in_size_and_never_beats_the_link(call, sizes):
    rt = runtime(call["name"])
    times = []
    for size in sorted(sizes):
        t = collective_time(rt, call["kind"], size, call["chips"], call["link"],
                            call["bandwidth"], call["latency"], call["chips"] - 1,
                            generation=call["generation"])
        assert t.seconds == pytest.approx(t.latency_s + t.bandwidth_s)
        bound = traffic_bytes(call["kind"], size, call["chips"]) / call["bandwidth"]
        assert t.bandwidth_s >= bound * (1 - 1e-12)
        times.append(t.seconds)
    assert all(a <= b * (1 + 1e-12) for a, b in zip(times, times[1:]))


@settings(max_examples=examples(100))
@given(call=calls, size=st.integers(1, 1 << 30))
def test_the_choice_is_the_least_candidate(call, size):
    args = (call["kind"], size, call["chips"], call["link"], call["bandwidth"], call["latency"],
            call["chips"] - 1)
    rt = runtime(call["name"])
    best = collective_time(rt, *args, generation=call["generation"])
    cands = collective_candidates(rt, *args, generation=call["generation"])
    assert best.seconds == min(c.seconds for c in cands)
    assert all(math.isfinite(c.seconds) and c.seconds > 0 for c in cands)


def test_two_level_collective_costs_node_steps_on_the_node_link_and_network_steps_on_the_network():
    """16 GPUs as 2 nodes of 8 over InfiniBand: NCCL's tuner counts 2 (nodes - 1) network steps
    of a ring all-reduce and the rest inside the nodes (each at least a network post, x3 for
    Simple), and a tree 2 ((ranks/nodes - 1) intra + log2(nodes) network) steps."""
    ib, size, n = 50e9, 1 << 20, 16
    kwargs = dict(chips_per_node=8, intra_link_kind="nvlink", intra_link_latency_s=0.0)
    cands = collective_candidates(runtime("hf-eager"), "all_reduce", size, n, "infiniband", ib,
                                  0.0, 1, **kwargs)
    ring_ll, ring_simple = by(cands, "ring", "ll"), by(cands, "ring", "simple")
    assert ring_ll.latency_s == pytest.approx((6.6 + 28 * max(0.6, 1.0) + 2 * 2.7) * US)
    assert ring_simple.latency_s == pytest.approx((8.4 + 28 * max(3.4, 3.0) + 2 * 14) * US)
    tree_ll = by(cands, "tree", "ll")
    assert tree_ll.latency_s == pytest.approx((6.8 + 2 * (7 * 0.6 + 1 * 5.0)) * US)
    flat = collective_candidates(runtime("hf-eager"), "all_reduce", size, n, "infiniband", ib,
                                 0.0, 1)
    for cand in cands:          # the network's bandwidth either way (LL's cap counts nodes)
        same = by(flat, cand.algorithm, cand.protocol)
        if cand.protocol != "ll":
            assert cand.bandwidth_s == pytest.approx(same.bandwidth_s)
        assert cand.latency_s < same.latency_s


def test_one_chip_per_node_is_the_flat_network_model():
    args = (runtime("vllm"), "all_reduce", 65536, 8, "infiniband", 50e9, 2.7e-6, 7)
    assert collective_time(*args) == collective_time(*args, chips_per_node=1,
                                                     intra_link_kind="nvlink",
                                                     intra_link_latency_s=1e-6)


def _stack_file(tmp_path, host: str = "1 ms", cited: bool = True):
    path = tmp_path / "my-vllm.toml"
    sources = f'\n[sources]\n"host_per_step" = "[E] a test"\n' if cited else ""
    path.write_text(f'schema_version = 1\nname = "my-vllm"\nbase = "vllm"\n'
                    f'description = "vllm with a slower host"\nhost_per_step = "{host}"\n'
                    + sources)
    return path


def test_a_workload_runs_on_a_runtime_file_by_path(tmp_path):
    """A runtime written by a user (docs/runtime-format.md invites it) runs as a catalog one
    does: by path from Python, the CLI and studies alike; the one figure it replaces moves the
    step by exactly that figure's difference."""
    path = _stack_file(tmp_path)
    mine = memsim.emulate("h100-sxm", "llama-3.2-1b", context=256, runtime=str(path))
    base = memsim.emulate("h100-sxm", "llama-3.2-1b", context=256, runtime="vllm")
    assert mine.time_per_token - base.time_per_token == pytest.approx(1e-3 - 0.4e-3, rel=1e-9)


def test_a_bad_runtime_file_is_one_error_naming_the_file(tmp_path):
    path = _stack_file(tmp_path, cited=False)
    with pytest.raises(ConfigError, match="cite its own source") as info:
        memsim.Decode(runtime=str(path))
    assert info.value.file == str(path)
    with pytest.raises(ConfigError, match="cannot read file"):
        memsim.Decode(runtime=str(tmp_path / "missing.toml"))


def test_an_edited_runtime_file_is_read_again(tmp_path):
    path = _stack_file(tmp_path, host="1 ms")
    assert runtime(str(path)) is runtime(str(path))
    assert runtime(str(path)).host_per_step_s == 1e-3
    _stack_file(tmp_path, host="2.5 ms")
    assert runtime(str(path)).host_per_step_s == 2.5e-3


def test_an_optional_key_a_file_omits_takes_text_as_its_default_is_typed():
    """`--set runtime.gemv_max_rows=8` on a runtime whose file omits the key was refused as
    'expected an integer, got '8'' while the API's 8 was taken: both doors now agree."""
    stack = runtime("vllm")
    assert "gemv_max_rows" not in stack.data
    assert stack.with_overrides({"gemv_max_rows": "8"}) == stack.with_overrides(
        {"gemv_max_rows": 8})
    neuron = runtime("neuron")
    assert "small_batch_gemv" not in neuron.data
    assert neuron.with_overrides({"small_batch_gemv": "true"}).small_batch_gemv is True
