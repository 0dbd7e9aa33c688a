"""Bad input ends in one ConfigError naming file and field (issue 18 items 9-12 and 16).

Each test is a reproduction from the issue, and a class of input around it: encodings and
nesting of every data file, figures that would make infinities, integers past int64, fractional
bytes, device-file mistakes blamed on the wrong field, and broken routing traces.
"""

from __future__ import annotations

import zipfile

import numpy as np
import pytest

import memsim
from memsim import ConfigError, load_device, load_model
from memsim.cli import main
from memsim.datafile import read_toml_file
from memsim.routing import load_trace, parse_routing
from memsim.study import load_study
from tests.test_loading import device_error, dump_toml, raw_device, raw_model, tier, write

LOADERS = {"device": load_device, "model": load_model, "study": load_study}


def _text(kind: str) -> str:
    if kind == "device":
        return dump_toml(raw_device())
    if kind == "model":
        return dump_toml(raw_model("llama-3-8b"))
    return 'name = "s"\n[grid]\ndevice = ["h100-sxm"]\nmodel = ["llama-3.2-1b"]\n'


ENCODINGS = {
    "utf-8 with BOM": (lambda text: b"\xef\xbb\xbf" + text.encode("utf-8"), "byte-order mark"),
    "utf-16": (lambda text: text.encode("utf-16"), "UTF-16"),
    "utf-16-be": (lambda text: b"\xfe\xff" + text.encode("utf-16-be"), "UTF-16"),
    "binary": (lambda text: bytes(range(256)) * 4, "binary"),
    "latin-1": (lambda text: ("# caf\u00e9\n" + text).encode("latin-1"), "not UTF-8"),
}


@pytest.mark.parametrize("kind", sorted(LOADERS))
@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
def test_files_that_are_not_utf8_text_are_one_config_error(tmp_path, kind, encoding):
    """Issue 18 item 10: UnicodeDecodeError or 'Invalid statement' before."""
    encode, words = ENCODINGS[encoding]
    path = tmp_path / f"{kind}.toml"
    path.write_bytes(encode(_text(kind)))
    with pytest.raises(ConfigError) as info:
        LOADERS[kind](path)
    assert info.value.file == str(path) and words in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("nested", ["a = " + "[" * 5000 + "]" * 5000,
                                    "a = " + "{b = " * 5000 + "1" + "}" * 5000,
                                    "a = " + "[" * 40 + "]" * 40])
def test_absurd_nesting_is_one_config_error(tmp_path, nested):
    """Issue 18 item 10: TOML nested 5,000 deep raised RecursionError."""
    path = tmp_path / "deep.toml"
    path.write_text(nested + "\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        read_toml_file(path)
    assert info.value.file == str(path) and "nested" in str(info.value)


def test_the_cli_shows_a_bad_encoding_in_one_line_with_exit_code_2(tmp_path, capsys):
    path = tmp_path / "dev.toml"
    path.write_bytes(_text("device").encode("utf-16"))
    assert main(["show", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "UTF-16" in err


# --- figures that made infinities (item 9) and integers past int64 (item 11) --------------------

FIGURES = [("compute", "bf16", "1e-300 FLOPS"), ("energy", "per_flop", "1e300 J/FLOP"),
           (None, "clock", "1e-30 Hz"), ("tiers.hbm", "latency", "1e300 s"),
           ("tiers.hbm", "capacity", "9.3 EB"), ("tiers.hbm", "capacity", "1e10 GB"),
           ("tiers.sram", "capacity", "2 EB"), (None, "cores", 99999999999999999999),
           (None, "cores", 9223372036854775807), ("tile", "n", 2**64),
           ("tiers.sram", "granularity", "0.5 B"), ("tiers.sram", "granularity", "0.9 B"),
           (None, "core_memory", "0.5 B"), (None, "tdp", "0 W")]


def _table(data, where):
    if where is None:
        return data
    if where.startswith("tiers."):
        return tier(data, where.split(".")[1])
    return data[where]


@pytest.mark.parametrize("where,key,value", FIGURES)
def test_figures_outside_their_range_are_refused_at_their_field(tmp_path, where, key, value):
    data = raw_device()
    _table(data, where)[key] = value
    if key == "capacity" and where == "tiers.sram":
        data["tiers"] = data["tiers"][:1]
        data["layout"].update(policy="sram-resident", weights="sram", kv="sram")
    err, _ = device_error(tmp_path, data)
    assert err.field == (f"{where}.{key}" if where else key)
    assert "docs/limits.md" in err.reason or "whole number of bytes" in err.reason \
        or "positive" in err.reason


def test_the_same_figures_are_refused_through_a_what_if():
    h100 = memsim.device("h100-sxm")
    for path, value in [("compute.bf16", "1e-300 FLOPS"), ("energy.per_flop", "1e300 J/FLOP"),
                        ("clock", "1e-30 Hz"), ("tiers.hbm.latency", "1e300 s"),
                        ("tiers.sram.capacity", "2 EB"), ("tiers.hbm.granularity", "0.5 B")]:
        with pytest.raises(ConfigError) as info:
            h100.with_overrides({path: value})
        assert info.value.field == path


def test_a_huge_bandwidth_what_if_is_blamed_on_the_field_given():
    """Issue 18 item 16: --set tiers.hbm.bandwidth=1e308B/s blamed sustained_bandwidth."""
    with pytest.raises(ConfigError) as info:
        memsim.device("h100-sxm").with_overrides({"tiers.hbm.bandwidth": "1e308B/s"})
    assert info.value.field == "tiers.hbm.bandwidth"


# --- device-file mistakes of item 16 ------------------------------------------------------------

@pytest.mark.parametrize("version", [True, 1.0, "1", 2])
def test_schema_version_must_be_the_integer_1(tmp_path, version):
    data = raw_device()
    data["schema_version"] = version
    err, _ = device_error(tmp_path, data)
    assert err.field == "schema_version"


@pytest.mark.parametrize("spill", ["sram", "hbm"])
def test_spill_must_lie_further_out_than_the_weights(tmp_path, spill):
    data = raw_device()
    data["layout"]["spill"] = spill
    err, _ = device_error(tmp_path, data)
    assert err.field == "layout.spill" and "further out" in err.reason


def test_spill_further_out_is_accepted(tmp_path):
    data = raw_device("gb200")
    data["layout"]["spill"] = "lpddr"
    assert load_device(write(tmp_path, data, "gb200")).layout.spill == "lpddr"


@pytest.mark.parametrize("name", [7, True, 1.5, ""])
def test_a_tier_name_that_is_not_text_is_a_type_error_at_its_position(tmp_path, name):
    data = raw_device()
    data["tiers"][1]["name"] = name
    err, _ = device_error(tmp_path, data)
    assert err.field == "tiers.1.name" and "string" in err.reason


def test_a_one_byte_hbm_is_blamed_on_its_capacity(tmp_path):
    data = raw_device()
    tier(data, "hbm")["capacity"] = "1 B"
    err, _ = device_error(tmp_path, data)
    assert err.field == "tiers.hbm.capacity" and "granularity" in err.reason


@pytest.mark.parametrize("idle", ["0 W", "701 W", "70", "70 J"])
def test_idle_power_lies_between_zero_and_the_tdp(tmp_path, idle):
    data = raw_device()
    data["idle_power"] = idle
    err, _ = device_error(tmp_path, data)
    assert err.field == "idle_power"


# --- catalog parsed once (issue 16 item 2) ------------------------------------------------------

def test_a_catalog_device_is_parsed_once_and_shared():
    assert memsim.device("h100-sxm") is memsim.device("h100-sxm")
    what_if = memsim.device("h100-sxm").with_overrides({"tiers.hbm.bandwidth": "4 TB/s"})
    assert what_if is not memsim.device("h100-sxm")
    assert memsim.device("h100-sxm").tier("hbm").bandwidth == 3.35e12
    with pytest.raises(ConfigError):
        memsim.device("no-such-device")


# --- routing traces (item 12) -------------------------------------------------------------------

MIXTRAL = "mixtral-8x7b"


def _trace_error(path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_trace(str(path), memsim.model(MIXTRAL))
    assert info.value.field == "routing" and info.value.file == str(path)
    return info.value


def test_an_empty_npy_is_one_config_error(tmp_path):
    path = tmp_path / "empty.npy"
    path.write_bytes(b"")
    _trace_error(path)


def test_an_npz_renamed_npy_is_one_config_error(tmp_path):
    path = tmp_path / "trace.npz"
    np.savez(path, a=np.zeros((1, 32, 1, 2), dtype=np.int64))
    renamed = path.rename(tmp_path / "trace.npy")
    assert zipfile.is_zipfile(renamed)
    assert ".npz" in str(_trace_error(renamed))


@pytest.mark.parametrize("shape", [(0, 32, 1, 2), (1, 32, 0, 2), (32, 0, 2)])
def test_a_trace_with_no_steps_or_no_tokens_is_refused(tmp_path, shape):
    path = tmp_path / "zero.npy"
    np.save(path, np.zeros(shape, dtype=np.int64))
    assert "empty" in str(_trace_error(path))


def test_a_header_claiming_a_huge_shape_is_refused_before_reading(tmp_path):
    """The header says (10^6, 32, 10^3, 2); the file holds no data at all."""
    path = tmp_path / "huge.npy"
    header = {"descr": "<i8", "fortran_order": False, "shape": (10**6, 32, 10**3, 2)}
    with open(path, "wb") as handle:
        np.lib.format.write_array_header_1_0(handle, header)
    assert "limit" in str(_trace_error(path))


def test_a_truncated_trace_is_one_config_error(tmp_path):
    path = tmp_path / "cut.npy"
    np.save(path, np.zeros((4, 32, 1, 2), dtype=np.int64))
    path.write_bytes(path.read_bytes()[:-100])
    _trace_error(path)


@pytest.mark.parametrize("spec", ["zipf:inf", "zipf:nan", "zipf:-inf", "zipf:1e9", "zipf:0"])
def test_zipf_exponents_must_be_finite_and_bounded(spec):
    with pytest.raises(ConfigError) as info:
        parse_routing(spec)
    assert info.value.field == "routing"


def test_a_valid_trace_still_loads(tmp_path):
    path = tmp_path / "ok.npy"
    trace = np.tile(np.array([0, 1], dtype=np.int64), (2, 32, 3, 1))
    np.save(path, trace)
    assert load_trace(str(path), memsim.model(MIXTRAL)).shape == (2, 32, 3, 2)


@pytest.mark.parametrize("path", ["sources", "runtime.sources"])
def test_a_what_if_of_a_files_whole_sources_table_is_one_clear_error(path, capsys):
    """`--set sources=5` ended in a TypeError traceback (one citation, sources.FIELD, is a
    label a what-if may set)."""
    assert main(["run", "h100-sxm", "llama-3.2-1b", "--set", f"{path}=5"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "citations" in err and len(err.splitlines()) == 1
    with pytest.raises(ConfigError, match="citations"):
        memsim.device("h100-sxm").with_overrides({path: "5"})
