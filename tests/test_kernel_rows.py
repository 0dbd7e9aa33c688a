"""Kernel rows: one measured matmul beside memsim's time for that op, shapes checked."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

import memsim
from memsim import kernel_rows
from memsim.errors import ConfigError
from memsim.validate import default_folder, resolve_device, resolve_model

TABLE = """schema_version = 1

[[table]]
id = "t"
device = "h100-sxm"
weights = "bf16"
activations = "auto"
runtime = "vllm"
library = "a test"
source = "a test"
rows = [
  {{ model = "llama-3.2-1b", tp = 1, op = "{op}", m = {m}, n = {n}, k = {k}, us = {us} }},
]
"""


def folder_with(tmp_path: Path, **row) -> Path:
    fields = {"op": "gate_up", "m": 1, "n": 16384, "k": 2048, "us": 40.0, **row}
    (tmp_path / "kernels.toml").write_text(TABLE.format(**fields))
    return tmp_path


def rows_of(folder: Path) -> list[kernel_rows.KernelRow]:
    tables = kernel_rows.load_tables(folder)
    return kernel_rows.predict(tables, folder, resolve_device, resolve_model)


def test_gate_up_is_memsims_gate_plus_up_without_their_launches(tmp_path):
    (row,) = rows_of(folder_with(tmp_path))
    report = memsim.emulate("h100-sxm", "llama-3.2-1b", batch=1, context=128, weights="bf16",
                            runtime="vllm")
    launch = report.warm_counts.times[:, -1]
    ops = [op for op in report.ops if op.layer == 0 and op.name in ("gate", "up")]
    assert len(ops) == 2
    assert row.predicted_s == pytest.approx(sum(op.time_s - launch[op.index] for op in ops))
    assert row.weight_bytes == 2 * 8192 * 2048 * 2          # gate and up, BF16
    assert row.measured_s == pytest.approx(40e-6)
    assert row.error == pytest.approx(40e-6 / row.predicted_s - 1)   # positive: memsim faster


def test_a_kernel_row_keeps_the_kernels_fixed_time(tmp_path):
    """A profiler's kernel duration holds the kernel's own fixed time (the device's
    kernel_fixed), only the gap between kernels is left out: gate_up is one kernel."""
    (plain,) = rows_of(folder_with(tmp_path))
    text = (resources.files("memsim.devices") / "h100-sxm.toml").read_text()
    assert '\nop_launch = "2 us"\n' in text
    devices = tmp_path / "devices"
    devices.mkdir()
    (devices / "h100-fixed.toml").write_text(
        text.replace('name = "h100-sxm"', 'name = "h100-fixed"')
        .replace('\nop_launch = "2 us"\n', '\nop_launch = "2 us"\nkernel_fixed = "3 us"\n'))
    path = tmp_path / "kernels.toml"
    path.write_text(path.read_text().replace('device = "h100-sxm"', 'device = "h100-fixed"'))
    (fixed,) = rows_of(tmp_path)
    assert fixed.predicted_s - plain.predicted_s == pytest.approx(3e-6)


def test_a_row_whose_shape_is_not_memsims_shard_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="not 16384 x 4096"):
        rows_of(folder_with(tmp_path, k=4096))


@pytest.mark.parametrize("row, field", [
    ({"op": "lm_head"}, "rows.0.op"),
    ({"us": 0}, "rows.0.us"),
    ({"m": 0}, "rows.0.m"),
])
def test_a_bad_row_names_its_field(tmp_path, row, field):
    with pytest.raises(ConfigError) as err:
        kernel_rows.load_tables(folder_with(tmp_path, **row))
    assert field in str(err.value) and "kernels.toml" in str(err.value)


def test_an_unknown_key_is_refused(tmp_path):
    folder = folder_with(tmp_path)
    path = folder / "kernels.toml"
    path.write_text(path.read_text().replace('library = "a test"', 'library = "a test"\nlab = 1'))
    with pytest.raises(ConfigError, match="unknown key"):
        kernel_rows.load_tables(folder)


def test_a_folder_without_kernel_rows_has_none(tmp_path):
    assert kernel_rows.load_tables(tmp_path) == []
    assert kernel_rows.render([], []) == []


def test_every_repository_kernel_row_is_memsims_shape():
    rows = rows_of(default_folder())          # predict refuses a shape memsim does not have
    assert len(rows) >= 100
    assert all(r.measured_s > 0 and r.predicted_s > 0 for r in rows)


def test_a_tflops_row_is_two_m_n_k_flops_at_that_rate(tmp_path):
    folder = folder_with(tmp_path)
    path = folder / "kernels.toml"
    path.write_text(path.read_text().replace("us = 40.0", "tflops = 2.5"))
    (row,) = rows_of(folder)
    assert row.measured_s == pytest.approx(2 * 1 * 16384 * 2048 / 2.5e12)   # 26.8 us


def test_a_graph_replay_table_adds_one_launch_for_gate_up(tmp_path):
    (kernel,) = rows_of(folder_with(tmp_path))
    path = tmp_path / "kernels.toml"
    path.write_text(path.read_text().replace('runtime = "vllm"',
                                             'runtime = "vllm"\ntiming = "graph-replay"'))
    (graphed,) = rows_of(tmp_path)
    launch_s = memsim.device("h100-sxm").op_launch_s
    # gate and up are two memsim ops but one measured kernel: one launch, not two
    assert graphed.predicted_s - kernel.predicted_s == pytest.approx(launch_s)


@pytest.mark.parametrize("old, new, field", [
    ("us = 40.0", "us = 40.0, tflops = 2.5", "rows.0.us"),
    ("us = 40.0", "tflops = -1", "rows.0.tflops"),
    ('runtime = "vllm"', 'runtime = "vllm"\ntiming = "wall"', "timing"),
])
def test_a_bad_time_or_timing_names_its_field(tmp_path, old, new, field):
    folder = folder_with(tmp_path)
    path = folder / "kernels.toml"
    path.write_text(path.read_text().replace(old, new))
    with pytest.raises(ConfigError) as err:
        kernel_rows.load_tables(folder)
    assert field in str(err.value)
