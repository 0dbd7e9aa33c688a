"""A what-if means the same thing from the CLI, a study file and the Python API: the same
figures, to the last bit, whichever door it comes in by (one path: :mod:`memsim.inputs`).

The study runs every what-if in one sweep, so that points differing only in timing figures
reuse one plan (:func:`memsim.plan.retarget`): the reuse must not change a figure either.
"""

from __future__ import annotations

import json

import pytest

import memsim
from memsim.cli import main
from memsim.inputs import decode_from, device_from
from memsim.store import Store
from memsim.study import load_study
from memsim.sweep import figures_of, sweep

MODEL = "llama-3.2-1b"
#: (what-ifs as --set texts, workload fields): timing figures (reused plans), figures that
#: change the plan, a runtime what-if under another runtime, list and table values.
CASES = [
    (("tiers.hbm.bandwidth=5 TB/s",), {}),
    (("tiers.hbm.latency=2 us", "energy.per_flop=0.3 pJ/FLOP"), {}),
    (("compute.bf16=300 TFLOPS",), {"batch": 64}),
    (("cores=66",), {}),
    (("tiers.sram.capacity=8 MB",), {"residency": "pinned"}),
    (("link.bandwidth=100 GB/s",), {"tp": 2}),
    (("scale_out.energy=20 pJ/bit",), {"tp": 16}),
    (("runtime.launch=20 us",), {"runtime": "hf-eager"}),
    (("runtime.collective.custom_allreduce_chips=[4, 8]",), {"tp": 2}),
    (('runtime.collective.one_shot_max_bytes={"2" = "1 kB", "4" = "1 kB", "8" = "1 kB"}',),
     {"tp": 2}),
]
FIGURES = ("time_per_token_s", "energy_per_token_j", "cycles", "bytes_read", "bytes_written",
           "hits", "misses", "link_bytes", "flops")


def _toml(value: str) -> str:
    """A what-if value as a study's set table takes it: a list there is an axis of values, so
    one list value is written inside another."""
    if value.strip()[:1] == "[":
        return f"[{value}]"
    return value if value.strip()[:1] == "{" else json.dumps(value)


def _api(sets: tuple[str, ...], workload: dict) -> dict:
    pairs = tuple(tuple(s.split("=", 1)) for s in sets)
    dev = device_from("h100-sxm", sets=pairs, runtime=workload.get("runtime", "auto"))
    report = memsim.emulate(dev, MODEL, decode_from({"context": 256, **workload}))
    return {k: figures_of(report)[k] for k in FIGURES}


def _cli(sets: tuple[str, ...], workload: dict, capsys) -> dict:
    argv = ["run", "h100-sxm", MODEL, "--context", "256", "--json"]
    for key, value in workload.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    for what_if in sets:
        argv += ["--set", what_if]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    return {k: data[k] for k in FIGURES}


@pytest.fixture(scope="module")
def studied(tmp_path_factory) -> dict[str, dict]:
    """Every case as a [[point]] of one study file, swept into one store."""
    folder = tmp_path_factory.mktemp("one-path")
    text = 'name = "one-path"\n'
    for sets, workload in CASES:
        text += f'[[point]]\ndevice = "h100-sxm"\nmodel = "{MODEL}"\ncontext = 256\n'
        text += "".join(f"{k} = {json.dumps(v)}\n" for k, v in workload.items())
        text += "[point.set]\n" + "".join(
            f'"{s.split("=", 1)[0]}" = {_toml(s.split("=", 1)[1])}\n' for s in sets)
    path = folder / "study.toml"
    path.write_text(text)
    result = sweep(load_study(path), folder / "s.sqlite")
    assert result.errors == 0, result.first_error
    with Store(folder / "s.sqlite") as store:
        return {json.dumps(r["inputs"]["set"], sort_keys=True): r["figures"]
                for r in store.rows()}


@pytest.mark.parametrize("sets,workload", CASES, ids=[c[0][0].split("=")[0] for c in CASES])
def test_a_what_if_gives_the_same_figures_from_cli_study_and_api(sets, workload, studied,
                                                                  capsys):
    api = _api(sets, workload)
    assert _cli(sets, workload, capsys) == api
    stored = {}
    for what_if in sets:
        key, value = what_if.split("=", 1)
        stored[key] = json.loads(value) if value.strip()[:1] == "[" else value
        if value.strip()[:1] == "{":
            stored[key] = [[k, v] for k, v in json.loads(value.replace(" = ", ": ")).items()]
    row = studied[json.dumps(stored, sort_keys=True)]
    assert {k: row[k] for k in FIGURES} == api
