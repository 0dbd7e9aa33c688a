"""Plots of a stored study (matplotlib, ``pip install memsim[plot]``; headless).

Kinds: ``latency`` (time per token against a swept workload field, a line per device and
model), ``devices`` (time per token per device, side by side), ``sram`` (off-chip bytes against
the on-chip capacity a study swept with ``tiers.<on-chip>.capacity``), ``roofline`` (one stored
point's ops against the device's roofs) and ``bytes`` (one stored point's bytes per tier,
stacked per op). The last two run the point again, which gives the same counts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from memsim.errors import ConfigError
from memsim.store import Store
from memsim.study import Point
from memsim.units import format_quantity, parse_quantity

KINDS = ("latency", "devices", "sram", "roofline", "bytes")


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("plots need matplotlib: pip install 'memsim[plot]'",
                          field="plot") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _matches(row: dict[str, Any], where: Mapping[str, str]) -> bool:
    inputs = row["inputs"]
    for key, value in where.items():
        have = inputs.get(key, inputs["workload"].get(key, inputs["set"].get(key)))
        if str(have) != str(value):
            return False
    return True


def _rows(store: Store, study: str | None, where: Mapping[str, str]) -> list[dict[str, Any]]:
    rows = [r for r in store.rows(study) if r["figures"] is not None and _matches(r, where)]
    if not rows:
        raise ConfigError("no stored point with figures matches", file=store.path,
                          field="where" if where else "study")
    return rows


def _swept_field(rows: list[dict[str, Any]]) -> str:
    counts = {name: len({str(r["inputs"]["workload"].get(name)) for r in rows})
              for name in ("batch", "context", "new_tokens", "tp")}
    return max(counts, key=counts.__getitem__)


def _label(row: dict[str, Any], fixed: Sequence[str]) -> str:
    inputs = row["inputs"]
    parts = [inputs["device"], inputs["model"]]
    parts += [f"{k}={v}" for k, v in sorted(inputs["set"].items()) if k not in fixed]
    parts += [f"{k}={v}" for k, v in sorted(inputs["workload"].items()) if k not in fixed]
    return " ".join(parts)


def plot(kind: str, store_path: str | Path, output: str | Path, *, study: str | None = None,
         x: str | None = None, where: Mapping[str, str] | None = None) -> Path:
    """Render plot ``kind`` from the results store to ``output`` (.png or .svg)."""
    if kind not in KINDS:
        raise ConfigError(f"expected one of {', '.join(KINDS)}, got {kind!r}", field="kind")
    output = Path(output)
    if output.suffix.lower() not in (".png", ".svg"):
        raise ConfigError("the output is a .png or .svg file", file=str(output), field="output")
    if not Path(store_path).exists():
        raise ConfigError("no such results store", file=str(store_path), field="store")
    plt = _pyplot()
    with Store(store_path) as store:
        rows = _rows(store, study, dict(where or {}))
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    {"latency": _latency, "devices": _devices, "sram": _sram, "roofline": _roofline,
     "bytes": _bytes}[kind](ax, rows, x)
    fig.tight_layout()
    fig.savefig(output)
    plt.close(fig)
    return output


def _latency(ax: Any, rows: list[dict[str, Any]], x: str | None) -> None:
    field = x or _swept_field(rows)
    lines: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for row in rows:
        value = row["inputs"]["workload"].get(field)
        if value is None:
            continue
        lines[_label(row, (field,))].append((float(value), row["figures"]["time_per_token_s"]))
    for label, points in sorted(lines.items()):
        points.sort()
        ax.plot([p[0] for p in points], [1e3 * p[1] for p in points], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel(field)
    ax.set_ylabel("ms per token")
    ax.set_title(f"time per token against {field}")
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)


def _devices(ax: Any, rows: list[dict[str, Any]], x: str | None) -> None:
    best: dict[str, float] = {}
    for row in rows:
        label = _label(row, tuple(row["inputs"]["workload"]) + tuple(row["inputs"]["set"]))
        seconds = row["figures"]["time_per_token_s"]
        best[label] = min(seconds, best.get(label, seconds))
    labels = sorted(best, key=best.__getitem__)
    ax.barh(labels, [1e3 * best[label] for label in labels])
    ax.set_xlabel("ms per token (fastest stored point of each)")
    ax.set_title("devices side by side")
    ax.tick_params(axis="y", labelsize=7)


def _sram(ax: Any, rows: list[dict[str, Any]], x: str | None) -> None:
    lines: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for row in rows:
        capacity = [v for k, v in row["inputs"]["set"].items() if k.endswith(".capacity")
                    and k.startswith("tiers.") and k.split(".")[1] in ("sram", "l2", "vmem")]
        if not capacity:
            continue
        size = parse_quantity(capacity[0], "capacity", field="set")
        label = _label(row, tuple(k for k in row["inputs"]["set"] if k.endswith(".capacity")))
        lines[label].append((size, row["figures"]["off_chip_bytes"]))
    if not lines:
        raise ConfigError("the sram plot needs points that set tiers.sram.capacity",
                          field="set")
    for label, points in sorted(lines.items()):
        points.sort()
        ax.plot([p[0] / 2 ** 20 for p in points], [p[1] / 1e9 for p in points], marker="o",
                label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("on-chip capacity (MiB)")
    ax.set_ylabel("off-chip bytes per step (GB)")
    ax.set_title("on-chip capacity against off-chip traffic")
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)


def _rerun(row: dict[str, Any]) -> tuple[Any, Any]:
    """A stored decode point run again: its device and report."""
    from memsim.sweep import _device, _model
    from memsim.emulate import emulate
    from memsim.workload import Decode
    inputs = row["inputs"]
    point = Point(device=inputs["device"], model=inputs["model"],
                  overrides=tuple(sorted(inputs["set"].items())),
                  add_tiers=tuple(inputs["add_tier"]))
    dev = _device(point.device, point.overrides, point.add_tiers)
    return dev, emulate(dev, _model(point.model), Decode(**inputs["workload"]))


def _roofline(ax: Any, rows: list[dict[str, Any]], x: str | None) -> None:
    dev, report = _rerun(rows[0])
    tiers = report.tier_names
    intensity, rate, names = [], [], []
    for op in report.ops:
        off_chip = sum(op.bytes_read[t] + op.bytes_written[t] for t in tiers[1:])
        if op.flops and off_chip and op.time_s:
            intensity.append(op.flops / off_chip)
            rate.append(op.flops / op.time_s)
            names.append(op.name)
    grid = [2.0 ** e for e in range(-4, 14)]
    peak = dev.matrix_peak
    for tier in dev.tiers[1:]:
        ax.plot(grid, [min(peak, tier.sustained_bandwidth * g) for g in grid],
                label=f"roof: {tier.name} {format_quantity(tier.sustained_bandwidth, 'bandwidth')}")
    ax.scatter(intensity, rate, s=8, c="black", label="ops of the step")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("FLOP per off-chip byte")
    ax.set_ylabel("achieved FLOP/s")
    ax.set_title(f"{report.model} on {report.device}: roofline (BF16 peak "
                 f"{format_quantity(peak, 'compute_rate')})")
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)


def _bytes(ax: Any, rows: list[dict[str, Any]], x: str | None) -> None:
    _, report = _rerun(rows[0])
    totals: dict[str, dict[str, int]] = {}
    for op in report.ops:
        group = totals.setdefault(op.name, dict.fromkeys(report.tier_names, 0))
        for tier, nbytes in op.bytes_read.items():
            group[tier] += nbytes
    names = list(totals)
    bottom = [0.0] * len(names)
    for tier in report.tier_names:
        values = [totals[name][tier] / 1e9 for name in names]
        ax.bar(names, values, bottom=bottom, label=f"read from {tier}")
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("GB per step (all layers)")
    ax.set_title(f"{report.model} on {report.device}: bytes per tier and op")
    ax.tick_params(axis="x", labelrotation=60, labelsize=7)
    ax.legend(fontsize=7)
