"""memsim.testing: its strategies generate what they promise, its checkers catch what they
should (a bug injected into the reference twin is caught and shrunk to a minimal shape), and the
worked example of docs/testing.md runs."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

import memsim
from memsim.device import parse_device
from memsim.model import parse_model
from memsim.report import StepCounts
from memsim.testing import (assert_conservation, assert_lower_bounds, assert_matches_closed_form,
                            assert_no_more_traffic_when, assert_not_slower_when,
                            assert_report_invariants, assert_same_traffic,
                            assert_traffic_at_most, examples, no_reuse, streamed_bytes,
                            use_profiles)
from memsim.testing import strategies as ms
from memsim.testing._invalid import MUTATIONS, invalid_device_data
from tests import reference

ROOT = Path(__file__).resolve().parents[1]
emulate_module = importlib.import_module("memsim.emulate")

CATALOG = st.sampled_from(memsim.device_names())
# tiny shapes: an emulation takes a millisecond or two
tiny_models = ms.models(layers=st.integers(1, 2), hidden=st.integers(1, 64),
                        kv_heads=st.integers(1, 2), q_per_kv=st.integers(1, 2),
                        head_dim=st.integers(1, 32), ffn=st.integers(1, 128),
                        vocab=st.integers(1, 256), experts=st.just(1) | st.integers(2, 4))
tiny_workloads = ms.decodes(batch=st.integers(1, 4), context=st.integers(0, 64),
                            steps=st.integers(1, 2), tile_k=st.none() | st.integers(8, 64),
                            tile_n=st.none() | st.integers(8, 64))


# Optional dependency ----------------------------------------------------------------------

def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, check=False)


def test_import_memsim_and_its_checkers_never_import_hypothesis():
    done = _python("import sys, memsim, memsim.testing; "
                   "assert 'hypothesis' not in sys.modules, 'hypothesis was imported'")
    assert done.returncode == 0, done.stderr


def test_without_hypothesis_the_strategies_say_to_install_memsim_testing():
    done = _python("import sys; sys.modules['hypothesis'] = None\n"
                   "import memsim.testing\n"
                   "try:\n    memsim.testing.examples(5)\nexcept ImportError as e:\n"
                   "    print(e)\n"
                   "import memsim.testing.strategies")
    assert done.returncode != 0
    assert "ImportError: memsim.testing.strategies needs hypothesis" in done.stderr
    assert "pip install 'memsim[testing]'" in done.stderr
    assert "memsim.testing.examples needs hypothesis" in done.stdout


# Strategies ----------------------------------------------------------------------------------

@settings(max_examples=examples(150))
@given(ms.device_data(), tiny_models, tiny_workloads)
def test_every_device_drawn_from_scratch_loads_and_emulates(data, model, workload):
    dev = parse_device(data, file="generated.toml")
    assert_report_invariants(memsim.emulate(dev, model, workload), dev)


@settings(max_examples=examples(100))
@given(ms.devices(base=CATALOG), tiny_models, tiny_workloads)
def test_every_perturbed_catalog_device_loads_and_emulates(dev, model, workload):
    assert_report_invariants(memsim.emulate(dev, model, workload), dev)


def _refused(case) -> None:
    with pytest.raises(memsim.ConfigError) as info:
        parse_device(case.data, file="broken.toml")
    assert info.value.field == case.field, f"{case.mistake}: {info.value}"
    assert info.value.file == "broken.toml"


@settings(max_examples=examples(200))
@given(ms.invalid_devices() | ms.invalid_devices(base=CATALOG))
def test_every_invalid_device_is_refused_naming_the_field(case):
    _refused(case)


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.mistake)
def test_each_kind_of_mistake_is_refused_naming_its_field(mutation):
    @settings(max_examples=examples(4))
    @given(invalid_device_data(ms.device_data() | ms.device_data(base=CATALOG), (mutation,)))
    def refused(case):
        _refused(case)
    refused()


@settings(max_examples=examples(50))
@given(st.data())
def test_strategies_take_plain_values_and_strategies(data):
    h100 = memsim.device("h100-sxm")
    exact = data.draw(ms.devices(base="h100-sxm", perturb=1, on_chip_capacity=2**20))
    assert exact.tier("sram").capacity == 2**20
    assert exact.tier("hbm") == h100.tier("hbm") and exact.clock_hz == h100.clock_hz
    ranged = data.draw(ms.devices(base=h100, on_chip_capacity=st.integers(2**20, 2**21),
                                  cores=st.just(7)))
    assert 2**20 <= ranged.tiers[0].capacity <= 2**21 and ranged.cores == 7
    scratch = data.draw(ms.devices(policy="tiered", off_chip_tiers=st.integers(2, 3)))
    assert scratch.layout.policy == "tiered" and len(scratch.tiers) in (3, 4)
    model = data.draw(ms.models(hidden=64, experts=st.integers(2, 4), dense_layers=0))
    assert model.hidden == 64 and model.is_moe and model.dense_layers == 0
    workload = data.draw(ms.decodes(batch=st.just(3), weights="int8", placement={"kv": "hbm"}))
    assert workload.batch == 3 and workload.weights == "int8"
    assert workload.placement == (("kv", "hbm"),)
    cxl = data.draw(ms.tiers(kind="cxl", capacity="512 GB", bandwidth=st.integers(10**9, 10**11)))
    assert h100.with_tier(cxl).tier("cxl").capacity == 512 * 10**9


@settings(max_examples=examples(100))
@given(ms.models())
def test_generated_models_are_valid_model_files(model):
    fields = ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab")
    data = {"schema_version": 1, "name": model.name, "display_name": model.display_name,
            "tied_embeddings": model.tied_embeddings, "published_params": "0", "source": "x",
            **{key: getattr(model, key) for key in fields}}
    if model.is_moe:
        data["moe"] = {key: getattr(model, key) for key in (
            "experts", "experts_per_token", "shared_experts", "dense_layers", "dense_ffn")}
    assert parse_model(data, file="generated.toml") == dataclasses.replace(model, source="x")


@settings(max_examples=examples(60))
@given(st.sampled_from(["weights", "kv", "activations"]), st.data())
def test_formats_suit_their_role(role, data):
    name = data.draw(ms.formats(role=role))
    memsim.Decode(**{role: name})
    assert (memsim.get_format(name).group is None) or role != "activations"


@settings(max_examples=examples(100))
@given(st.data())
def test_overrides_always_make_a_valid_device(data):
    dev = memsim.device(data.draw(CATALOG))
    changes = data.draw(ms.overrides(device=dev, scale=st.sampled_from([1.5, 4.0])))
    assert dev.with_overrides(changes).name == dev.name


def test_strategies_refuse_what_cannot_be_built():
    for build in (lambda: ms.devices(policy="tiered", off_chip_tiers=1),
                  lambda: ms.devices(base="h100-sxm", policy="weight-streaming"),
                  lambda: ms.models(experts=2, experts_per_token=3),
                  lambda: ms.formats(role="scales"),
                  lambda: ms.overrides(device="h100-sxm", fields=["tiers.hbm.colour"])):
        with pytest.raises(InvalidArgument):
            find(build(), lambda _: True)


# Checkers --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def report() -> memsim.Report:
    return memsim.emulate("h100-sxm", "llama-3.2-1b", batch=2, context=100, steps=2)


def test_conservation_names_the_op_and_its_bits(report):
    qkv = report.op_names.index("qkv")
    read = report.warm_counts.read_bits.copy()
    read[qkv, 0] += 8
    broken = dataclasses.replace(report, warm_counts=dataclasses.replace(report.warm_counts,
                                                                         read_bits=read))
    with pytest.raises(AssertionError, match=r"warm step, op \d+ \(qkv, layer 0\): bits read "
                                             r"on chip: expected \d+ \(hits 0 \+ from further "
                                             r"out \d+\), got \d+"):
        assert_conservation(broken)


def test_lower_bounds_name_the_tier_and_the_bound(report):
    warm = dataclasses.replace(report.warm, time_s=1e-9, chip_busy_s=(1e-9,))
    broken = dataclasses.replace(report, steps=(report.cold, warm))
    with pytest.raises(AssertionError, match=r"step 1, chip 0: busy time in s: expected at "
                                             r"least .* B through 'sram' .*, got 1e-09"):
        assert_lower_bounds(broken, "h100-sxm")
    with pytest.raises(AssertionError, match="emulated on another device"):
        assert_lower_bounds(report, "groq-lpu")


def test_closed_form_names_the_op_and_the_difference(report):
    model = memsim.model("llama-3.2-1b")
    workload = memsim.Decode(batch=2, context=100, steps=2)
    assert_matches_closed_form(report, memsim.device("h100-sxm"), model, workload)
    wider = dataclasses.replace(model, ffn=model.ffn + 1)
    with pytest.raises(AssertionError, match=r"cold step \(step 0\), down: bytes read on chip: "
                                             r"expected \d+, got \d+ \(-\d+ B\)"):
        assert_matches_closed_form(report, memsim.device("h100-sxm"), wider, workload)
    with pytest.raises(ValueError, match="dense models"):
        streamed_bytes(memsim.device("h100-sxm"), memsim.model("mixtral-8x7b"), workload)
    with pytest.raises(ValueError, match="tp=2"):
        streamed_bytes(memsim.device("h100-sxm"), model, memsim.Decode(tp=2))


def test_same_traffic_and_budgets_name_the_figure(report):
    longer = memsim.emulate("h100-sxm", "llama-3.2-1b", batch=2, context=400, steps=2)
    with pytest.raises(AssertionError, match=r"step 0: bytes_read: expected .*, got "):
        assert_same_traffic(report, longer)
    assert_traffic_at_most(report, {"hbm": report.bytes_read["hbm"]
                                    + report.bytes_written["hbm"]})
    with pytest.raises(AssertionError, match=r"warm step: bytes read and written in tier 'hbm': "
                                             r"expected at most \d+, got \d+ \(1 B over\)"):
        assert_traffic_at_most(report, {"hbm": report.bytes_read["hbm"]
                                        + report.bytes_written["hbm"] - 1})


def test_monotonicity_helpers_catch_a_worse_device():
    model, workload = memsim.model("llama-3.2-1b"), memsim.Decode(batch=1, context=64, steps=2)
    before, after = assert_not_slower_when({"tiers.hbm.bandwidth": "6 TB/s"}, device="h100-sxm",
                                           model=model, workload=workload)
    assert after.time_per_token < before.time_per_token
    with pytest.raises(AssertionError, match=r"time per token in s with \{'tiers.hbm.bandwidth':"
                                             r" '1 TB/s'\}: expected at most .* \(before\)"):
        assert_not_slower_when({"tiers.hbm.bandwidth": "1 TB/s"}, device="h100-sxm",
                               model=model, workload=workload)
    big = memsim.device("h100-sxm").with_overrides({"tiers.sram.capacity": "4 GB"})
    with pytest.raises(AssertionError, match=r"step 1: bytes read off chip after no_reuse: "
                                             r"expected at most \d+ \(before\), got \d+"):
        assert_no_more_traffic_when(no_reuse, device=big, model=model, workload=workload)


# Profiles ----------------------------------------------------------------------------------

def test_examples_scale_with_the_profile(monkeypatch):
    from hypothesis import settings as hypothesis_settings
    try:
        monkeypatch.setenv("HYPOTHESIS_PROFILE", "deep")
        assert use_profiles() == "deep"
        assert examples(25) == 500
        monkeypatch.setenv("HYPOTHESIS_PROFILE", "ci")
        assert use_profiles() == "ci"
        assert hypothesis_settings.default.derandomize
        assert examples(25) == 25 and examples(1) == 1
    finally:
        monkeypatch.undo()
        use_profiles()
    with pytest.raises(ValueError):
        examples(0)


# A mutation: the checkers catch a bug in a copy of the walker, and shrink it --------------------

TILE_K = 8
_correct_tile_bits = reference.tile_bits


def _twin_step(plan, residency, step, routes=emulate_module.NO_ROUTES) -> StepCounts:
    """The pure-Python reference twin in the kernel's place, with its own on-chip state."""
    state = residency.__dict__.setdefault("twin", reference.new_state(plan))
    out = reference.run_step(plan, state, step, routes.tolist())
    results = [[op[column] for column in reference.OP_COLUMNS] for op in out["ops"]]
    return StepCounts(step=step, read_bits=np.array(out["read"], dtype=np.int64),
                      written_bits=np.array(out["written"], dtype=np.int64),
                      results=np.array(results, dtype=np.int64), times=np.array(out["times"]))


def _ragged_last_tile_one_short(k0, kk, nn, *fmt):
    """The injected bug: the last K tile of a row of tiles, when ragged, billed one element
    short (the kind of off-by-one a ``k - k0 - 1`` makes)."""
    return _correct_tile_bits(k0, kk - (k0 > 0 and kk < TILE_K), nn, *fmt)


# shapes around a few tiles, and the shipped checker against the closed form
mutation_cases = st.tuples(
    ms.models(layers=1, hidden=st.integers(1, 2 * TILE_K), ffn=st.integers(1, 2 * TILE_K),
              kv_heads=1, q_per_kv=1, head_dim=st.integers(1, TILE_K), vocab=st.integers(1, 8),
              tied_embeddings=False, experts=1),
    ms.decodes(batch=st.integers(1, 2), context=st.integers(0, 16), steps=1, kv_block=16,
               tile_k=TILE_K, tile_n=TILE_K))
H100 = memsim.device("h100-sxm")


def _caught(case) -> bool:
    model, workload = case
    try:
        assert_matches_closed_form(memsim.emulate(H100, model, workload), H100, model, workload)
    except AssertionError:
        return True
    return False


@contextlib.contextmanager
def _twin(tile_bits=_correct_tile_bits):
    """memsim.emulate runs the reference twin, with ``tile_bits``, instead of the Numba walker."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(emulate_module, "run_step", _twin_step)
        patch.setattr(reference, "tile_bits", tile_bits)
        yield


@settings(max_examples=examples(30))
@given(mutation_cases)
def test_the_unmutated_twin_passes_the_checkers(case):
    with _twin():
        assert not _caught(case)


def test_a_ragged_tile_off_by_one_is_caught_and_shrunk_to_one_element_past_a_tile():
    with _twin(_ragged_last_tile_one_short):
        model, workload = find(mutation_cases, _caught, settings=settings(
            max_examples=examples(300), deadline=None, database=None))
        mutated = memsim.emulate(H100, model, workload)
    # minimal: one contraction just one element past a whole tile, everything else smallest
    ks = {"gate": model.hidden, "o_proj": model.heads * model.head_dim, "down": model.ffn}
    ragged = {name: k for name, k in ks.items() if k > TILE_K and k % TILE_K}
    assert min(ragged.values()) == TILE_K + 1
    assert (model.vocab, model.head_dim, workload.batch, workload.context) == (1, 1, 1, 0)
    assert workload.weights == "bf16"
    name = min(ragged, key=ragged.get)
    with pytest.raises(AssertionError, match=rf"cold step \(step 0\), {name}: bytes read on chip"
                                             r": expected \d+, got \d+ \(-2 B\)"):
        assert_matches_closed_form(mutated, H100, model, workload)
    # the Numba walker meets the closed form, and the mutated twin's report differs from it
    real = memsim.emulate(H100, model, workload)
    assert_matches_closed_form(real, H100, model, workload)
    with pytest.raises(AssertionError, match="bytes_read: expected"):
        assert_same_traffic(real, mutated)


# Known gaps in the loader --------------------------------------------------------------------

def test_a_policy_that_needs_a_spill_tier_is_refused_at_load():
    with pytest.raises(memsim.ConfigError) as info:
        memsim.device("h100-sxm").with_overrides({"layout.policy": "tiered"})
    assert info.value.field == "layout.policy"


# The guide's worked example ----------------------------------------------------------------

def _guide_files() -> dict[str, str]:
    """The code blocks of docs/testing.md marked ``<!-- file: NAME -->``."""
    text = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    blocks = re.findall(r"<!-- file: (\S+) -->\s*```\w*\n(.*?)```", text, flags=re.DOTALL)
    return dict(blocks)


def test_the_guide_example_runs(tmp_path):
    files = _guide_files()
    assert {"my-accel.toml", "conftest.py", "test_my_accel.py"} <= set(files)
    for name, code in files.items():
        (tmp_path / name).write_text(code, encoding="utf-8")
    tests = []
    try:
        for name in ("conftest.py", "test_my_accel.py"):
            spec = importlib.util.spec_from_file_location(f"guide_{name[:-3]}", tmp_path / name)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            tests += [getattr(module, t) for t in dir(module) if t.startswith("test_")]
        assert len(tests) >= 3
        for test in tests:
            test()
    finally:
        use_profiles()
