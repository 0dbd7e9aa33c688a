"""Runtime files derived from another (``base = "vllm"``): the merge replaces exactly the keys the
file states and keeps every other figure with its citation; each mistake is one ConfigError
naming file and field; derived runtimes list, show, take what-ifs and keep their identity."""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
from importlib import resources

import pytest

import memsim.derive
from memsim.cli import main
from memsim.emulate import host_time_per_step
from memsim.errors import ConfigError
from memsim.gemmtile import GemmTile
from memsim.runtime import collective_candidates, collective_time, load_runtime, runtime

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

HEADER = 'schema_version = 1\nname = "mine"\nbase = "vllm"\ndescription = "a derived stack"\n'
IF_LINK = 448e9          # an Infinity Fabric figure for the collective check, bytes/s


def base_data(name: str = "vllm") -> dict:
    text = (resources.files("memsim.runtimes") / f"{name}.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def derived(tmp_path, body: str, header: str = HEADER):
    path = tmp_path / "mine.toml"
    path.write_text(header + body, encoding="utf-8")
    return path


def error_of(tmp_path, body: str, header: str = HEADER) -> ConfigError:
    path = derived(tmp_path, body, header)
    with pytest.raises(ConfigError) as info:
        load_runtime(path)
    assert info.value.file == str(path)
    return info.value


# --- the merge, in closed form ------------------------------------------------------------------

def test_derived_data_is_the_base_with_exactly_the_replaced_keys(tmp_path):
    rt = load_runtime(derived(tmp_path, """launch = "6 us"
[fusion]
extra_kernels_per_layer = 3
[collective]
one_shot_max_bytes = { "8" = "1 MiB" }
[sources]
"launch" = "[E] mine"
"fusion.extra_kernels_per_layer" = "[V] mine too"
"collective.one_shot_max_bytes" = "[V] one rule for all"
"""))
    expected = base_data()
    expected.update(name="mine", description="a derived stack", launch="6 us")
    expected["fusion"]["extra_kernels_per_layer"] = 3
    expected["collective"]["one_shot_max_bytes"] = {"8": "1 MiB"}    # one figure: replaced whole
    expected["sources"].update({"launch": "[E] mine", "fusion.extra_kernels_per_layer":
                                "[V] mine too", "collective.one_shot_max_bytes":
                                "[V] one rule for all"})
    assert rt.data == expected
    base = runtime("vllm")
    assert rt.launch_s == 6e-6
    assert rt.fusion.dense_layer_launches == base.fusion.dense_layer_launches + 1
    assert rt.collective.custom_allreduce.one_shot_max_bytes == ((8, 1 << 20),)
    assert rt.base == "vllm" and rt.dropped == ()
    same = dataclasses.replace(rt, name=base.name, description=base.description,
                               launch_s=base.launch_s, fusion=base.fusion,
                               collective=base.collective, sources=base.sources,
                               file=base.file, base=None)
    assert same == base


def test_inherited_figures_keep_the_base_citation(tmp_path):
    rt = load_runtime(derived(tmp_path, '[collective]\nalgorithm = "ring"\n'
                                        '[sources]\n"collective.algorithm" = "[V] forced"\n'))
    base = runtime("vllm")
    assert rt.collective.algorithm == "ring"
    assert rt.collective.library == base.collective.library                 # same table, kept
    assert rt.collective.custom_allreduce == base.collective.custom_allreduce
    assert rt.source("collective.library") == base.source("collective.library")
    assert rt.source("host_per_step") == base.source("host_per_step")
    assert rt.source("collective.algorithm") == "[V] forced"


def test_a_source_may_recite_an_inherited_figure_without_changing_it(tmp_path):
    rt = load_runtime(derived(tmp_path, '[sources]\n"host_per_step" = "[E] not for this one"\n'))
    assert rt.host_per_step_s == runtime("vllm").host_per_step_s
    assert rt.source("host_per_step") == "[E] not for this one"


def test_drop_removes_inherited_figures(tmp_path):
    keys = [k for k in base_data()["collective"] if k not in ("library", "algorithm")]
    drop = ", ".join(f'"collective.{k}"' for k in keys)
    cites = "".join(f'"collective.{k}" = "[V] gone"\n' for k in keys)
    rt = load_runtime(derived(tmp_path, f"drop = [{drop}]\n[sources]\n{cites}"))
    assert rt.collective.custom_allreduce is None
    assert set(rt.data["collective"]) == {"library", "algorithm"}
    assert rt.dropped == tuple(f"collective.{k}" for k in keys)


def test_a_derived_file_may_derive_from_a_derived_runtime(tmp_path):
    header = HEADER.replace('base = "vllm"', 'base = "vllm-0.6-rocm"')
    rt = load_runtime(derived(tmp_path, 'launch = "7 us"\n[sources]\n"launch" = "[E] x"\n',
                              header))
    assert rt.base == "vllm-0.6-rocm" and rt.launch_s == 7e-6
    assert rt.collective.custom_allreduce is None and rt.dropped == runtime("vllm-0.6-rocm").dropped


# --- the shipped vLLM 0.6 on ROCm ---------------------------------------------------------------

def test_vllm_06_rocm_is_vllm_without_its_custom_allreduce():
    old, new = runtime("vllm-0.6-rocm"), runtime("vllm")
    assert old.base == "vllm" and old.collective.custom_allreduce is None
    assert old.collective.library == "rccl" and old.collective.algorithm == new.collective.algorithm
    assert (old.graph, old.launch_s, old.graph_launch_s, old.host_per_step_s, old.host_overlap,
            old.fusion, old.speculative) == (new.graph, new.launch_s, new.graph_launch_s,
                                              new.host_per_step_s, new.host_overlap, new.fusion,
                                              new.speculative)
    assert "NOT sourced" in old.source("host_per_step")


def test_vllm_06_rocm_all_reduce_is_rcclonly():
    """At 32 KiB on 8 chips over Infinity Fabric today's vLLM runs its one-shot kernel (RCCL
    never sees the call); the 0.6 ROCm build hands it to RCCL, whose MSCCL all-pairs algorithm
    joins the tuner's candidates, and takes the least of the library's candidates only."""
    args = ("all_reduce", 32768, 8, "infinity-fabric", IF_LINK, 1e-6, 7)
    old = collective_candidates(runtime("vllm-0.6-rocm"), *args)
    new = collective_candidates(runtime("vllm"), *args)
    tuned = [c for c in new if c.protocol != "custom"]
    assert {c.library for c in old} == {"rccl"}
    assert [c for c in old if c.algorithm != "allpairs"] == tuned
    assert "allpairs" not in {c.algorithm for c in new}
    assert collective_time(runtime("vllm-0.6-rocm"), *args).seconds == min(
        c.seconds for c in old)


def test_trt_llm_016_017_engine_is_trt_llm_without_overlap():
    """trt-llm without the overlap scheduler, and its FP8 linears on TensorRT's own kernels."""
    old, new = runtime("trt-llm-engine-0.16-0.17"), runtime("trt-llm")
    assert old.base == "trt-llm" and old.host_overlap is False and new.host_overlap is True
    assert old == dataclasses.replace(new, name=old.name, description=old.description,
                                      host_overlap=False, sources=old.sources, file=old.file,
                                      base="trt-llm", gemm=old.gemm)
    assert dict(old.gemm) == {"fp8-e4m3": GemmTile(rows=128, split_k=False)} and not new.gemm
    assert host_time_per_step(old) == host_time_per_step(new) + new.host_per_step_s
    assert "PR #3625" in old.source("host_overlap") and "NOT sourced" in old.source("graph")


def test_a_step_without_overlap_pays_the_host_time(capsys):
    """Same device, model and step: the 0.16-0.17 engine runtime adds exactly trt-llm's host
    time per step to the step."""
    argv = ["run", "h100-sxm", "llama-3-8b", "--batch", "1", "--context", "256", "--steps", "1",
            "--json", "--runtime"]
    assert main(argv + ["trt-llm"]) == 0
    today = json.loads(capsys.readouterr().out)["time_per_token_s"]
    assert main(argv + ["trt-llm-engine-0.16-0.17"]) == 0
    then = json.loads(capsys.readouterr().out)["time_per_token_s"]
    assert then == pytest.approx(today + runtime("trt-llm").host_per_step_s, rel=1e-9)


# --- identity -----------------------------------------------------------------------------------

def test_identity_includes_the_merged_data(tmp_path):
    one = load_runtime(derived(tmp_path, ""))
    again = load_runtime(derived(tmp_path, ""))
    assert one == again and hash(one) == hash(again)
    changed = load_runtime(derived(tmp_path, 'launch = "6 us"\n[sources]\n"launch" = "[E] x"\n'))
    assert changed != one
    assert runtime("vllm-0.6-rocm") != runtime("vllm")
    assert runtime("vllm-0.6-rocm") is runtime("vllm-0.6-rocm")
    renamed = dataclasses.replace(runtime("vllm-0.6-rocm"), base=None)
    assert renamed != runtime("vllm-0.6-rocm")


# --- what-ifs, listing, showing -----------------------------------------------------------------

def test_what_if_on_a_derived_runtime_keeps_its_lineage():
    rt = runtime("vllm-0.6-rocm").with_overrides({"host_per_step": "1 ms", "graph": "false"})
    assert rt.host_per_step_s == 1e-3 and rt.graph is False
    assert rt.base == "vllm" and rt.collective.custom_allreduce is None
    assert rt.dropped == runtime("vllm-0.6-rocm").dropped
    assert rt.source("host_per_step") == "what-if override: 1 ms"


def test_set_runtime_on_a_derived_runtime_from_the_command_line(capsys):
    argv = ["run", "h100-sxm", "llama-3-8b", "--batch", "1", "--context", "256", "--steps", "1",
            "--runtime", "vllm-0.6-rocm", "--json"]
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(argv + ["--set", "runtime.host_per_step=5ms"]) == 0
    slower = json.loads(capsys.readouterr().out)
    assert slower["time_per_token_s"] == pytest.approx(plain["time_per_token_s"] + 4.6e-3,
                                                        rel=1e-9)


def test_runtimes_lists_and_show_marks_a_derived_runtime(capsys):
    assert main(["runtimes"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith("vllm-0.6-rocm "))
    assert row.split()[1] == "vllm" and row.split()[-1] == "rccl"
    assert main(["show", "--runtime", "vllm-0.6-rocm", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["base"] == "vllm"
    rows = {r["field"]: r for r in info["figures"]}
    assert rows["collective.one_shot_latency"]["value"] == "dropped"
    assert rows["collective.library"]["value"] == "rccl"


# --- errors -------------------------------------------------------------------------------------

def test_unknown_base(tmp_path):
    err = error_of(tmp_path, "", HEADER.replace('"vllm"', '"vlm"'))
    assert err.field == "base" and "unknown base runtime 'vlm'" in str(err)


@pytest.mark.parametrize("value", ['"runtimes/vllm.toml"', '"vllm.toml"', '"../x/vllm"'])
def test_a_base_is_a_catalog_name_not_a_file(tmp_path, value):
    err = error_of(tmp_path, "", HEADER.replace('"vllm"', value))
    assert err.field == "base" and "not a file" in str(err)


def test_a_base_cycle(monkeypatch):
    catalog = {"a": {**base_data(), "name": "a", "base": "b"},
               "b": {**base_data(), "name": "b", "base": "a"}}
    monkeypatch.setattr(memsim.derive, "catalog_names", lambda package: sorted(catalog))
    monkeypatch.setattr(memsim.derive, "read_catalog_entry",
                        lambda package, name, **kw: (copy.deepcopy(catalog[name]),
                                                     f"runtimes/{name}.toml"))
    with pytest.raises(ConfigError) as info:
        memsim.derive.resolve_base(catalog["a"], file="runtimes/a.toml")
    assert info.value.field == "base" and info.value.file == "runtimes/b.toml"
    assert "runtimes/a.toml -> runtimes/b.toml -> runtimes/a.toml" in str(info.value)


def test_a_replaced_figure_needs_its_own_source(tmp_path):
    err = error_of(tmp_path, '[fusion]\nfused_qkv = false\n')
    assert err.field == "sources.fusion.fused_qkv"


@pytest.mark.parametrize("body,field", [
    ('drop = ["collective.one_shot_latency"]\n', "sources.collective.one_shot_latency"),
    ('drop = ["collective.nothing"]\n[sources]\n"collective.nothing" = "[V] x"\n', "drop"),
    ('drop = "launch"\n', "drop"),
    ('drop = ["launch"]\nlaunch = "1 us"\n[sources]\nlaunch = "[V] x"\n', "drop"),
    ('[sources]\n"fusion.nothing" = "[V] x"\n', "sources.fusion.nothing"),
    ('drop = ["collective.one_shot_latency"]\n[sources]\n"collective.one_shot_latency" = '
     '"[V] gone"\n', "collective.one_shot_latency"),    # a half custom all-reduce
    ('launch = "1 GHz"\n[sources]\nlaunch = "[V] x"\n', "launch"),  # merged data validated
    ('launch_cost = "1 us"\n[sources]\nlaunch_cost = "[V] x"\n', "launch_cost"),
])
def test_bad_derived_files_name_file_and_field(tmp_path, body, field):
    assert error_of(tmp_path, body).field == field


def test_a_derived_file_names_itself(tmp_path):
    err = error_of(tmp_path, "", HEADER.replace('name = "mine"\n', ""))
    assert err.field == "name"


def test_drop_without_a_base(tmp_path):
    err = error_of(tmp_path, "", HEADER.replace('base = "vllm"\n', 'drop = ["launch"]\n'))
    assert err.field == "drop"
