"""Tests of the shipped catalogs: devices load and cite a source for every figure; models match
their published parameter counts and KV-cache sizes; tier templates load."""

from __future__ import annotations

import re
import sys
from importlib import resources

import pytest

import memsim
from memsim.device import LINK_KINDS, RUNTIME_NAMES, load_tier_template, tier_template_names

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEVICES = memsim.device_names()
MODELS = memsim.model_names()

NAMED = ("h100-sxm", "h200", "b200", "gb200", "mi300x", "tpu-v5e", "tpu-v5p", "tpu-v7",
         "ipu-gc200", "mtia-v2", "wse-3", "groq-lpu", "inferentia2", "gaudi-3", "maia-100")

# a confidence tag: [V], [I], [D], [E], [?], or a combination such as [I/E]
TAG = re.compile(r"\[(?:V|I|D|E|\?)(?:/(?:V|I|D|E|\?))*\]")


def raw_device(name: str) -> dict:
    text = (resources.files("memsim.devices") / f"{name}.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def figure_paths(data: dict) -> list[str]:
    """Dotted paths of every figure of a device file that needs a source."""
    paths = [key for key in ("clock", "cores", "core_memory", "tdp", "idle_power", "runtime")
             if key in data]
    for table in ("compute", "matrix_unit", "tile", "overheads", "link", "scale_out",
                  "host_link", "energy"):
        paths += [f"{table}.{key}" for key in data.get(table, {})]
    paths.append("layout.policy")
    for tier in data["tiers"]:
        paths += [f"tiers.{tier['name']}.{key}" for key in tier
                  if key not in ("name", "kind", "note")]
    return paths


def test_catalog_size_and_named_accelerators():
    assert len(DEVICES) >= 15
    missing = set(NAMED) - set(DEVICES)
    assert not missing, f"catalog lacks {sorted(missing)}"


@pytest.mark.parametrize("name", DEVICES)
def test_device_loads(name):
    dev = memsim.device(name)
    assert dev.name == name
    assert dev.file == f"devices/{name}.toml"
    assert dev.tiers[0].kind == "sram"
    assert dev.main_memory.capacity > 0 and dev.main_memory.bandwidth > 0
    assert dev.matrix_peak > 0


@pytest.mark.parametrize("name", DEVICES)
def test_every_figure_has_a_tagged_source(name):
    data = raw_device(name)
    sources = data.get("sources", {})
    paths = figure_paths(data)
    assert len(paths) >= 20
    missing = [p for p in paths if p not in sources]
    assert not missing, f"{name}: no [sources] entry for {missing}"
    untagged = [key for key, text in sources.items() if not TAG.search(text)]
    assert not untagged, f"{name}: sources without a confidence tag: {untagged}"


@pytest.mark.parametrize("name", DEVICES)
def test_power_network_and_runtime_are_given_or_their_absence_explained(name):
    """Issue 14 items 2 and 5, issue 19 item 2: every catalog device states its idle power, its
    second network level and its usual software stack, or says in [sources] why not."""
    dev, sources = memsim.device(name), dict(raw_device(name)["sources"])
    assert dev.runtime in RUNTIME_NAMES and TAG.search(sources["runtime"])
    assert "idle_power" in sources
    if dev.idle_power_w is not None and dev.tdp_w is not None:
        assert 0 < dev.idle_power_w <= dev.tdp_w
    assert dev.link is not None and dev.link.kind in LINK_KINDS
    if dev.scale_out is None:
        assert TAG.search(sources["scale_out"]), f"{name}: say why there is no [scale_out]"
    else:
        assert dev.scale_out.kind in LINK_KINDS
        assert dev.scale_out.max_chips >= dev.link.max_chips


def test_sram_tiers_are_the_only_defaulted_sustained_figures_in_the_catalog():
    for name in DEVICES:
        for tier in memsim.device(name).tiers:
            assert tier.sustained_defaulted == (tier.kind == "sram"), (name, tier.name)


@pytest.mark.parametrize("name", DEVICES)
def test_name_is_the_file_stem(name):
    assert raw_device(name)["name"] == name


def test_h100_hbm_bandwidth():
    assert memsim.device("h100-sxm").tier("hbm").bandwidth == 3.35e12
    assert memsim.device("h100-sxm").tier("hbm").capacity == 80 * 10**9


def test_figure_walk_sees_the_h100_fields():
    paths = set(figure_paths(raw_device("h100-sxm")))
    assert {"clock", "tdp", "compute.bf16", "matrix_unit.m", "tile.k", "tiers.hbm.bandwidth",
            "tiers.hbm.sustained_bandwidth", "tiers.sram.granularity", "layout.policy",
            "overheads.op_launch", "link.max_chips", "host_link.bandwidth",
            "energy.per_flop"} <= paths


@pytest.mark.parametrize("text,ok", [
    ("[V] vendor sheet", True), ("[I/E] measured", True), ("[?] disputed", True),
    ("vendor sheet", False), ("[X] nope", False), ("[v] lower case", False)])
def test_tag_pattern(text, ok):
    assert bool(TAG.search(text)) is ok


# --- models -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", MODELS)
def test_total_params_match_published(name):
    m = memsim.model(name)
    assert m.published_params > 0
    assert abs(m.total_params / m.published_params - 1) < 0.01


def test_llama3_70b_params_closed_form():
    m = memsim.model("llama-3-70b")
    hidden, layers, ffn, vocab, q, kv = 8192, 80, 28672, 128256, 64 * 128, 8 * 128
    attention = hidden * q + 2 * hidden * kv + q * hidden
    mlp = 3 * hidden * ffn
    norms = (2 * layers + 1) * hidden
    expected = layers * (attention + mlp) + 2 * vocab * hidden + norms
    assert m.total_params == expected == 70_553_706_496
    assert m.published_params == 70.6e9
    assert m.active_params == m.total_params


def test_mixtral_8x7b_active_params():
    m = memsim.model("mixtral-8x7b")
    assert m.is_moe and (m.experts, m.experts_per_token) == (8, 2)
    assert abs(m.active_params / 12.9e9 - 1) < 0.01
    assert abs(m.total_params / 46.7e9 - 1) < 0.01
    # active differs from total by exactly six experts' FFNs per layer
    assert m.total_params - m.active_params == 32 * 6 * 3 * 4096 * 14336


@pytest.mark.parametrize("name", [n for n in MODELS if memsim.model(n).is_moe])
def test_moe_active_params_match_published(name):
    """Every MoE model matches its published active count, or its source says why not."""
    m = memsim.model(name)
    if m.published_active_params == 0:
        assert "no published_active_params" in m.source
        return
    assert abs(m.active_params / m.published_active_params - 1) < 0.01


def test_deepseek_style_shape():
    m = memsim.model("deepseek-v3-style")
    assert (m.experts, m.experts_per_token, m.shared_experts, m.dense_layers) == (256, 8, 1, 3)
    assert m.moe_layers == 58 and not m.is_moe_layer(2) and m.is_moe_layer(3)
    assert m.kv_elements_per_token() == 61 * 576
    routed = 58 * 248 * 3 * 7168 * 2048                  # the experts a token does not use
    assert m.total_params - m.active_params == routed


@pytest.mark.parametrize(("name", "kib"), [
    ("llama-3-8b", 128), ("llama-3-70b", 320), ("llama-3.1-405b", 504), ("llama-3.2-1b", 32)])
def test_kv_cache_per_token_bf16(name, kib):
    m = memsim.model(name)
    assert m.kv_elements_per_token() * 2 == kib * 1024
    assert memsim.bytes_for((m.kv_elements_per_token(),), "bf16") == kib * 1024


# --- tier templates ---------------------------------------------------------------------------

TEMPLATES = {"cxl-gen5-x16": "cxl", "lpddr5x": "lpddr", "ddr5-host": "ddr", "nvme-gen5": "nvme"}


def test_tier_template_names():
    assert set(TEMPLATES) <= set(tier_template_names())


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_tier_template_loads(name):
    table, sources = load_tier_template(name)
    assert table["kind"] == TEMPLATES[name]
    for key in ("capacity", "bandwidth", "latency", "energy", "granularity"):
        assert key in table
        assert key in sources and TAG.search(sources[key]), f"{name}: {key} has no tagged source"
    dev = memsim.device("h100-sxm").with_tier(name)
    assert dev.tiers[-1].kind == TEMPLATES[name]
    assert dev.tiers[-1].capacity == memsim.parse_quantity(table["capacity"], "capacity",
                                                           field="tier.capacity")
