"""Multi-GPU layer splits without NVLink: llama.cpp's pipeline hand-offs staged through the host,
its F32 hidden state, no CUDA graphs under pipeline parallelism, and the PCIe [link] of the
validation GPUs. Every figure is checked against its closed form."""

from __future__ import annotations

import numpy as np
import pytest

import memsim
from memsim.emulate import host_time_per_step
from memsim.handoff import Pipeline, handoff_bytes, handoff_seconds, parse_pipeline
from memsim.kernels import step as k
from memsim.plan import TOKEN_ID_BITS, plan_system
from memsim.runtime import parse_runtime, runtime
from memsim.validate import default_folder, resolve_device, resolve_model

FOLDER = default_folder()
PCIE_GPUS = ("a100-pcie-80gb", "l40s", "rtx-4090")


def _device(name: str) -> memsim.Device:
    return resolve_device(name, FOLDER)


def _plan(device: str, pp: int, stack: str = "llama.cpp-cuda", model: str = "llama-3-8b",
          weights: str = "fp16"):
    return plan_system(_device(device), resolve_model(model, FOLDER),
                       memsim.Decode(batch=1, context=256, weights=weights, kv="fp16", pp=pp,
                                     runtime=stack))


def _sends(plan) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """Every hand-off of a system plan: its name, int row and float row."""
    return [(stage.op_names[op], stage.op_int[op], stage.op_float[op])
            for stage in plan.stages
            for op in np.flatnonzero(stage.op_int[:, k.C_KIND] == k.OP_SEND)]


@pytest.mark.parametrize("name", PCIE_GPUS)
def test_pcie_gpus_have_a_pcie_gen4_x16_link(name):
    link = _device(name).link
    assert link is not None and link.kind == "pcie"
    assert link.bandwidth == 32e9 and link.max_chips == 8


def test_llama_cpp_hands_off_the_f32_hidden_state_through_the_host():
    """Llama 3 8B over 4 A100 PCIe cards: three hand-offs of 4,096 F32 elements, each two
    copies over the host link, and the token back to the first GPU."""
    dev = _device("a100-pcie-80gb")
    host = dev.host_link
    sends = _sends(_plan("a100-pcie-80gb", pp=4))
    assert [name for name, _, _ in sends] == ["send"] * 3 + ["send_tokens"]
    for name, row, floats in sends:
        bits = 32 if name == "send" else TOKEN_ID_BITS
        width = 4096 if name == "send" else 1
        sent = handoff_bytes(1, width, bits)
        assert row[k.C_M] * row[k.C_K] * row[k.C_ACT_BITS] // 8 == sent
        assert floats[k.F_LINK_S] == pytest.approx(2 * sent / host.bandwidth, rel=1e-12)
        assert floats[k.F_LINK_LATENCY_S] == pytest.approx(2 * host.latency_s, rel=1e-12)
    assert sum(handoff_bytes(1, 4096, 32) for _ in range(3)) + 4 == 3 * 16_384 + 4


def test_link_bytes_of_a_70b_layer_split_equal_the_closed_form():
    """(pp - 1) hand-offs of d_model x 4 bytes plus one 4-byte token id per step."""
    report = memsim.emulate(_device("a100-pcie-80gb"), resolve_model("llama-3-70b", FOLDER),
                            memsim.Decode(batch=1, context=256, weights="fp16", kv="fp16",
                                          pp=4, runtime="llama.cpp-cuda", steps=1))
    assert report.link_bytes == 3 * 8192 * 4 + TOKEN_ID_BITS // 8


def test_a_stack_without_a_pipeline_table_hands_off_over_the_link():
    """vLLM keeps the default: the workload's 16-bit activations over NVLink."""
    dev = _device("a100-sxm4-80gb")
    assert runtime("vllm").pipeline == Pipeline()
    sends = _sends(_plan("a100-sxm4-80gb", pp=2, stack="vllm", weights="bf16"))
    name, row, floats = sends[0]
    assert name == "send" and row[k.C_ACT_BITS] == 16
    assert floats[k.F_LINK_S] == pytest.approx(4096 * 2 / dev.link.bandwidth, rel=1e-12)
    assert floats[k.F_LINK_LATENCY_S] == dev.link.latency_s


def test_handoff_seconds_closed_form():
    dev = _device("rtx-4090")
    link, host = dev.link, dev.host_link
    assert handoff_seconds(dev, Pipeline(), link, 32_768) == (32_768 / link.bandwidth,
                                                              link.latency_s)
    assert handoff_seconds(dev, Pipeline(handoff="host"), link, 32_768) == (
        2 * 32_768 / host.bandwidth, 2 * host.latency_s)


def test_llama_cpp_launches_from_the_host_on_more_than_one_gpu():
    """A single GPU replays its CUDA graph; a layer split launches every kernel."""
    stack = runtime("llama.cpp-cuda")
    one, four = _plan("a100-pcie-80gb", pp=1), _plan("a100-pcie-80gb", pp=4)
    assert one.stages[0].host_launch_s == 0.0
    assert {s.host_launch_s for s in four.stages} == {stack.launch_s}
    assert host_time_per_step(stack, 1) == stack.host_per_step_s + stack.graph_launch_s
    assert host_time_per_step(stack, 4) == stack.host_per_step_s
    assert runtime("trt-llm").graphed(4)


def test_the_4090_pair_runs_llama_3_70b_q4_k_m():
    report = memsim.emulate(_device("rtx-4090"), resolve_model("llama-3-70b", FOLDER),
                            memsim.Decode(batch=1, context=256, weights="q4_k_m", kv="fp16",
                                          pp=2, runtime="llama.cpp-cuda", steps=1))
    assert report.pp == 2 and report.link_bytes == 8192 * 4 + 4


@pytest.mark.parametrize("table, field", [
    ({"handoff": "nvlink"}, "pipeline.handoff"),
    ({"handoff_bits": 12}, "pipeline.handoff_bits"),
    ({"handoff_bits": 0}, "pipeline.handoff_bits"),
    ({"graph": "no"}, "pipeline.graph"),
    ({"hand_off": "host"}, "pipeline.hand_off"),
    ("host", "pipeline"),
])
def test_bad_pipeline_tables_name_the_file_and_field(table, field):
    with pytest.raises(memsim.ConfigError) as err:
        parse_pipeline(table, file="rt.toml")
    assert "rt.toml" in str(err.value) and field in str(err.value)


def test_a_runtime_file_reads_its_pipeline_table():
    data = dict(runtime("llama.cpp-cuda").data)
    assert parse_runtime(data, file="x.toml").pipeline == Pipeline("host", 32, False)
    del data["pipeline"]
    assert parse_runtime(data, file="x.toml").pipeline == Pipeline()
