"""Kernel rows: memsim's time for one weight matmul beside a kernel library's measured time.

A decode row's error mixes every mechanism of a step (bandwidth, launches, collectives, host
time); a kernel row isolates one: how fast a matmul's weights stream at M activation rows. A
validation folder's ``kernels.toml`` holds tables of measured kernel times, each row naming the
model, tensor-parallel degree and op whose shard has the measured shape; memsim emulates that
decode step and takes the op's time without its launch column (a kernel's own duration, as a
profiler's device trace reports it), or with one launch gap added when the table's ``timing`` is
``graph-replay`` (a call's share of a CUDA graph of back-to-back calls, as triton's
``do_bench_cudagraph`` times it: the gap between dependent kernels is inside that time). A row gives
its time in microseconds (``us``) or, as benchmarks that print throughput do, in TFLOP/s
(``tflops``: time = 2 M N K / FLOP/s). The shape is checked against memsim's shard, so a row that
names the wrong op fails loudly instead of comparing unlike matmuls.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memsim.datafile import (check_keys, read_toml_file, require_int, require_schema_version,
                             require_str)
from memsim.device import Device
from memsim.emulate import emulate
from memsim.errors import ConfigError
from memsim.model import Model

FILE = "kernels.toml"
OPS = {"qkv": ("qkv",), "o_proj": ("o_proj",), "gate_up": ("gate", "up"), "down": ("down",)}
TABLE_KEYS = ("id", "device", "weights", "activations", "runtime", "library", "source", "rows")
ROW_KEYS = ("model", "tp", "op", "m", "n", "k")
TIMES = ("us", "tflops")   # a row has exactly one: microseconds, or TFLOP/s at 2 M N K FLOPs
TIMINGS = ("kernel", "graph-replay")   # kernel: device trace; graph-replay: launch gap included
CONTEXT_TOKENS = 128       # the step's KV cache: no part of a weight matmul's time
ROOMY_MEMORY = "4 TB"      # a kernel runs on its shard alone; whether the model fits is no question here


@dataclass(frozen=True)
class KernelRow:
    """One measured matmul and memsim's time for it (seconds; error on speed, like decode rows:
    positive when memsim is faster than the kernel)."""

    table: str
    device: str
    model: str
    tp: int
    op: str
    m: int
    n: int
    k: int
    weight_bytes: int          # memsim's bytes of the op read from the main memory tier
    measured_s: float
    predicted_s: float
    bound_by: str

    @property
    def error(self) -> float:
        return self.measured_s / self.predicted_s - 1.0


def load_tables(folder: Path) -> list[dict[str, Any]]:
    """The kernel tables of a validation folder (none when it has no ``kernels.toml``)."""
    path = folder / FILE
    if not path.exists():
        return []
    data = read_toml_file(path)
    check_keys(data, required=("schema_version", "table"), file=str(path))
    require_schema_version(data["schema_version"], file=str(path))
    tables = data.get("table", [])
    if not isinstance(tables, list):
        raise ConfigError("expected [[table]] entries", file=str(path), field="table")
    for i, table in enumerate(tables):
        _check_table(table, f"table.{i}.", str(path))
    return tables


def _check_table(table: Any, prefix: str, file: str) -> None:
    if not isinstance(table, dict):
        raise ConfigError("expected a table", file=file, field=prefix.rstrip("."))
    check_keys(table, required=TABLE_KEYS, optional=("note", "timing"), file=file, prefix=prefix)
    for key in TABLE_KEYS[:-1]:
        require_str(table[key], file=file, field=prefix + key)
    if table.get("timing", TIMINGS[0]) not in TIMINGS:
        raise ConfigError(f"expected one of {', '.join(TIMINGS)}, got {table['timing']!r}",
                          file=file, field=f"{prefix}timing")
    rows = table.get("rows")
    if not isinstance(rows, list) or not rows:
        raise ConfigError("expected a non-empty list of rows", file=file, field=f"{prefix}rows")
    for j, row in enumerate(rows):
        where = f"{prefix}rows.{j}."
        if not isinstance(row, dict):
            raise ConfigError("expected an inline table", file=file, field=where.rstrip("."))
        check_keys(row, required=ROW_KEYS, optional=TIMES, file=file, prefix=where)
        require_str(row["model"], file=file, field=where + "model")
        for key in ("tp", "m", "n", "k"):
            require_int(row[key], file=file, field=where + key)
        if row.get("op") not in OPS:
            raise ConfigError(f"expected one of {', '.join(OPS)}, got {row.get('op')!r}",
                              file=file, field=f"{where}op")
        given = [key for key in TIMES if key in row]
        if len(given) != 1:
            raise ConfigError(f"expected exactly one of {', '.join(TIMES)}, got {len(given)}",
                              file=file, field=f"{where}us")
        value = row[given[0]]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"expected a positive number, got {value!r}", file=file,
                              field=where + given[0])


def measured_seconds(row: dict[str, Any]) -> float:
    """A row's measured time: its ``us``, or 2 M N K FLOPs at its ``tflops``."""
    if "us" in row:
        return float(row["us"]) * 1e-6
    return 2 * row["m"] * row["n"] * row["k"] / (float(row["tflops"]) * 1e12)


def predict_table(table: dict[str, Any], device: Device, models: dict[str, Model]) -> list[KernelRow]:
    """memsim's time for every row of one table; one emulated step per (model, tp, m), on the
    device with a main memory large enough for any shard (a kernel row measures one matmul, not
    whether the model fits: 405B at TP 2 does not in 192 GB). A ``graph-replay`` table's rows
    add one launch gap: the measured call is one kernel, even for gate_up, which memsim runs as
    two ops."""
    with_launch = table.get("timing", TIMINGS[0]) == "graph-replay"
    main = device.main_memory.name
    device = device.with_overrides({f"tiers.{main}.capacity": ROOMY_MEMORY})
    steps: dict[tuple[str, int, int], Any] = {}
    rows = []
    for j, row in enumerate(table["rows"]):
        key = (row["model"], row["tp"], row["m"])
        if key not in steps:
            steps[key] = emulate(device, models[row["model"]], batch=row["m"],
                                 context=CONTEXT_TOKENS, tp=row["tp"], weights=table["weights"],
                                 activations=table["activations"], runtime=table["runtime"])
        seconds, launch, flops, moved, bound = _op_time(steps[key], OPS[row["op"]], main)
        if flops != 2 * row["m"] * row["n"] * row["k"]:
            raise ConfigError(
                f"{row['op']} of {row['model']} at tp {row['tp']} is not {row['n']} x "
                f"{row['k']} in memsim ({flops // (2 * row['m'])} weights per row)",
                file=FILE, field=f"table {table['id']} rows.{j}")
        rows.append(KernelRow(table["id"], table["device"], row["model"], row["tp"], row["op"],
                              row["m"], row["n"], row["k"], moved, measured_seconds(row),
                              seconds + (launch if with_launch else 0.0), bound))
    return rows


def _op_time(report: Any, names: Sequence[str],
             main: str) -> tuple[float, float, int, int, str]:
    """The first layer's ops of ``names``: seconds without launches, the largest launch of one
    of them, FLOPs, bytes read from the ``main`` tier, and what bound the longest of them."""
    launch = report.warm_counts.times[:, -1]
    seconds, one_launch, flops, moved, longest, bound = 0.0, 0.0, 0, 0, -1.0, ""
    for op in report.ops:
        if op.layer == 0 and op.name in names:
            kernel_s = op.time_s - float(launch[op.index])
            seconds += kernel_s
            one_launch = max(one_launch, float(launch[op.index]))
            flops += op.flops
            moved += op.bytes_read[main]
            if kernel_s > longest:
                longest, bound = kernel_s, op.bound_by
    return seconds, one_launch, flops, moved, bound


def predict(tables: Sequence[dict[str, Any]], folder: Path, resolve_device: Any,
            resolve_model: Any) -> list[KernelRow]:
    """Every row of a validation folder's kernel tables, devices and models resolved as its
    decode rows are (the folder's own files first, then the catalog)."""
    rows: list[KernelRow] = []
    for table in tables:
        names = {row["model"] for row in table["rows"]}
        rows += predict_table(table, resolve_device(table["device"], folder),
                              {name: resolve_model(name, folder) for name in names})
    return rows


def median_abs_error(rows: Sequence[KernelRow]) -> float:
    return statistics.median(abs(r.error) for r in rows)


def render(tables: Sequence[dict[str, Any]], rows: Sequence[KernelRow],
           findings: dict[str, str] | None = None) -> list[str]:
    """The report's kernel section: per table its source, its median, what its rows show
    (``findings`` keyed by table id) and every row."""
    if not rows:
        return []
    lines = ["## Kernel rows (one weight matmul)", "",
             "A kernel library's measured time for one matmul of a decode step beside memsim's "
             "time for the same op in that step, without its launch column (one launch added for "
             "a table timed inside a CUDA graph; `memsim.kernel_rows`, "
             "`validation/kernels.toml`). Error as for decode rows: memsim's speed over the "
             "kernel's, minus one. These rows are not in the decode medians above.", ""]
    for table in tables:
        mine = [r for r in rows if r.table == table["id"]]
        at_one = [r for r in mine if r.m == 1]
        medians = (f"Median absolute error **{100 * median_abs_error(mine):.1f}%** over "
                   f"{len(mine)} rows")
        if at_one:
            medians += f"; {100 * median_abs_error(at_one):.1f}% over the {len(at_one)} at M = 1"
        lines += [f"### {table['id']} ({table['device']}, {table['weights']} weights, "
                  f"{table['activations']} activations, runtime {table['runtime']})", "",
                  f"{table['library']}. Source: {table['source']}. {table.get('note', '')}", "",
                  *(["Timed per call of a CUDA graph of back-to-back calls: memsim's figure adds "
                     "one launch gap to the op's time.", ""]
                    if table.get("timing") == "graph-replay" else []),
                  medians + ".", ""]
        if findings and table["id"] in findings:
            lines += [f"What the rows show: {findings[table['id']]}", ""]
        lines += ["| model | tp | op | M | N x K | measured us | memsim us | error | measured "
                  "TB/s | memsim TB/s | memsim bound by |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in mine:
            lines.append(f"| {r.model} | {r.tp} | {r.op} | {r.m} | {r.n} x {r.k} | "
                         f"{1e6 * r.measured_s:.2f} | {1e6 * r.predicted_s:.2f} | "
                         f"{100 * r.error:+.0f}% | {r.weight_bytes / r.measured_s / 1e12:.2f} | "
                         f"{r.weight_bytes / r.predicted_s / 1e12:.2f} | {r.bound_by} |")
        lines.append("")
    return lines
