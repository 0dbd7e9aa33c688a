"""The GEMV issue model: a runtime's instruction mix per weight over a device's pipe rates.

Closed forms: a pipe's time per weight is its classes' instructions over (rate x clock); an
issue-bound GEMV's compute time is weights x instructions / (cores x per-clock rate x clock);
the kernel's and the twin's unit times agree with them; bad mixes and pipes are one
ConfigError naming file and field.
"""

from __future__ import annotations

import numpy as np
import pytest

import memsim
from memsim.emulate import NO_ROUTES, Residency, run_step
from memsim.device import parse_device
from memsim.errors import ConfigError
from memsim.formats import get_format
from memsim.instructions import (CLASSES, ISSUED, MAX_PIPES, InstructionMix, default_pipes,
                                 gemv_seconds, mix_for, parse_mixes, parse_pipes)
from memsim.kernels import step as k
from memsim.plan import make_plan
from memsim.precision import matmul_path
from memsim.runtime import parse_runtime, runtime
from tests.test_walk_fast import check_against_twin

CLOCK_HZ = 2.0e9


def _mix(per_weight=None, per_row=None) -> InstructionMix:
    per_weight, per_row = per_weight or {}, per_row or {}
    return InstructionMix(tuple(float(per_weight.get(c, 0)) for c in CLASSES),
                          tuple(float(per_row.get(c, 0)) for c in CLASSES))


def _pipes(table: dict) -> tuple:
    return parse_pipes(table, file="test.toml")


def test_kernel_has_a_column_pair_per_pipe():
    assert k.N_GEMV_PIPES == MAX_PIPES
    assert k.F_MLP == k.F_GEMV + 2 * MAX_PIPES


def test_a_pipe_takes_its_classes_over_rate_times_clock():
    pipes = _pipes({"per_clock": 128, "pipes": {"alu": {"per_clock": 64,
                                                        "classes": ["int", "shift"]},
                                                "xu": {"per_clock": 16, "classes": ["convert"]}}})
    mix = _mix({"int": 0.5}, {"int": 1.0, "shift": 0.25, "convert": 2.0, "fp32": 3.0})
    s = gemv_seconds(pipes, CLOCK_HZ, mix)
    fixed, row = s[:MAX_PIPES], s[MAX_PIPES:]
    assert fixed[0] == pytest.approx(0.5 / (128 * CLOCK_HZ))                 # issue: every class
    assert row[0] == pytest.approx((1.0 + 0.25 + 2.0 + 3.0) / (128 * CLOCK_HZ))
    assert fixed[1] == pytest.approx(0.5 / (64 * CLOCK_HZ))
    assert row[1] == pytest.approx(1.25 / (64 * CLOCK_HZ))
    assert (fixed[2], row[2]) == (0.0, pytest.approx(2.0 / (16 * CLOCK_HZ)))
    assert all(x == 0.0 for x in s[3:MAX_PIPES] + s[MAX_PIPES + 3:])


def test_mma_takes_no_issue_slots():
    pipes = _pipes({"per_clock": 128, "pipes": {"tensor": {"per_clock": 1024,
                                                           "classes": ["mma"]}}})
    s = gemv_seconds(pipes, CLOCK_HZ, _mix({"mma": 16, "fp16": 1.0}))
    assert "mma" not in ISSUED
    assert s[0] == pytest.approx(1.0 / (128 * CLOCK_HZ))
    assert s[1] == pytest.approx(16 / (1024 * CLOCK_HZ))


def test_default_pipe_is_the_vector_fma_rate():
    (issue,) = default_pipes(19.5e12, 108, 1.41e9)
    assert issue.per_clock == pytest.approx(19.5e12 / 2 / 108 / 1.41e9)     # 64 FMA / SM / clk
    assert issue.classes == ISSUED


def _unit_seconds(gemv_s, rows, weights):
    # matrix path made slow (1 op/s) so that the GEMV is the faster of the two
    return k._unit_seconds(rows, weights, 16, 1.0, 1.0, 0.0, True, np.array(gemv_s))


def test_issue_bound_unit_is_weights_times_instructions_over_rate():
    pipes = _pipes({"per_clock": 128})
    mix = _mix({"int": 0.25}, {"imad": 0.25, "load": 0.625, "fp32": 0.25})
    weights, rows = 4096 * 128, 3
    expected = weights * (0.25 + rows * 1.125) / (128 * CLOCK_HZ)
    assert _unit_seconds(gemv_seconds(pipes, CLOCK_HZ, mix), rows, weights) == pytest.approx(
        expected, rel=1e-12)


def test_the_slowest_pipe_binds_and_it_changes_with_the_batch():
    # the conversion pipe binds at one row; the per-row loads bind from two rows on
    pipes = _pipes({"per_clock": 128, "pipes": {
        "xu": {"per_clock": 16, "classes": ["convert"]},
        "lsu": {"per_clock": 32, "classes": ["load"]}}})
    mix = _mix({"convert": 1.0}, {"load": 1.0})
    s = gemv_seconds(pipes, CLOCK_HZ, mix)
    w = 1000
    assert _unit_seconds(s, 1, w) == pytest.approx(w / (16 * CLOCK_HZ))
    assert _unit_seconds(s, 4, w) == pytest.approx(w * 4 / (32 * CLOCK_HZ))


def test_no_count_keeps_the_vector_formula():
    zeros = np.zeros(2 * MAX_PIPES)
    unit = k._unit_seconds(2, 1000, 16, 1.0, 5.0e9, 3.0, True, zeros)
    assert unit == pytest.approx((2.0 * 2 * 1000 + 3.0 * 1000) / 5.0e9)


def test_a100_issue_rate_is_the_guides_figures():
    a100 = memsim.device("validation/devices/a100-sxm4-80gb.toml")
    rates = {p.name: p.per_clock for p in a100.pipes}
    assert rates["issue"] == 128 and rates["fma"] == 64 and rates["xu"] == 16
    ada = memsim.device("validation/devices/rtx-4090.toml")
    rates = {p.name: p.per_clock for p in ada.pipes}
    assert rates["fma"] == 128 and rates["fmaheavy"] == 64


def test_llama_cpp_q4_0_path_on_a100_is_its_count_over_the_pipes():
    a100 = memsim.device("validation/devices/a100-sxm4-80gb.toml")
    stack = runtime("llama.cpp-cuda")
    path = matmul_path(a100, get_format("q4_0"), get_format("bf16"), stack)
    mix = dict(stack.gemv)["q4_0"]
    issue = path.gemv_s_per_weight[0] + path.gemv_s_per_weight[MAX_PIPES]
    assert issue == pytest.approx(mix.total(1) / (128 * a100.clock_hz))
    # without a count (TensorRT-LLM, vLLM) the path carries none
    assert not any(matmul_path(a100, get_format("q4_0"), get_format("bf16"),
                               runtime("trt-llm")).gemv_s_per_weight)


@pytest.mark.parametrize("matrix_rate", ["1 TFLOPS", "10000 TFLOPS"])
def test_issue_bound_step_time_is_weights_times_instructions_over_the_chip(matrix_rate):
    """End to end: with memory made effectively free, a GEMV's compute time is
    weights x instructions / (SMs x rate x clock) over whole waves, whether the matrix units
    are slower or faster than it: a runtime that counts its GEMV kernel runs that kernel."""
    base = memsim.device("validation/devices/a100-sxm4-80gb.toml")
    cores = 8
    fast = {"cores": cores, "compute.bf16": matrix_rate, "compute.fp16": matrix_rate,
            "sustained_compute.bf16": matrix_rate, "sustained_compute.fp16": matrix_rate,
            "compute.int8": matrix_rate}
    for tier in base.tiers:
        fast[f"tiers.{tier.name}.bandwidth"] = "1e6 TB/s"
    fast["tiers.hbm.sustained_bandwidth"] = "1e6 TB/s"
    device = base.with_overrides(fast)
    model = memsim.Model(name="tiny", display_name="tiny", layers=1, hidden=256, heads=4,
                         kv_heads=4, head_dim=64, ffn=512, vocab=256, tied_embeddings=False)
    workload = memsim.Decode(batch=1, context=8, weights="q4_0", runtime="llama.cpp-cuda",
                             tile_k=256, tile_n=32)
    plan = make_plan(device, model, workload)
    counts = run_step(plan, Residency(plan), 0, NO_ROUTES)
    # q4_0's count binds on the A100's load pipe: 10 loads per 16 weights, 32 per SM per clock
    per_weight_s = 0.625 / (32 * device.clock_hz)
    compute_col = len(plan.tier_names) + 1
    gates = [op for op in np.flatnonzero(plan.op_int[:, k.C_KIND] == k.OP_MATMUL)
             if plan.op_names[op] == "gate"]
    assert gates
    for op in gates:
        n, kk, tn = (int(plan.op_int[op, c]) for c in (k.C_N, k.C_K, k.C_TILE_N))
        units = -(-n // tn)
        waves = -(-units // cores)
        expected = waves * kk * tn * per_weight_s
        assert counts.times[op, compute_col] == pytest.approx(expected, rel=1e-9)


def test_kernel_equals_twin_with_a_counted_gemv():
    device = memsim.device("h100-sxm").with_overrides({"cores": 3})
    model = memsim.Model(name="tiny", display_name="tiny", layers=2, hidden=64, heads=2,
                         kv_heads=1, head_dim=32, ffn=96, vocab=100, tied_embeddings=False)
    for weights, stack in (("q4_0", "llama.cpp-cuda"), ("q8_0", "llama.cpp-cuda"),
                           ("int4-g32", "gpt-fast"), ("int8", "gpt-fast")):
        workload = memsim.Decode(batch=2, context=5, weights=weights, runtime=stack,
                                 tile_k=32, tile_n=16, steps=2)
        plan = make_plan(device, model, workload)
        assert plan.op_float[:, k.F_GEMV:].any()
        check_against_twin(plan, steps=2)


def _runtime_with(gemv: dict) -> dict:
    data = dict(runtime("llama.cpp-cuda").data)
    data["gemv"] = gemv
    return data


@pytest.mark.parametrize("gemv, field", [
    ({"q9_9": {"per_weight": {}, "per_weight_row": {"int": 1}}}, "gemv.q9_9"),
    ({"q4_0": {"per_weight": {"float": 1}, "per_weight_row": {}}}, "gemv.q4_0.per_weight"),
    ({"q4_0": {"per_weight": {"int": -1}, "per_weight_row": {}}}, "gemv.q4_0.per_weight.int"),
    ({"q4_0": {"per_weight": {}, "per_weight_row": {}}}, "gemv.q4_0"),
    ({"q4_0": {"per_weight": {}}}, "gemv.q4_0"),
])
def test_bad_mix_names_file_and_field(gemv, field):
    with pytest.raises(ConfigError) as err:
        parse_runtime(_runtime_with(gemv), file="rt.toml")
    assert err.value.file == "rt.toml" and err.value.field.startswith(field)


@pytest.mark.parametrize("issue, field", [
    ({}, "issue"),
    ({"per_clock": 0}, "issue.per_clock"),
    ({"per_clock": 128, "pipes": {"x": {"per_clock": 16, "classes": ["dp4a"]}}},
     "issue.pipes.x.classes"),
    ({"per_clock": 128, "pipes": {"x": {"per_clock": 16, "classes": []}}},
     "issue.pipes.x.classes"),
    ({"per_clock": 128, "pipes": {"x": {"per_clock": True, "classes": ["int"]}}},
     "issue.pipes.x.per_clock"),
])
def test_bad_issue_table_names_file_and_field(issue, field):
    assert_bad_device_table("issue", issue, field)


def assert_bad_device_table(table: str, value, field: str) -> None:
    """h100-sxm's file with ``table`` set to ``value`` is one ConfigError naming the file and
    a field that starts with ``field``."""
    data = dict(memsim.device("h100-sxm").data)
    data[table] = value
    with pytest.raises(ConfigError) as err:
        parse_device(data, file="dev.toml")
    assert err.value.file == "dev.toml" and err.value.field.startswith(field)


def test_parse_mixes_reads_int4_for_every_group():
    mixes = dict(parse_mixes({"int4": {"per_weight": {"int": 1}, "per_weight_row": {}}},
                             file="rt.toml"))
    assert mix_for(mixes, "int4-g32") is mixes["int4"]
    assert mix_for(mixes, "int4-g128") is mixes["int4"]
    assert mix_for(mixes, "q4_0") is None
