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


def test_plan_prints_placement_and_the_fewest_chips(capsys):
    code, out, _ = run(capsys, "plan", "groq-lpu", "llama-3.2-1b", "--weights", "int8")
    assert code == 0
    assert "policy sram-resident" in out and "fewest chips under each policy" in out
    code, out, _ = run(capsys, "plan", "h100-sxm", "llama-3-70b", "--add-tier", "cxl-gen5-x16",
                       "--json")
    data = json.loads(out)
    assert data["policy"] == "tiered" and data["chips"] == 1
    assert data["stages"][0]["weights"]["cxl"] > 0 and data["stages"][0]["spilled"]
    assert {row["policy"] for row in data["capacity"]} == {"hbm-centric", "tiered"}


def test_plan_states_an_expert_parallel_system_as_run_does(capsys):
    """`memsim plan` takes what `memsim run` takes: expert groups side by side are listed as
    groups of tp x ep, and the fewest-chips table is the dense split's (no ep)."""
    code, out, _ = run(capsys, "plan", "h100-sxm", "mixtral-8x7b", "--tp", "2", "--ep", "4",
                       "--batch", "4", "--json")
    data = json.loads(out)
    assert code == 0 and (data["tp"], data["pp"], data["ep"], data["chips"]) == (2, 1, 4, 8)
    assert len(data["stages"]) == 4 and all(row["fits"] for row in data["capacity"])
    code, out, _ = run(capsys, "plan", "h100-sxm", "mixtral-8x7b", "--tp", "2", "--ep", "4",
                       "--batch", "4")
    assert code == 0 and "tp 2 x pp 1 x ep 4" in out and "expert group" in out


def test_run_with_parallelism_and_placement(capsys):
    code, out, _ = run(capsys, "run", "h100-sxm", "llama-3-8b", "--tp", "2", "--pp", "2",
                       "--batch", "4", "--context", "256", "--json")
    data = json.loads(out)
    assert code == 0 and data["chips"] == 4 and data["link_bytes"] > 0
    code, out, _ = run(capsys, "run", "h100-sxm", "llama-3.2-1b", "--add-tier", "cxl-gen5-x16",
                       "--place", "kv=cxl", "--place", "weights[0:4]=cxl:0.5", "--json")
    data = json.loads(out)
    assert data["bytes_read"]["cxl"] > 0


@pytest.mark.parametrize("argv, field", [
    (("run", "h100-sxm", "llama-3.2-1b", "--place", "kv"), "--place"),
    (("run", "h100-sxm", "llama-3.2-1b", "--place", "kv=cxl"), "placement.kv"),
    (("run", "h100-sxm", "llama-3-70b", "--tp", "100000"), "tp"),
    (("compare", "llama-3.2-1b", "--price", "h100-sxm=free"), "--price"),
])
def test_layout_flags_fail_in_one_line(capsys, argv, field):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("memsim: error:") and field in err and len(err.splitlines()) == 1


def test_compare_covers_the_devices_asked_for(capsys):
    code, out, _ = run(capsys, "compare", "llama-3.2-1b", "--devices", "h100-sxm,groq-lpu",
                       "--price", "h100-sxm=2.5", "--json")
    rows = json.loads(out)
    assert code == 0 and [r["device"] for r in rows] == ["h100-sxm", "groq-lpu"]
    assert rows[0]["usd_per_chip_hour"] == 2.5 and rows[0]["usd_per_million_tokens"] > 0
    assert rows[1]["off_chip_weight_bytes"] == 0 and rows[1]["usd_per_million_tokens"] is None
    code, out, _ = run(capsys, "compare", "llama-3.2-1b", "--devices", "h100-sxm", "--csv")
    assert out.splitlines()[0].startswith("device,display_name,fits")
    code, out, _ = run(capsys, "compare", "llama-3.2-1b", "--devices", "tpu-v5e")
    assert "tpu-v5e" in out and "ms/tok" in out


def test_compare_llama_70b_covers_every_catalog_device(capsys):
    """The landscape's table: every device gets a configuration and a time per token, and the
    SRAM-resident machines read no weight from off chip in a warm step."""
    from memsim.device import device, device_names
    code, out, _ = run(capsys, "compare", "llama-3-70b", "--batch", "1", "--json")
    rows = {r["device"]: r for r in json.loads(out)}
    assert code == 0 and set(rows) == set(device_names())
    for name, row in rows.items():
        assert row["fits"] and row["chips"] >= 1 and row["time_per_token_s"] > 0, name
        if row["policy"] == "sram-resident":
            assert row["off_chip_weight_bytes"] == 0
        if device(name).layout.policy == "sram-resident" and row["policy"] != "sram-resident":
            assert "cannot hold" in row["note"]
    assert rows["groq-lpu"]["policy"] == rows["wse-3"]["policy"] == "sram-resident"


def test_run_prints_the_cost_of_spilling(capsys):
    code, out, _ = run(capsys, "run", "h100-sxm", "llama-3-70b", "--add-tier", "cxl-gen5-x16",
                       "--spill-cost")
    assert code == 0 and "x the time per token" in out
    code, out, _ = run(capsys, "run", "h100-sxm", "llama-3-70b", "--add-tier", "cxl-gen5-x16",
                       "--spill-cost", "--json")
    cost = json.loads(out)["spill_cost"]
    assert cost["slowdown"] > 10 and cost["baseline_bytes_read"]["hbm"] > cost["bytes_read"]["hbm"]


# One way to build a what-if (issue 15.1) ----------------------------------------------------

def _compare(capsys, *extra):
    code, out, err = run(capsys, "compare", "llama-3-8b", "--devices", "h100-sxm", "--json",
                         *extra)
    assert code == 0, err
    return json.loads(out)[0]


def test_compare_honours_set_and_the_price(capsys):
    base = _compare(capsys)
    fast = _compare(capsys, "--set", "tiers.hbm.bandwidth=10TB/s")
    cheap = _compare(capsys, "--set", "cost.usd_per_chip_hour=1")
    assert fast["time_per_token_s"] < base["time_per_token_s"]
    assert cheap["usd_per_chip_hour"] == 1.0
    assert cheap["usd_per_million_tokens"] < base["usd_per_million_tokens"]


@pytest.mark.parametrize("verb", [("compare", "llama-3.2-1b", "--devices", "h100-sxm"),
                                  ("run", "h100-sxm", "llama-3.2-1b"),
                                  ("plan", "h100-sxm", "llama-3.2-1b"),
                                  ("spec", "h100-sxm", "llama-3.2-1b", "--method", "ngram")])
def test_a_nonsense_set_fails_in_every_verb(capsys, verb):
    code, out, err = run(capsys, *verb, "--set", "nonsense.key=banana")
    assert code == 2 and "nonsense" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("path, value", [("cores", "64"), ("link.max_chips", "4"),
                                         ("tile.k", "64"), ("matrix_unit.m", "32")])
def test_integer_fields_are_set_from_the_command_line(capsys, path, value):
    code, out, err = run(capsys, "run", "h100-sxm", "llama-3.2-1b", "--context", "256",
                         "--json", "--set", f"{path}={value}")
    assert code == 0, err


def test_policy_flag_and_layout_set_give_one_answer(capsys):
    _, by_flag, err = run(capsys, "run", "h100-sxm", "llama-3.2-1b", "--policy", "hybrid",
                          "--json")
    _, by_set, _ = run(capsys, "run", "h100-sxm", "llama-3.2-1b", "--set",
                       "layout.policy=hybrid", "--json")
    assert by_flag and json.loads(by_flag)["time_per_token_s"] == \
        json.loads(by_set)["time_per_token_s"], err


def test_compare_with_an_empty_device_list_is_refused(capsys):
    code, out, err = run(capsys, "compare", "llama-3.2-1b", "--devices", "")
    assert code == 2 and "--devices" in err and out == ""


@pytest.mark.parametrize("flag", ["--tp", "--pp", "--ep"])
def test_zero_chips_are_refused_not_turned_into_one(capsys, flag):
    code, out, err = run(capsys, "run", "h100-sxm", "llama-3.2-1b", flag, "0")
    assert code == 2 and flag.strip("-") in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("argv, words", [
    (("run", "h100-sxm", "llama-3.2-1b", "--residency", "x"), ("--residency", "lru")),
    (("run", "h100-sxm"), ("model",)),
    (("run", "h100-sxm", "llama-3.2-1b", "--batch", "two"), ("--batch", "int")),
    (("bogus",), ("bogus", "run")),
])
def test_usage_errors_are_one_line_with_the_flag_and_the_choices(capsys, argv, words):
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    err = capsys.readouterr().err
    assert info.value.code == 2 and len(err.splitlines()) == 1
    assert all(w in err for w in words), err


# Decode flags come from the Decode dataclass (STYLE pattern 10) -----------------------------

def test_every_decode_field_has_a_flag_with_help_and_its_default():
    import dataclasses

    from memsim.cli import _parser
    from memsim.workload import Decode
    text = _parser()._subparsers._group_actions[0].choices["run"].format_help()
    for field in dataclasses.fields(Decode):
        flag = "--place" if field.name == "placement" else "--" + field.name.replace("_", "-")
        assert flag in text, flag
    assert "(default: 4096)" in text and "``" not in text


def test_a_new_decode_field_becomes_a_flag_without_a_cli_change(monkeypatch, capsys):
    import dataclasses

    import memsim.cli as cli
    from memsim.workload import Decode

    @dataclasses.dataclass(frozen=True)
    class Wider(Decode):
        runtime: str = dataclasses.field(default="vllm", metadata={"help": "software stack"})

    monkeypatch.setattr(cli, "Decode", Wider)
    seen = {}
    monkeypatch.setattr(cli, "decode_from", lambda fields: seen.update(fields) or Decode())
    parser = cli._parser()
    args = parser.parse_args(["run", "h100-sxm", "llama-3.2-1b", "--runtime", "trt"])
    cli._workload(args)
    assert seen["runtime"] == "trt"
    run_parser = parser._subparsers._group_actions[0].choices["run"]
    assert "software stack" in run_parser.format_help()


# Conventions (issue 15.4) --------------------------------------------------------------------

def test_version_and_python_dash_m(capsys):
    import subprocess
    import sys

    import memsim
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and memsim.__version__ in capsys.readouterr().out
    done = subprocess.run([sys.executable, "-m", "memsim", "--version"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and memsim.__version__ in done.stdout


def test_run_csv_carries_the_summary(capsys):
    code, out, _ = run(capsys, "run", "h100-sxm", "llama-3.2-1b", "--csv")
    summary = dict(line[2:].split(",", 1) for line in out.splitlines() if line.startswith("# "))
    assert code == 0 and float(summary["time_per_token_s"]) > 0
    assert summary["bottleneck"] and int(summary["weights_held"]) > 0
    import csv
    import io
    rows = list(csv.DictReader(io.StringIO("".join(
        line + "\n" for line in out.splitlines() if not line.startswith("#")))))
    assert rows and "bytes_read_hbm" in rows[0]


def test_devices_prints_binary_capacities_in_binary_units(capsys):
    _, out, _ = run(capsys, "devices")
    line = next(row for row in out.splitlines() if row.startswith("tpu-v5e"))
    assert "128 MiB" in line and "16 GiB" in line
    assert "50 MB" in next(row for row in out.splitlines() if row.startswith("h100-sxm"))


def test_compare_fits_120_columns_with_one_energy_unit(capsys):
    code, out, _ = run(capsys, "compare", "llama-3-70b")
    assert code == 0 and max(len(line) for line in out.splitlines()) <= 120
    header = next(line for line in out.splitlines() if line.startswith("device"))
    assert "mJ/tok" in header
    rows = [line for line in out.splitlines() if line.split()[:1] and
            line.split()[0] in ("h100-sxm", "groq-lpu")]
    assert rows and all(" J" not in row and "mJ" not in row for row in rows)


def test_a_capacity_error_suggests_plan_with_the_users_flags(capsys):
    code, _, err = run(capsys, "run", "h100-sxm", "llama-3-70b", "--context", "1024",
                       "--weights", "fp16", "--kv", "fp8-e4m3", "--tp", "1")
    assert code == 2 and "`memsim plan h100-sxm llama-3-70b --context 1024 --weights fp16 " \
        "--kv fp8-e4m3`" in err


def test_every_flag_of_every_verb_has_a_line_of_help():
    from memsim.cli import _parser
    verbs = _parser()._subparsers._group_actions[0].choices
    for name, verb in verbs.items():
        for action in verb._actions:
            assert action.help and action.help.strip(), f"{name} {action.option_strings}"
    text = verbs["run"].format_help()
    assert "memsim formats" in text                     # where a format is asked


def test_validate_writes_only_where_output_says(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from memsim.validate import default_folder
    docs = default_folder().parent / "docs" / "validation.md"
    before = docs.read_bytes() if docs.exists() else None
    code, out, err = run(capsys, "validate")
    assert code == 0 and out.startswith("#") and "measurements" in err
    assert (docs.read_bytes() if docs.exists() else None) == before
    assert list(tmp_path.iterdir()) == []
    code, out, _ = run(capsys, "validate", "-o", str(tmp_path / "v.md"))
    assert code == 0 and (tmp_path / "v.md").read_text().startswith("#")


def test_shell_completion_knows_the_generated_flags(capsys):
    pytest.importorskip("shtab")
    code, out, _ = run(capsys, "completion", "bash")
    assert code == 0 and "--batch" in out and "--set" in out and "hbm-centric" in out
