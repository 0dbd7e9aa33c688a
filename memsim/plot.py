"""Plots of a stored study (matplotlib, ``pip install memsim[plot]``; headless).

Kinds: ``latency`` (time per token against a swept workload field, a line per varying input,
a panel per device when that makes too many lines),
``devices`` (time per token per device, side by side), ``sram`` (off-chip bytes against the
on-chip capacity a study swept with ``tiers.<on-chip>.capacity``), ``roofline`` (one stored
point's ops against the device's roofs) and ``bytes`` (one stored point's bytes crossing each
tier boundary, per op). The last two run the point again, which gives the same counts.

Every plot names what it draws: the inputs every drawn row shares are in the title, the inputs
that vary in the legend. A plot of one point refuses a store of several unless ``where`` picks
one; more than :data:`LEGEND_INSIDE` series put the legend outside the axes.
"""

from __future__ import annotations

import re
import textwrap
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memsim.emulate import emulate
from memsim.errors import ConfigError
from memsim.inputs import decode_from, model_from
from memsim.store import Store
from memsim.study import Point
from memsim.sweep import point_device
from memsim.units import format_quantity, parse_quantity

KINDS = ("latency", "devices", "sram", "roofline", "bytes")
SINGLE_POINT = ("roofline", "bytes")
LEGEND_INSIDE = 8
TITLE_WIDTH = 90


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("plots need matplotlib: pip install 'memsim[plot]'",
                          field="plot") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _line(**style: Any) -> Any:
    from matplotlib.lines import Line2D
    return Line2D([], [], **style)


def inputs_of(row: dict[str, Any]) -> dict[str, str]:
    """A stored row's inputs as flat ``name: text`` (workload fields and what-ifs by name)."""
    inputs = row["inputs"]
    flat = {"device": str(inputs["device"]), "model": str(inputs["model"])}
    if inputs.get("add_tier"):
        flat["add_tier"] = "+".join(map(str, inputs["add_tier"]))
    flat.update({k: str(v) for k, v in inputs.get("workload", {}).items()})
    flat.update({k: str(v) for k, v in inputs.get("set", {}).items()})
    flat.update({f"speculative.{k}": str(v) for k, v in inputs.get("speculative", {}).items()})
    return flat


def _matches(row: dict[str, Any], where: Mapping[str, str]) -> bool:
    flat = inputs_of(row)
    return all(flat.get(key) == str(value) for key, value in where.items())


def _rows(store: Store, study: str | None, where: Mapping[str, str]) -> list[dict[str, Any]]:
    rows = [r for r in store.rows(study) if r["figures"] is not None and _matches(r, where)]
    if not rows:
        raise ConfigError("no stored point with figures matches", file=store.path,
                          field="where" if where else "study")
    return rows


def varying(rows: list[dict[str, Any]]) -> tuple[dict[str, str], list[str]]:
    """The inputs all rows share (``name: value``) and the names of those that vary."""
    flats = [inputs_of(r) for r in rows]
    names = sorted({n for f in flats for n in f})
    fixed, moving = {}, []
    for name in names:
        values = {f.get(name, "-") for f in flats}
        if len(values) == 1:
            fixed[name] = values.pop()
        else:
            moving.append(name)
    return fixed, moving


def _title(what: str, fixed: Mapping[str, str], skip: tuple[str, ...] = ()) -> str:
    shared = ", ".join(f"{k}={v}" for k, v in fixed.items() if k not in skip)
    return "\n".join(textwrap.wrap(f"{what}: {shared}" if shared else what, TITLE_WIDTH))


def _label(row: dict[str, Any], names: list[str]) -> str:
    flat = inputs_of(row)
    return ", ".join(f"{n}={flat.get(n, '-')}" if n not in ("device", "model")
                     else flat.get(n, "-") for n in names) or "all points"


def figure(kind: str, store_path: str | Path, *, study: str | None = None,
           x: str | None = None, where: Mapping[str, str] | None = None) -> Any:
    """The matplotlib Figure of plot ``kind`` from a results store (not saved)."""
    if kind not in KINDS:
        raise ConfigError(f"expected one of {', '.join(KINDS)}, got {kind!r}", field="kind")
    if not Path(store_path).exists():
        raise ConfigError("no such results store", file=str(store_path), field="store")
    plt = _pyplot()
    with Store(store_path, create=False) as store:
        rows = _rows(store, study, dict(where or {}))
    if kind in SINGLE_POINT and len(rows) > 1:
        _, moving = varying(rows)
        raise ConfigError(f"a {kind} plot draws one point and {len(rows)} match; pick one with "
                          f"--where (these vary: {', '.join(moving) or 'the study'})",
                          file=str(store_path), field="where")
    if kind == "latency":
        return _latency_figure(plt, rows, x)
    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=100)
    {"devices": _devices, "sram": _sram, "roofline": _roofline,
     "bytes": _bytes}[kind](ax, rows, x)
    handles, _ = ax.get_legend_handles_labels()
    if len(handles) > LEGEND_INSIDE:
        fig.set_size_inches(13, 5.5)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    elif handles:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot(kind: str, store_path: str | Path, output: str | Path, *, study: str | None = None,
         x: str | None = None, where: Mapping[str, str] | None = None) -> Path:
    """Render plot ``kind`` from the results store to ``output`` (.png or .svg)."""
    output = Path(output)
    if output.suffix.lower() not in (".png", ".svg"):
        raise ConfigError("the output is a .png or .svg file", file=str(output), field="output")
    if not output.parent.exists():
        raise ConfigError(f"the folder {str(output.parent)!r} does not exist",
                          file=str(output), field="output")
    if output.is_dir():
        raise ConfigError("this is a folder; name a file (in it)", file=str(output),
                          field="output")
    fig = figure(kind, store_path, study=study, x=x, where=where)
    fig.savefig(output)
    _pyplot().close(fig)
    return output


def _swept_field(rows: list[dict[str, Any]]) -> str:
    counts = {name: len({str(r["inputs"]["workload"].get(name)) for r in rows})
              for name in ("batch", "context", "new_tokens", "tp")}
    return max(counts, key=counts.__getitem__)


def _facet(rows: list[dict[str, Any]], series: list[str]) -> str | None:
    """The varying input to draw one panel per value of, when one panel would hold more than
    :data:`LEGEND_INSIDE` series (devices first, then models, then the most varied)."""
    flats = [inputs_of(r) for r in rows]
    if len({tuple(f.get(n) for n in series) for f in flats}) <= LEGEND_INSIDE:
        return None
    counts = {n: len({f.get(n) for f in flats}) for n in series}
    preferred = [n for n in ("device", "model") if n in counts]
    return preferred[0] if preferred else max(counts, key=counts.__getitem__)


def _latency_figure(plt: Any, rows: list[dict[str, Any]], x: str | None) -> Any:
    """Time per token against ``x``: a line per varying input; small multiples (a panel per
    device, or model) when one panel would hold more than 8 lines."""
    field = x or _swept_field(rows)
    fixed, moving = varying(rows)
    series = [n for n in moving if n != field]
    facet = _facet(rows, series)
    panels = sorted({inputs_of(r).get(facet, "") for r in rows}) if facet else [""]
    columns = min(len(panels), 3)
    lines_of = (len(panels) + columns - 1) // columns
    fig, axes = plt.subplots(lines_of, columns, figsize=(5.2 * columns, 4.2 * lines_of),
                             dpi=100, squeeze=False)
    legend = [n for n in series if n != facet]
    colors: dict[str, Any] = {}
    for ax, panel in zip(axes.flat, panels):
        lines: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for row in rows:
            value = row["inputs"]["workload"].get(field)
            if value is None or (facet and inputs_of(row).get(facet) != panel):
                continue
            lines[_label(row, legend)].append((float(value),
                                               row["figures"]["time_per_token_s"]))
        for label, points in sorted(lines.items(), key=lambda item: _natural(item[0])):
            points.sort()
            drawn = ax.plot([p[0] for p in points], [1e3 * p[1] for p in points], marker="o",
                            label=label, color=colors.get(label))
            colors.setdefault(label, drawn[0].get_color())
        ax.set_xscale("log", base=2)
        ax.set_xlabel(field)
        ax.set_ylabel("ms per token")
        ax.grid(True, alpha=0.3)
        if facet:
            ax.set_title(f"{facet}={panel}" if facet not in ("device", "model") else panel,
                         fontsize=9)
        if lines and not facet:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    if facet and colors:                # one legend for every panel, below them
        handles = [_line(color=color, marker="o", label=label)
                   for label, color in sorted(colors.items(), key=lambda i: _natural(i[0]))]
        fig.legend(handles=handles, loc="lower center", fontsize=8, frameon=False,
                   ncol=min(3, len(handles)))
    if not any(ax.get_lines() for ax in axes.flat):
        raise ConfigError(f"no stored point sets the workload field {field!r}", field="x")
    title = _title(f"time per token against {field}", fixed, (field,))
    if facet:
        fig.suptitle(title, fontsize=10)
        rows_of_legend = (len(colors) + 2) // 3
        fig.tight_layout(rect=(0, 0.05 * rows_of_legend / lines_of, 1, 1))
    else:
        axes.flat[0].set_title(title, fontsize=9)
        fig.tight_layout()
    return fig


def _natural(text: str) -> list[Any]:
    """Sort key that orders numbers inside labels by value (1024 before 8192 before 32768)."""
    return [(0, float(part), "") if re.fullmatch(r"\d+(\.\d+)?", part) else (1, 0.0, part)
            for part in re.split(r"(\d+(?:\.\d+)?)", text)]


def _devices(ax: Any, rows: list[dict[str, Any]], x: str | None) -> None:
    fixed, moving = varying(rows)
    best: dict[str, float] = {}
    for row in rows:
        label = _label(row, moving)
        seconds = row["figures"]["time_per_token_s"]
        best[label] = min(seconds, best.get(label, seconds))
    labels = sorted(best, key=best.__getitem__)
    ax.barh(labels, [1e3 * best[label] for label in labels])
    ax.set_xlabel("ms per token")
    ax.set_title(_title("time per token", fixed), fontsize=9)
    ax.tick_params(axis="y", labelsize=7)


def _on_chip_capacity(row: dict[str, Any]) -> tuple[str, str] | None:
    for key, value in row["inputs"]["set"].items():
        parts = key.split(".")
        if len(parts) == 3 and parts[0] == "tiers" and parts[2] == "capacity" \
                and parts[1] in ("sram", "l2", "vmem"):
            return key, value
    return None


def _sram(ax: Any, rows: list[dict[str, Any]], x: str | None) -> None:
    rows = [r for r in rows if _on_chip_capacity(r)]
    if not rows:
        raise ConfigError("the sram plot needs points that set tiers.sram.capacity",
                          field="set")
    fixed, moving = varying(rows)
    swept = {_on_chip_capacity(r)[0] for r in rows}
    series = [n for n in moving if n not in swept]
    lines: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for row in rows:
        size = parse_quantity(_on_chip_capacity(row)[1], "capacity", field="set")
        lines[_label(row, series)].append((size, row["figures"]["off_chip_bytes"]))
    for label, points in sorted(lines.items()):
        points.sort()
        ax.plot([p[0] / 2 ** 20 for p in points], [p[1] / 1e9 for p in points], marker="o",
                label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("on-chip capacity (MiB)")
    ax.set_ylabel("off-chip bytes per step (GB)")
    ax.set_title(_title("on-chip capacity against off-chip traffic", fixed, tuple(swept)),
                 fontsize=9)
    ax.grid(True, alpha=0.3)


def rerun(row: dict[str, Any]) -> tuple[Any, Any]:
    """A stored decode point run again: its device and report."""
    inputs = row["inputs"]
    point = Point(device=inputs["device"], model=inputs["model"],
                  workload=tuple(sorted(inputs["workload"].items())),
                  overrides=tuple(sorted(inputs["set"].items())),
                  add_tiers=tuple(inputs["add_tier"]))
    dev = point_device(point)
    return dev, emulate(dev, model_from(point.model), decode_from(inputs["workload"]))


def _roofline(ax: Any, rows: list[dict[str, Any]], x: str | None) -> None:
    dev, report = rerun(rows[0])
    tiers = report.tier_names
    intensity, rate = [], []
    for op in report.ops:
        off_chip = sum(op.bytes_read[t] + op.bytes_written[t] for t in tiers[1:])
        if op.flops and off_chip and op.time_s:
            intensity.append(op.flops / off_chip)
            rate.append(op.flops / op.time_s)
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
    fixed, _ = varying(rows)
    ax.set_title(_title(f"roofline (BF16 peak {format_quantity(peak, 'compute_rate')})",
                        fixed), fontsize=9)
    ax.grid(True, alpha=0.3)


def _bytes(ax: Any, rows: list[dict[str, Any]], x: str | None) -> None:
    """Bytes crossing each boundary between a tier and the chip, once per direction: reads
    from a tier off the chip, writes to it. The on-chip tier's own reads would count those
    bytes again, so they are drawn only on a device with no tier off the chip."""
    _, report = rerun(rows[0])
    outer = report.tier_names[1:] or report.tier_names[:1]
    flows = [(t, "read", f"{t} → chip") for t in outer] + \
        [(t, "written", f"chip → {t}") for t in outer]
    totals: dict[str, dict[str, int]] = {}
    for op in report.ops:
        group = totals.setdefault(op.name, {label: 0 for _, _, label in flows})
        for tier, way, label in flows:
            group[label] += (op.bytes_read if way == "read" else op.bytes_written)[tier]
    names = list(totals)
    bottom = [0.0] * len(names)
    for _, _, label in flows:
        values = [totals[name][label] / 1e9 for name in names]
        if not any(values):
            continue
        ax.bar(names, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("GB per step (all layers)")
    fixed, _ = varying(rows)
    ax.set_title(_title("bytes crossing each tier boundary, per op", fixed), fontsize=9)
    ax.tick_params(axis="x", labelrotation=60, labelsize=7)
