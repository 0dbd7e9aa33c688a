"""The time model's mechanisms, each against the figure it must reproduce (issues 13, 14, 19).

Each test names the mechanism: the GEMV path of small-batch matmuls, the activation chunk staged
across a CTA's N width (the compute ridge), load-time casts, weights and activations typed
separately, the runtime's launches and host time, the static power of every chip.
"""

from __future__ import annotations

import numpy as np
import pytest

import memsim
from memsim.checkpoints import weight_formats
from memsim.device import device_names
from memsim.formats import bytes_for
from memsim.kernels import step as k
from memsim.plan import plan_system


def _matmul_floats(device, weights, activations="auto"):
    dev = memsim.device(device).with_overrides({"tiers.sram.capacity": "64 GB"})
    system = plan_system(dev, memsim.model("llama-3-8b"),
                         memsim.Decode(batch=1, context=64, weights=weights,
                                       activations=activations))
    plan = system.stages[0]
    rows = plan.op_int[:, k.C_KIND] == k.OP_MATMUL
    names = [n for n, is_matmul in zip(plan.op_names, rows) if is_matmul]
    return dict(zip(names, plan.op_float[rows]))


def test_int4_on_h100_is_bound_by_hbm_not_by_padded_matrix_math():
    """The GEMV path: at batch 1 the tokens are not padded to the 64-row MMA."""
    report = memsim.emulate("h100-sxm", "llama-3-8b", batch=1, context=1024,
                            weights="int4-g128")
    assert report.bottleneck == "hbm"


def test_b200_over_h100_int4_follows_their_bandwidth():
    """A 70B int4 step is bandwidth work: the two chips differ by their sustained bandwidth
    (launch gaps, the same on both, keep it a little below)."""
    times = {d: memsim.emulate(d, "llama-3-70b", batch=1, context=1024,
                               weights="int4-g128").time_per_token
             for d in ("h100-sxm", "b200")}
    bandwidth = {d: memsim.device(d).main_memory.sustained_bandwidth for d in times}
    speedup = times["h100-sxm"] / times["b200"]
    assert 0.8 < speedup / (bandwidth["b200"] / bandwidth["h100-sxm"]) <= 1.0


def test_systolic_runtimes_keep_the_padding():
    """Without a GEMV kernel (XLA on a TPU) the M padding of the matrix unit is paid."""
    gemv = memsim.emulate("h100-sxm", "llama-3.2-1b", batch=1, context=64, runtime="trt-llm")
    padded = memsim.emulate("h100-sxm", "llama-3.2-1b", batch=1, context=64,
                            runtime="jetstream")
    assert gemv.bytes_read == padded.bytes_read
    assert gemv.warm.time_by_bound["compute"] <= padded.warm.time_by_bound["compute"]


def test_compute_ridge_lies_where_peak_over_bandwidth_puts_it():
    """Llama 3 70B bf16, context 128, one H100 with room for it: the step first exceeds 1.2x
    the batch-1 step within 25% of the sustained matmul rate / sustained bandwidth, and batch 1,024 is compute-bound
    (the activation chunk is staged across the 256-wide warpgroup MMA, not re-read per tile)."""
    dev = memsim.device("h100-sxm").with_overrides({"tiers.hbm.capacity": "2 TB"})
    ridge = dev.matmul_rate("bf16") / dev.main_memory.sustained_bandwidth

    def step(batch: int) -> memsim.Report:
        return memsim.emulate(dev, "llama-3-70b", batch=batch, context=128)

    first = step(1).time_per_token
    low, high = 1, 1024
    while high - low > 8:                     # the step time grows with the batch
        mid = (low + high) // 2
        low, high = (mid, high) if step(mid).time_per_token <= 1.2 * first else (low, mid)
    assert 0.75 * ridge <= high <= 1.25 * ridge
    assert step(1024).bottleneck == "compute"


@pytest.mark.parametrize("device", ["groq-lpu", "wse-3", "ipu-gc200"])
def test_a_bf16_checkpoint_is_cast_at_load_on_chips_without_bf16(device):
    dev = memsim.device(device)
    assert dev.peak("bf16") is None and dev.peak("fp16") is not None
    floats = _matmul_floats(device, "bf16")
    assert all(row[k.F_DEQUANT_OPS] == 0 and row[k.F_PEAK] == dev.matmul_rate("fp16")
               for row in floats.values())


def test_weight_only_int8_runs_at_the_16_bit_peak_and_fp8_at_the_fp8_peak():
    dev = memsim.device("h100-sxm")
    w8a16 = _matmul_floats("h100-sxm", "int8")["gate"]
    assert w8a16[k.F_PEAK] == dev.matmul_rate("bf16") and w8a16[k.F_DEQUANT_OPS] > 0
    assert w8a16[k.F_ACT_QUANT_OPS] == 0
    w8a8 = _matmul_floats("h100-sxm", "fp8-e4m3")["gate"]
    assert w8a8[k.F_PEAK] == dev.matmul_rate("fp8") and w8a8[k.F_DEQUANT_OPS] == 0
    assert w8a8[k.F_ACT_QUANT_OPS] > 0
    smoothquant = _matmul_floats("h100-sxm", "int8", activations="int8")["gate"]
    assert smoothquant[k.F_PEAK] == dev.matmul_rate("int8") and smoothquant[k.F_DEQUANT_OPS] == 0


def test_quantized_activations_pay_their_quantization_in_vector_ops():
    plain = memsim.emulate("h100-sxm", "llama-3.2-1b", batch=4, context=64,
                           weights="uniform:fp8-e4m3", activations="bf16")
    quantized = memsim.emulate("h100-sxm", "llama-3.2-1b", batch=4, context=64,
                               weights="uniform:fp8-e4m3", activations="fp8-e4m3")
    assert quantized.bytes_read["hbm"] == plain.bytes_read["hbm"]
    assert quantized.warm.vector_ops != plain.warm.vector_ops


def test_checkpoint_roles_keep_the_16_bit_embedding_of_an_int4_model():
    """Llama 3.2 1B GPTQ/AWQ int4: the tied table stays bf16, 525 MB, and is read as such."""
    model = memsim.model("llama-3.2-1b")
    system = plan_system(memsim.device("h100-sxm"), model,
                         memsim.Decode(batch=1, context=64, weights="int4-g128"))
    table = next(t for t in system.stages[0].tensors if t.role == "embedding")
    assert table.bytes == bytes_for((model.vocab, model.hidden), "bf16") == 525_336_576
    uniform = weight_formats("uniform:int4-g128").for_tensor("lm_head", -1, model.layers)
    assert uniform.name == "int4-g128"


def test_an_eager_stack_is_slower_for_the_reasons_the_report_names():
    eager = memsim.emulate("h100-sxm", "llama-3-8b", batch=1, context=1024, runtime="hf-eager")
    graphed = memsim.emulate("h100-sxm", "llama-3-8b", batch=1, context=1024, runtime="trt-llm")
    assert eager.bytes_read == graphed.bytes_read          # runtimes change time, not bytes
    assert eager.time_per_token > 2 * graphed.time_per_token
    split_eager, split_graphed = eager.warm.time_split, graphed.warm.time_split
    assert split_eager["launch"] > 10 * split_graphed["launch"]
    assert split_eager["host"] > split_graphed["host"]
    assert split_eager["weights"] == pytest.approx(split_graphed["weights"])


def test_time_split_adds_up_to_the_step():
    report = memsim.emulate("h100-sxm", "llama-3-70b", batch=1, context=1024, tp=4, pp=2)
    split = report.warm.time_split
    assert split["collectives"] > 0
    on_path = sum(v for key, v in split.items() if key != "pipeline_idle")
    assert on_path == pytest.approx(report.warm.time_s)


def test_kernel_fixed_is_paid_once_per_kernel_and_not_by_collectives():
    base = memsim.device("h100-sxm")
    fixed_s = 3.5e-6
    with_fixed = base.with_overrides({"overheads.kernel_fixed": "3.5 us"})
    fields = dict(batch=1, context=1024, tp=2)
    before = memsim.emulate(base, "llama-3-8b", **fields)
    after = memsim.emulate(with_fixed, "llama-3-8b", **fields)
    assert after.bytes_read == before.bytes_read           # a time figure, no byte moves
    plan = plan_system(with_fixed, memsim.model("llama-3-8b"), memsim.Decode(**fields)).stages[0]
    kinds, launches = plan.op_int[:, k.C_KIND], plan.op_int[:, k.C_LAUNCHES]
    paid = launches[kinds < k.OP_COLLECTIVE].sum()
    assert after.warm.time_s - before.warm.time_s == pytest.approx(paid * fixed_s, rel=1e-9)
    grew = after.warm_counts.times.sum(axis=1) - before.warm_counts.times.sum(axis=1)
    assert np.all(grew[kinds == k.OP_COLLECTIVE] == 0)
    assert after.warm.time_split["kernel_fixed"] == pytest.approx(paid * fixed_s, rel=1e-9)
    assert "kernel_fixed" not in before.warm.time_split
    for name in ("weights", "kv", "collectives", "launch"):
        assert after.warm.time_split[name] == pytest.approx(before.warm.time_split[name])


CHIPS = {"groq-lpu": dict(tp=8, pp=2), "wse-3": {}, "ipu-gc200": dict(pp=4)}


@pytest.mark.parametrize("device", [d for d in device_names()
                                    if memsim.device(d).idle_power_w
                                    and memsim.device(d).tdp_w])
@pytest.mark.parametrize("batch", [1, 64])
def test_implied_power_per_chip_lies_between_idle_and_tdp(device, batch):
    """Static power of every chip over the whole step plus the dynamic energy of bytes and
    operations: the average power of a decoding chip is above idle and below its TDP."""
    dev = memsim.device(device)
    report = memsim.emulate(dev, "llama-3.2-1b", batch=batch, context=512,
                            **CHIPS.get(device, {}))
    watts = report.warm.energy_j / report.warm.time_s / report.chips
    assert dev.idle_power_w < watts < dev.tdp_w
    assert report.warm.static_energy_j == pytest.approx(
        dev.idle_power_w * report.chips * report.warm.time_s)


def test_a_runtime_what_if_rides_on_the_device_request():
    """``--set runtime.launch=60us`` (or a study's [grid.set]) edits the stack the step runs
    under, whichever it is; a key the runtime file does not have is refused naming it."""
    dev = memsim.device("h100-sxm")
    slow = dev.with_overrides({"runtime.launch": "60 us"})
    eager = memsim.emulate(dev, "llama-3.2-1b", context=64, runtime="hf-eager")
    slower = memsim.emulate(slow, "llama-3.2-1b", context=64, runtime="hf-eager")
    assert slower.time_per_token > eager.time_per_token
    assert slower.bytes_read == eager.bytes_read
    with pytest.raises(memsim.ConfigError, match="unknown key") as info:
        dev.with_overrides({"runtime.nonsense": "1"})
    assert info.value.field == "nonsense"


@pytest.mark.parametrize("path, value", [("link.bandwidth", "900 GB/s"),
                                         ("link.latency", "2 us"),
                                         ("tiers.hbm.bandwidth", "5 TB/s")])
def test_a_timing_what_if_reprices_every_link_op_as_a_fresh_plan_does(path, value):
    """memsim.plan.retarget (the sweep's reuse of a plan across timing-only what-ifs) must give
    the op table a plan of the new device gives: collectives and pipeline hand-offs (within a
    link domain and across the scale-out network) included."""
    from memsim.plan import retarget
    model, base = memsim.model("llama-3-8b"), memsim.device("h100-sxm")
    what_if = base.with_overrides({path: value})
    for tp, pp in ((2, 3), (8, 2)):          # hand-offs inside the NVLink domain, then across
        workload = memsim.Decode(batch=2, context=128, tp=tp, pp=pp)
        reused = retarget(plan_system(base, model, workload), what_if)
        fresh = plan_system(what_if, model, workload)
        for a, b in zip(reused.stages, fresh.stages):
            np.testing.assert_array_equal(a.op_float, b.op_float)
            np.testing.assert_array_equal(a.op_int, b.op_int)


@pytest.mark.parametrize("host", ["0.15 ms", "5 ms", "50 ms"])
def test_host_work_a_runtime_overlaps_is_hidden_only_up_to_the_device_step(host):
    """An overlapping runtime queues step n+1's host work while step n runs, so the device
    hides that work up to its own step and no further: a step is never shorter than the host
    work (before, any host work vanished, even 50 ms behind a 6 ms step)."""
    from memsim.runtime import runtime

    dev = memsim.device("h100-sxm")
    stack = runtime("trt-llm").with_overrides({"host_per_step": host})
    overlapped, serial = (memsim.emulate(dev, "llama-3-8b", runtime=rt)
                          for rt in (stack, stack.with_overrides({"host_overlap": False})))
    work, graph = stack.host_per_step_s, stack.graph_launch_s
    device_s = serial.time_per_step - work - graph          # the device's own step
    assert overlapped.time_per_step == pytest.approx(max(device_s, work) + graph, rel=1e-12)
    assert overlapped.warm.time_split["host"] == pytest.approx(
        graph + max(0.0, work - device_s), rel=1e-9, abs=1e-15)
