"""Tests of loading device and model files: every mistake is a ConfigError naming file and field.

Broken files are made from a catalog file: its raw TOML is parsed, one thing is changed in the
dict, and the dict is written back to a temporary file with the small TOML writer below.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

import memsim
from memsim import ConfigError, load_device, load_model

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


# --- a tiny TOML writer -----------------------------------------------------------------------

def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list) and not any(isinstance(x, dict) for x in v):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):       # a table inside a table: an inline table ([issue] pipes)
        return "{" + ", ".join(f"{json.dumps(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {v!r}")


def dump_toml(data: dict[str, Any]) -> str:
    """Scalars first, then [tables], then [[arrays of tables]]; one level of nesting suffices."""
    lines: list[str] = []
    tables, arrays = [], []
    for key, v in data.items():
        if isinstance(v, dict):
            tables.append((key, v))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            arrays.append((key, v))
        else:
            lines.append(f"{json.dumps(key)} = {_value(v)}")
    for key, table in tables:
        lines.append(f"\n[{json.dumps(key)}]")
        lines += [f"{json.dumps(k)} = {_value(x)}" for k, x in table.items()]
    for key, items in arrays:
        for table in items:
            lines.append(f"\n[[{json.dumps(key)}]]")
            lines += [f"{json.dumps(k)} = {_value(x)}" for k, x in table.items()]
    return "\n".join(lines) + "\n"


def raw_device(name: str = "h100-sxm") -> dict[str, Any]:
    text = (resources.files("memsim.devices") / f"{name}.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def raw_model(name: str) -> dict[str, Any]:
    text = (resources.files("memsim.models") / f"{name}.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def tier(data: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in data["tiers"] if t["name"] == name)


def write(tmp_path: Path, data: dict[str, Any], stem: str = "h100-sxm") -> Path:
    path = tmp_path / f"{stem}.toml"
    path.write_text(dump_toml(data), encoding="utf-8")
    return path


def device_error(tmp_path: Path, data: dict[str, Any]) -> tuple[ConfigError, Path]:
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        load_device(path)
    assert str(path) in str(info.value)
    assert info.value.file == str(path)
    return info.value, path


def test_writer_round_trips_the_catalog(tmp_path):
    for name in memsim.device_names():
        data = raw_device(name)
        assert tomllib.loads(dump_toml(data)) == data
        dev = load_device(write(tmp_path, data, stem=name))
        catalog = memsim.device(name)
        assert dev.file != catalog.file
        assert dataclasses.replace(dev, file=catalog.file) == catalog


# --- broken device files ----------------------------------------------------------------------

def test_missing_clock(tmp_path):
    data = raw_device()
    del data["clock"]
    err, _ = device_error(tmp_path, data)
    assert err.field == "clock"
    assert "missing" in str(err)


def test_missing_tier_field(tmp_path):
    data = raw_device()
    del tier(data, "hbm")["latency"]
    err, _ = device_error(tmp_path, data)
    assert err.field == "tiers.hbm.latency"


def test_capacity_given_as_a_bandwidth(tmp_path):
    data = raw_device()
    tier(data, "hbm")["capacity"] = "3.35 TB/s"
    err, _ = device_error(tmp_path, data)
    assert err.field == "tiers.hbm.capacity"
    assert "'3.35 TB/s'" in str(err)
    assert "capacity" in err.reason


@pytest.mark.parametrize("value", ["-3.35 TB/s", "0 TB/s"])
def test_non_positive_bandwidth(tmp_path, value):
    data = raw_device()
    tier(data, "hbm")["bandwidth"] = value
    err, _ = device_error(tmp_path, data)
    assert err.field == "tiers.hbm.bandwidth"
    assert value in str(err)


def test_bandwidth_without_unit(tmp_path):
    data = raw_device()
    tier(data, "hbm")["bandwidth"] = 3.35e12
    err, _ = device_error(tmp_path, data)
    assert err.field == "tiers.hbm.bandwidth"


def test_unknown_tier_kind(tmp_path):
    data = raw_device()
    tier(data, "hbm")["kind"] = "dram"
    err, _ = device_error(tmp_path, data)
    assert err.field == "tiers.hbm.kind"
    assert "'dram'" in str(err)
    for kind in ("sram", "hbm", "lpddr", "ddr", "cxl", "nvme"):
        assert kind in err.reason


@pytest.mark.parametrize("key", ["weights", "kv", "spill"])
def test_layout_names_a_missing_tier(tmp_path, key):
    data = raw_device()
    data["layout"][key] = "cxl"
    err, _ = device_error(tmp_path, data)
    assert err.field == f"layout.{key}"
    assert "'cxl'" in str(err)


def test_activations_must_live_on_chip(tmp_path):
    data = raw_device()
    data["layout"]["activations"] = "hbm"
    err, _ = device_error(tmp_path, data)
    assert err.field == "layout.activations"


def test_unknown_layout_policy(tmp_path):
    data = raw_device()
    data["layout"]["policy"] = "magic"
    err, _ = device_error(tmp_path, data)
    assert err.field == "layout.policy"


def test_malformed_toml(tmp_path):
    text = (resources.files("memsim.devices") / "h100-sxm.toml").read_text(encoding="utf-8")
    path = tmp_path / "h100-sxm.toml"
    path.write_text(text.replace('clock = "1.83 GHz"', 'clock = "1.83 GHz'), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_device(path)
    assert info.value.file == str(path)
    assert str(path) in str(info.value)
    assert "TOML" in str(info.value)


def test_missing_file(tmp_path):
    path = tmp_path / "absent.toml"
    with pytest.raises(ConfigError) as info:
        load_device(path)
    assert str(path) in str(info.value)
    with pytest.raises(ConfigError):
        memsim.device(str(path))


TOP_KEYS = ("schema_version", "name", "display_name", "vendor", "clock", "cores", "core_name",
            "core_memory", "tdp", "compute", "matrix_unit", "tile", "tiers", "layout",
            "overheads", "link", "host_link", "energy", "sources")
TIER_KEYS = ("name", "kind", "capacity", "bandwidth", "sustained_bandwidth", "latency", "energy",
             "granularity", "note")


def test_unknown_top_level_key_lists_valid_keys(tmp_path):
    data = raw_device()
    data["clok"] = "1.83 GHz"
    err, _ = device_error(tmp_path, data)
    assert err.field == "clok"
    for key in TOP_KEYS:
        assert key in err.reason


def test_unknown_tier_key_lists_valid_keys(tmp_path):
    data = raw_device()
    tier(data, "hbm")["bandwith"] = "3 TB/s"
    err, _ = device_error(tmp_path, data)
    assert err.field == "tiers.hbm.bandwith"
    for key in TIER_KEYS:
        assert key in err.reason


def test_unknown_compute_class(tmp_path):
    data = raw_device()
    data["compute"]["fp3"] = "1 TFLOPS"
    err, _ = device_error(tmp_path, data)
    assert err.field == "compute.fp3"
    for key in ("bf16", "fp8", "int4", "vector"):
        assert key in err.reason


def test_sustained_bandwidth_above_peak(tmp_path):
    data = raw_device()
    tier(data, "hbm")["sustained_bandwidth"] = "3.4 TB/s"
    err, _ = device_error(tmp_path, data)
    assert err.field == "tiers.hbm.sustained_bandwidth"


def test_sustained_bandwidth_equal_to_peak_is_fine(tmp_path):
    data = raw_device()
    tier(data, "hbm")["sustained_bandwidth"] = "3.35 TB/s"
    dev = load_device(write(tmp_path, data))
    assert dev.tier("hbm").sustained_bandwidth == dev.tier("hbm").bandwidth == 3.35e12


def test_sustained_bandwidth_defaults_to_a_sourced_fraction_of_the_peak(tmp_path):
    """Issue 13 item 6: a spec-sheet file without a measured figure is not silently optimistic."""
    from memsim.device import SUSTAINED_FRACTION
    data = raw_device()
    del tier(data, "hbm")["sustained_bandwidth"]
    dev = load_device(write(tmp_path, data))
    hbm = dev.tier("hbm")
    assert hbm.sustained_bandwidth == 3.35e12 * SUSTAINED_FRACTION["hbm"] < hbm.bandwidth
    assert hbm.sustained_defaulted
    assert not memsim.device("h100-sxm").tier("hbm").sustained_defaulted


def test_a_bandwidth_what_if_keeps_a_defaulted_sustained_figure_defaulted(tmp_path):
    data = raw_device()
    del tier(data, "hbm")["sustained_bandwidth"]
    dev = load_device(write(tmp_path, data)).with_overrides({"tiers.hbm.bandwidth": "4 TB/s"})
    assert dev.tier("hbm").sustained_defaulted
    assert dev.tier("hbm").sustained_bandwidth == pytest.approx(4e12 * 0.82)


def test_a_bandwidth_what_if_on_a_sustained_equal_to_peak_keeps_them_equal():
    dev = memsim.device("wse-3").with_overrides({"tiers.ddr.bandwidth": "300 GB/s"})
    assert dev.tier("ddr").sustained_bandwidth == dev.tier("ddr").bandwidth == 300e9


def test_first_tier_must_be_sram(tmp_path):
    data = raw_device()
    data["tiers"] = [tier(data, "hbm")]
    data["layout"]["activations"] = "hbm"
    err, _ = device_error(tmp_path, data)
    assert err.field in ("tiers.0.kind", "tiers.hbm.kind")
    assert "sram" in err.reason


def test_duplicate_tier_names(tmp_path):
    data = raw_device()
    extra = copy.deepcopy(tier(data, "hbm"))
    extra["capacity"] = "160 GB"
    extra["bandwidth"] = "1 TB/s"
    del extra["sustained_bandwidth"]
    data["tiers"].append(extra)
    err, _ = device_error(tmp_path, data)
    assert err.field is not None and err.field.startswith("tiers.")
    assert err.field.endswith(".name")
    assert "'hbm'" in err.reason


def _faster_smaller_outer(data: dict[str, Any]) -> None:
    # an outer tier with more bandwidth than the SRAM inside it and less capacity
    tier(data, "hbm")["capacity"] = "40 MB"
    tier(data, "hbm")["bandwidth"] = "12 TB/s"


def test_outer_tier_faster_and_smaller_needs_a_note(tmp_path):
    data = raw_device()
    _faster_smaller_outer(data)
    err, _ = device_error(tmp_path, data)
    assert err.field == "tiers.hbm"
    assert "note" in err.reason


def test_outer_tier_faster_and_smaller_with_a_note_loads(tmp_path):
    data = raw_device()
    _faster_smaller_outer(data)
    tier(data, "hbm")["note"] = "a what-if: HBM4 stack faster than this L2"
    dev = load_device(write(tmp_path, data))
    assert dev.tier("hbm").bandwidth == 12e12
    assert dev.tier("hbm").capacity == 40_000_000


def test_outer_tier_only_faster_or_only_smaller_is_fine(tmp_path):
    data = raw_device()
    tier(data, "hbm")["bandwidth"] = "6 TB/s"           # faster but larger
    assert load_device(write(tmp_path, data)).tier("hbm").bandwidth == 6e12
    data = raw_device()
    tier(data, "hbm")["capacity"] = "40 MB"             # smaller but slower
    assert load_device(write(tmp_path, data)).tier("hbm").capacity == 40_000_000


def test_granularity_larger_than_tier(tmp_path):
    data = raw_device()
    tier(data, "sram")["granularity"] = "64 MB"
    err, _ = device_error(tmp_path, data)
    assert err.field == "tiers.sram.granularity"


def test_schema_version(tmp_path):
    data = raw_device()
    data["schema_version"] = 2
    err, _ = device_error(tmp_path, data)
    assert err.field == "schema_version"


def test_cores_must_be_a_positive_integer(tmp_path):
    data = raw_device()
    data["cores"] = 0
    err, _ = device_error(tmp_path, data)
    assert err.field == "cores"
    data["cores"] = "132"
    err, _ = device_error(tmp_path, data)
    assert err.field == "cores"


def test_link_topology(tmp_path):
    data = raw_device()
    data["link"]["topology"] = "star"
    err, _ = device_error(tmp_path, data)
    assert err.field == "link.topology"


def test_loaded_values_in_si(tmp_path):
    data = raw_device()
    tier(data, "hbm")["capacity"] = "96 GiB"
    dev = load_device(write(tmp_path, data))
    assert dev.tier("hbm").capacity == 96 * 2**30
    assert dev.tier("hbm").latency_s == 500e-9
    assert dev.tier("hbm").energy_j_per_byte == pytest.approx(8 * 4e-12, rel=1e-12)
    assert dev.clock_hz == 1.83e9
    assert dev.core_memory == 228 * 1024


def test_a_user_file_may_be_named_freely(tmp_path):
    """Only the catalog ties ``name`` to the file stem (tests/test_catalog.py); a user's copy
    such as my-h100.toml keeps the name it was given."""
    path = write(tmp_path, raw_device(), stem="my-h100")
    assert load_device(path).name == "h100-sxm"


# --- broken model files -----------------------------------------------------------------------

def model_error(tmp_path: Path, data: dict[str, Any], stem: str) -> ConfigError:
    path = tmp_path / f"{stem}.toml"
    path.write_text(dump_toml(data), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_model(path)
    assert info.value.file == str(path)
    assert str(path) in str(info.value)
    return info.value


def test_model_round_trip(tmp_path):
    for name in memsim.model_names():
        data = raw_model(name)
        path = tmp_path / f"{name}.toml"
        path.write_text(dump_toml(data), encoding="utf-8")
        assert load_model(path) == memsim.model(name)


def test_model_missing_layers(tmp_path):
    data = raw_model("llama-3-70b")
    del data["layers"]
    err = model_error(tmp_path, data, "llama-3-70b")
    assert err.field == "layers"


def test_model_heads_not_a_multiple_of_kv_heads(tmp_path):
    data = raw_model("llama-3-70b")
    data["kv_heads"] = 7
    err = model_error(tmp_path, data, "llama-3-70b")
    assert err.field == "kv_heads"
    assert "64" in err.reason and "7" in err.reason


def test_model_zero_kv_heads(tmp_path):
    data = raw_model("llama-3-70b")
    data["kv_heads"] = 0
    err = model_error(tmp_path, data, "llama-3-70b")
    assert err.field == "kv_heads"


def test_model_experts_per_token_above_experts(tmp_path):
    data = raw_model("mixtral-8x7b")
    data["moe"]["experts_per_token"] = 9
    err = model_error(tmp_path, data, "mixtral-8x7b")
    assert err.field == "moe.experts_per_token"


def test_model_unknown_key(tmp_path):
    data = raw_model("llama-3-8b")
    data["n_layers"] = 32
    err = model_error(tmp_path, data, "llama-3-8b")
    assert err.field == "n_layers"
    assert "layers" in err.reason and "kv_heads" in err.reason


def test_model_layers_not_an_integer(tmp_path):
    data = raw_model("llama-3-8b")
    data["layers"] = 32.5
    err = model_error(tmp_path, data, "llama-3-8b")
    assert err.field == "layers"


# --- what-ifs: overrides, added and removed tiers ---------------------------------------------

def test_override_hbm_bandwidth():
    dev = memsim.device("h100-sxm")
    new = dev.with_overrides({"tiers.hbm.bandwidth": "5 TB/s"})
    assert new.tier("hbm").bandwidth == 5e12
    assert new.tier("hbm").capacity == 80e9
    assert new.tier("sram") == dev.tier("sram")
    # the original is unchanged, object and raw data alike
    assert dev.tier("hbm").bandwidth == 3.35e12
    assert dev.data["tiers"][1]["bandwidth"] == "3.35 TB/s"
    assert memsim.device("h100-sxm").tier("hbm").bandwidth == 3.35e12


def test_override_top_level_and_table_fields():
    dev = memsim.device("h100-sxm")
    new = dev.with_overrides({"clock": "2 GHz", "compute.bf16": "1 PFLOPS",
                              "tiers.sram.capacity": "256 MiB"})
    assert new.clock_hz == 2e9
    assert new.peak("bf16") == 1e15
    assert new.tier("sram").capacity == 256 * 2**20
    assert dev.clock_hz == 1.83e9


@pytest.mark.parametrize(("path", "value"), [
    ("tiers.hbm.bandwidth", "5 GHz"),
    ("tiers.hbm.bandwidth", "-5 TB/s"),
    ("tiers.hbm.bandwidth", 5e12),
    ("tiers.hbm.bandwdith", "5 TB/s"),
    ("tiers.hbm", "5 TB/s"),
    ("nosuch.table", 1),
    ("compute.bf16.x", 1),
    ("clock", None),
    ("clokc", "2 GHz"),
    ("layout.kv", "cxl"),
])
def test_bad_override(path, value):
    dev = memsim.device("h100-sxm")
    with pytest.raises(ConfigError) as info:
        dev.with_overrides({path: value})
    assert info.value.field == path
    assert path in str(info.value)
    assert dev.tier("hbm").bandwidth == 3.35e12


def test_override_of_a_missing_tier_names_the_path():
    dev = memsim.device("h100-sxm")
    with pytest.raises(ConfigError) as info:
        dev.with_overrides({"tiers.nope.bandwidth": "5 TB/s"})
    assert info.value.field == "tiers.nope.bandwidth"


def test_override_of_a_missing_tier_is_an_error():
    with pytest.raises(ConfigError) as info:
        memsim.device("h100-sxm").with_overrides({"tiers.nope.bandwidth": "5 TB/s"})
    assert "'nope'" in str(info.value)


def test_override_of_peak_bandwidth_scales_the_sustained_figure():
    dev = memsim.device("h100-sxm")
    hbm = dev.tier("hbm")
    lowered = dev.with_overrides({"tiers.hbm.bandwidth": "2 TB/s"}).tier("hbm")
    assert lowered.bandwidth == 2e12
    assert lowered.sustained_bandwidth == pytest.approx(
        2e12 * hbm.sustained_bandwidth / hbm.bandwidth, rel=1e-15)
    both = dev.with_overrides({"tiers.hbm.bandwidth": "5 TB/s",
                               "tiers.hbm.sustained_bandwidth": "4 TB/s"}).tier("hbm")
    assert (both.bandwidth, both.sustained_bandwidth) == (5e12, 4e12)


def test_override_sustained_above_peak_is_caught():
    with pytest.raises(ConfigError) as info:
        memsim.device("h100-sxm").with_overrides({"tiers.hbm.sustained_bandwidth": "4 TB/s"})
    assert info.value.field == "tiers.hbm.sustained_bandwidth"


def test_with_tier_adds_outermost():
    dev = memsim.device("h100-sxm")
    new = dev.with_tier("cxl-gen5-x16")
    assert new.tier_names == ("sram", "hbm", "cxl")
    cxl = new.tiers[-1]
    assert (cxl.name, cxl.kind) == ("cxl", "cxl")
    assert cxl.capacity == 512 * 10**9
    assert cxl.bandwidth == 64e9
    assert cxl.sustained_bandwidth == 48e9
    assert cxl.latency_s == 1.7e-6
    assert cxl.granularity == 64
    assert new.source("tiers.cxl.capacity").startswith("[V]")
    assert dev.tier_names == ("sram", "hbm")
    assert new.tiers[:2] == dev.tiers


def test_with_tier_named_and_twice():
    dev = memsim.device("h100-sxm").with_tier("cxl-gen5-x16")
    with pytest.raises(ConfigError) as info:
        dev.with_tier("cxl-gen5-x16")
    assert info.value.field.endswith(".name")
    two = dev.with_tier("cxl-gen5-x16", name="cxl2")
    assert two.tier_names == ("sram", "hbm", "cxl", "cxl2")


def test_with_tier_inside_hbm_breaks_the_order_rule():
    with pytest.raises(ConfigError) as info:
        memsim.device("h100-sxm").with_tier("cxl-gen5-x16", after="sram")
    assert info.value.field == "tiers.hbm"


def test_with_unknown_tier_template():
    with pytest.raises(ConfigError) as info:
        memsim.device("h100-sxm").with_tier("optane")
    for name in ("cxl-gen5-x16", "lpddr5x", "ddr5-host", "nvme-gen5"):
        assert name in str(info.value)


def test_without_tier():
    dev = memsim.device("h100-sxm").with_tier("nvme-gen5")
    assert dev.without_tier("nvme").tier_names == ("sram", "hbm")
    assert dev.tier_names == ("sram", "hbm", "nvme")


@pytest.mark.parametrize(("name", "field"), [("hbm", "layout.weights")])
def test_without_a_tier_the_layout_uses(name, field):
    with pytest.raises(ConfigError) as info:
        memsim.device("h100-sxm").without_tier(name)
    assert info.value.field == field
    assert info.value.field.startswith("layout.")


def test_without_a_tier_named_in_spill():
    dev = memsim.device("h100-sxm").with_tier("cxl-gen5-x16").with_overrides(
        {"layout.spill": "cxl"})
    assert dev.layout.spill == "cxl"
    with pytest.raises(ConfigError) as info:
        dev.without_tier("cxl")
    assert info.value.field == "layout.spill"


def test_without_unknown_tier():
    with pytest.raises(ConfigError) as info:
        memsim.device("h100-sxm").without_tier("nope")
    assert "'nope'" in str(info.value)


# --- unknown catalog names --------------------------------------------------------------------

def test_unknown_device_lists_the_catalog():
    with pytest.raises(ConfigError) as info:
        memsim.device("nope")
    assert "'nope'" in str(info.value)
    for name in memsim.device_names():
        assert name in str(info.value)
    assert "h100-sxm" in str(info.value)


def test_unknown_model_lists_the_catalog():
    with pytest.raises(ConfigError) as info:
        memsim.model("nope")
    assert "'nope'" in str(info.value)
    for name in memsim.model_names():
        assert name in str(info.value)
    assert "llama-3-70b" in str(info.value)


def test_sustained_compute_above_the_peak_is_refused(tmp_path):
    data = raw_device()
    data["sustained_compute"] = {"bf16": "2000 TFLOPS"}
    err, _ = device_error(tmp_path, data)
    assert err.field == "sustained_compute.bf16" and "exceeds the peak" in err.reason
    data["sustained_compute"] = {"fp4": "1 TFLOPS"}          # not a native class of the device
    err, _ = device_error(tmp_path, data)
    assert err.field.startswith("sustained_compute")


def test_a_peak_what_if_keeps_the_measured_matmul_ratio():
    """Raising the BF16 peak scales the measured achievable rate with it (as a bandwidth what-if
    scales its tier's sustained bandwidth); classes without a measured rate run at the peak."""
    dev = memsim.device("h100-sxm")
    ratio = dev.matmul_rate("bf16") / dev.peak("bf16")
    assert 0.5 < ratio < 1
    faster = dev.with_overrides({"compute.bf16": "2000 TFLOPS"})
    assert faster.matmul_rate("bf16") == pytest.approx(2e15 * ratio)
    pinned = dev.with_overrides({"compute.bf16": "2000 TFLOPS",
                                 "sustained_compute.bf16": "1500 TFLOPS"})
    assert pinned.matmul_rate("bf16") == pytest.approx(1.5e15)
    assert dev.matmul_rate("tf32") == dev.peak("tf32")
