"""The command line: catalogs, a run, what-ifs, and one-line errors with exit code 2."""

from __future__ import annotations

import json

import pytest

from memsim.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_devices_lists_the_catalog_with_its_columns(capsys):
    code, out, _ = run(capsys, "devices")
    assert code == 0
    for column in ("on-chip SRAM", "main memory", "bandwidth", "BF16 peak",
                   "lowest-precision peak", "ridge FLOP/B"):
        assert column in out
    assert len(out.strip().splitlines()) >= 2 + 15
    code, out, _ = run(capsys, "devices", "--json")
    rows = json.loads(out)
    h100 = next(r for r in rows if r["name"] == "h100-sxm")
    assert h100["main_memory_bandwidth"] == 3.35e12
    assert h100["ridge_flop_per_byte"] == pytest.approx(989.4e12 / 3.35e12)


@pytest.mark.parametrize("command", ["models", "formats"])
def test_catalog_commands_have_json(capsys, command):
    code, out, _ = run(capsys, command, "--json")
    assert code == 0 and json.loads(out)


def test_formats_print_exact_bits_per_weight(capsys):
    _, out, _ = run(capsys, "formats", "--json")
    bits = {row["name"]: row["bits_per_element_k4096"] for row in json.loads(out)}
    assert bits["int4-g128"] == 4.15625 and bits["nvfp4"] == 4.5 and bits["q8_0"] == 8.5


def test_show_prints_sources(capsys):
    code, out, _ = run(capsys, "show", "h100-sxm")
    assert code == 0 and "tiers.hbm.bandwidth" in out and "[V]" in out


def test_run_json_gives_bytes_per_tier_and_time(capsys):
    code, out, _ = run(capsys, "run", "h100-sxm", "llama-3.2-1b", "--batch", "1", "--context",
                       "256", "--json")
    data = json.loads(out)
    assert code == 0
    assert data["bytes_read"]["hbm"] > 0 and data["time_per_token_s"] > 0
    assert len(data["ops"]) == 2 + 9 * 16 + 1


def test_set_is_a_what_if(capsys):
    _, base, _ = run(capsys, "run", "h100-sxm", "llama-3.2-1b", "--json")
    _, fast, _ = run(capsys, "run", "h100-sxm", "llama-3.2-1b", "--json",
                     "--set", "tiers.hbm.bandwidth=6.7TB/s")
    assert json.loads(fast)["time_per_token_s"] < json.loads(base)["time_per_token_s"]


def test_70b_memory_wall_through_the_cli(capsys):
    code, _, err = run(capsys, "run", "h100-sxm", "llama-3-70b", "--context", "1024",
                       "--weights", "fp16")
    assert code == 2 and "short by" in err and err.count("\n") == 1
    code, out, _ = run(capsys, "run", "h100-sxm", "llama-3-70b", "--context", "1024",
                       "--weights", "fp16", "--set", "tiers.hbm.capacity=160GB", "--json")
    assert code == 0 and 0.042 < json.loads(out)["time_per_token_s"] < 0.063


@pytest.mark.parametrize("argv, field", [
    (("run", "h100-sxm", "llama-3-8b", "--weights", "int3"), "weights"),
    (("run", "h100-sxm", "llama-3-8b", "--set", "tiers.hbm.bandwidth=5"), "tiers.hbm.bandwidth"),
    (("run", "h100-sxm", "llama-3-8b", "--set", "clockk=1GHz"), "clockk"),
    (("run", "h100-sxm", "llama-3-8b", "--set", "nonsense"), "--set"),
    (("run", "nope", "llama-3-8b"), "device"),
    (("run", "h100-sxm", "nope"), "model"),
    (("run", "h100-sxm", "llama-3-8b", "--batch", "0"), "batch"),
    (("show", "nope"), "device"),
])
def test_bad_input_is_one_line_exit_2(capsys, argv, field):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert err.startswith("memsim: error:") and err.count("\n") == 1
    assert field in err
    assert "Traceback" not in err
