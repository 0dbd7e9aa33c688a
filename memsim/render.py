"""Text for people: tables, CSV and prose built from memsim's result values (no computing)."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from typing import Any

from memsim.device import Device
from memsim.units import format_quantity

COMPARE_WIDTH = 120


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned text columns under a dashed rule."""
    cells = [list(map(str, headers))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def csv_text(rows: Sequence[dict[str, Any]]) -> str:
    """Dicts as CSV text, the first row's keys as the header."""
    out = io.StringIO()
    if rows:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return out.getvalue()


def _binary(dev: Device, tier: int) -> bool:
    """Whether the device file gives a tier's capacity in binary units (``MiB``)."""
    raw = dev.data.get("tiers", [{}])[tier].get("capacity", "")
    return isinstance(raw, str) and "iB" in raw


def capacity_text(dev: Device, tier: int) -> str:
    """A tier's capacity in the units its device file uses (binary or decimal)."""
    t = dev.tiers[tier]
    return format_quantity(t.capacity, "capacity", binary=_binary(dev, tier))


def device_summary(dev: Device) -> dict[str, Any]:
    """The catalog's figures of one device, plain data."""
    low_name, low_peak = dev.lowest_precision
    main = dev.main_memory
    return {
        "name": dev.name, "vendor": dev.vendor, "display_name": dev.display_name,
        "on_chip_bytes": dev.tiers[0].capacity, "main_memory": main.name,
        "main_memory_bytes": main.capacity, "main_memory_bandwidth": main.bandwidth,
        "bf16_peak": dev.matrix_peak, "lowest_precision": low_name,
        "lowest_precision_peak": low_peak, "ridge_flop_per_byte": dev.ridge_point,
        "layout": dev.layout.policy,
    }


def devices_table(devices: Sequence[Device]) -> str:
    """The device catalog, one row per device; capacities in the units of each file."""
    rows = []
    for dev in devices:
        s = device_summary(dev)
        main = dev.tier_index(dev.main_memory.name)
        rows.append((s["name"], s["vendor"], capacity_text(dev, 0),
                     f"{capacity_text(dev, main)} {s['main_memory']}",
                     format_quantity(s["main_memory_bandwidth"], "bandwidth"),
                     format_quantity(s["bf16_peak"], "compute_rate"),
                     f"{format_quantity(s['lowest_precision_peak'], 'compute_rate')} "
                     f"{s['lowest_precision']}",
                     f"{s['ridge_flop_per_byte']:.0f}", s["layout"]))
    return table(("device", "vendor", "on-chip SRAM", "main memory", "bandwidth", "BF16 peak",
                  "lowest-precision peak", "ridge FLOP/B", "layout"), rows)


def models_table(data: Sequence[dict[str, Any]]) -> str:
    """The model catalog from its plain data."""
    rows = [(d["name"], d["layers"], d["hidden"], f"{d['heads']}/{d['kv_heads']}", d["ffn"],
             d["vocab"], f"{d['experts']}/{d['experts_per_token']}" if d["experts"] > 1 else "-",
             f"{d['params'] / 1e9:.2f} B", f"{d['active_params'] / 1e9:.2f} B",
             format_quantity(d["kv_bytes_per_token_bf16"], "capacity", binary=True))
            for d in data]
    return table(("model", "layers", "hidden", "heads/kv", "ffn", "vocab", "experts/top-k",
                  "params", "active", "KV/token bf16"), rows)


def show_text(dev: Device) -> str:
    """One device, every figure and its source."""
    s = device_summary(dev)
    lines = [f"{dev.display_name} ({dev.name}), {dev.vendor}; layout {dev.layout.policy}",
             f"  clock {format_quantity(dev.clock_hz, 'frequency')}, {dev.cores} "
             f"{dev.core_name}s with {format_quantity(dev.core_memory, 'capacity', binary=True)} "
             f"each; op launch {format_quantity(dev.op_launch_s, 'time')}"
             + (f", kernel fixed {format_quantity(dev.kernel_fixed_s, 'time')}"
                if dev.kernel_fixed_s else ""),
             "  compute  " + ", ".join(f"{c} {format_quantity(v, 'compute_rate')}"
                                       for c, v in dev.compute)
             + f"; vector {format_quantity(dev.vector_ops_per_s, 'compute_rate')}"]
    if dev.sustained_compute:
        lines.append("  matmuls  " + ", ".join(
            f"{c} {format_quantity(v, 'compute_rate')}" for c, v in dev.sustained_compute)
            + " (measured achievable rates; other classes at their peaks)")
    lines += [f"  ridge    {s['ridge_flop_per_byte']:.0f} FLOP per byte of {dev.main_memory.name}"]
    rows = [(t.name, t.kind, capacity_text(dev, i), format_quantity(t.bandwidth, "bandwidth"),
             format_quantity(t.sustained_bandwidth, "bandwidth")
             + (" *" if t.sustained_defaulted else ""),
             format_quantity(t.latency_s, "time"),
             format_quantity(t.energy_j_per_byte / 8, "energy_per_bit"),
             format_quantity(t.granularity, "capacity")) for i, t in enumerate(dev.tiers)]
    lines.append(table(("tier", "kind", "capacity", "peak", "sustained", "latency", "energy",
                        "granularity"), rows))
    layout = dev.layout
    lines.append(f"  homes    weights {layout.weights}, kv {layout.kv}, activations "
                 f"{layout.activations}" + (f", spill {layout.spill}" if layout.spill else ""))
    if any(t.sustained_defaulted for t in dev.tiers):
        lines.append("  * sustained bandwidth not in the device file: the default fraction of "
                     "the peak for the tier's kind")
    lines.append(f"  power    TDP {_watts(dev.tdp_w)}, idle {_watts(dev.idle_power_w)}; runtime "
                 f"{dev.runtime or 'vendor (none named)'}")
    for name, link in (("link", dev.link), ("scale-out", dev.scale_out)):
        if link:
            lines.append(f"  {name:<9} {format_quantity(link.bandwidth, 'bandwidth')} per "
                         f"direction, {format_quantity(link.latency_s, 'time')}, "
                         f"{link.topology}, {link.kind or 'kind not given'}, up to "
                         f"{link.max_chips} chips")
    lines.append("  sources")
    lines += [f"    {key}: {text}" for key, text in dev.sources]
    return "\n".join(lines)


def formats_table(data: Sequence[dict[str, Any]]) -> str:
    """Storage formats and their exact bits per weight."""
    return (table(("format", "bits/weight", "compute", "storage"),
                  [(d["name"], f"{d['bits_per_element_k4096']:.4f}", d["compute"],
                    d["description"]) for d in data])
            + "\n\nbits/weight includes group metadata for rows of 4,096 inputs; "
              "int4-gN works for any group size N >= 8.")


def run_csv(report: Any, extra: dict[str, Any] | None = None) -> str:
    """The op rows of a run as CSV, after ``# name,value`` lines of the summary figures
    (``pandas.read_csv(..., comment="#")`` skips them) and of ``extra``."""
    summary = {
        "device": report.device, "model": report.model, "chips": report.chips,
        "policy": report.policy, "time_per_token_s": repr(report.time_per_token),
        "tokens_per_s": repr(report.tokens_per_s),
        "tokens_per_s_total": repr(report.tokens_per_s_total),
        "cycles": repr(report.cycles), "energy_per_token_j": repr(report.energy_per_token),
        "arithmetic_intensity": repr(report.arithmetic_intensity),
        "bottleneck": report.bottleneck, "weight_bytes_read": report.weight_bytes_read,
        "weights_held": report.weights_held, "link_bytes": report.link_bytes,
        "flops": report.flops,
    }
    summary.update({key: repr(v) if isinstance(v, float) else v
                    for key, v in (extra or {}).items()})
    head = "".join(f"# {key},{value}\n" for key, value in summary.items())
    return head + report.to_csv()


def spill_cost_text(cost: Any) -> str:
    """The slowdown of a run against its device with main memory holding everything."""
    return (f"\nagainst the same device with {cost.main_tier} holding everything "
            f"({format_quantity(cost.baseline_capacity, 'capacity')}, a hypothetical): "
            f"{cost.slowdown:.2f}x the time per token "
            f"({format_quantity(cost.time_per_token_s, 'time')} vs "
            f"{format_quantity(cost.baseline_time_per_token_s, 'time')})")


def plan_data(dev: Device, mod: Any, system: Any, table_rows: Sequence[Any],
              refusal: str | None) -> dict[str, Any]:
    """What ``memsim plan`` reports, as plain data."""
    stages = [{"stage": p.stage, "layers": [p.layers[0], p.layers[-1]] if p.layers else [],
               "weights": p.bytes_by_tier("weight"), "kv": p.bytes_by_tier("kv"),
               "pinned_bytes": sum(t.bytes for t in p.tensors if t.pinned),
               "spilled": list(p.spilled),
               "tensors": [{"name": t.name, "tiers": {p.tier_names[i]: b for i, b in t.tier_bytes},
                            "pinned": t.pinned} for t in p.tensors if not t.aliased]}
              for p in system.stages]
    return {"device": dev.name, "model": mod.name, "one_chip_refusal": refusal,
            "policy": system.policy, "tp": system.workload.tp,
            "pp": 1 if system.parallel_stages else len(system.stages), "ep": system.workload.ep,
            "chips": system.chips, "microbatches": system.workload.microbatches,
            "capacity": [c.to_dict() for c in table_rows], "stages": stages}


def plan_text(dev: Device, data: dict[str, Any], table_rows: Sequence[Any], *,
              all_stages: bool = False) -> str:
    """``memsim plan``'s placement table and the fewest chips per policy."""
    lines = []
    if data["one_chip_refusal"]:
        lines.append(f"as given it does not fit: {data['one_chip_refusal']}\n"
                     "the smallest system that holds it:")
    groups = data["ep"] > 1         # the rows are expert groups side by side, not stages
    lines.append(f"{data['model']} on {data['device']}: policy {data['policy']}, "
                 f"{data['chips']} chip(s) = tp {data['tp']} x pp {data['pp']}"
                 + (f" x ep {data['ep']}" if groups else "")
                 + f", {data['microbatches']} microbatch(es); bytes each chip of "
                 + ("an expert group holds:" if groups else "a stage holds:"))
    rows = []
    for st in data["stages"]:
        span = f"{st['layers'][0]}-{st['layers'][1]}" if st["layers"] else "-"
        rows.append([st["stage"], span]
                    + [format_quantity(st["weights"][t], "capacity") for t in dev.tier_names]
                    + [format_quantity(st["kv"][t], "capacity") for t in dev.tier_names]
                    + [format_quantity(st["pinned_bytes"], "capacity")])
    if len(rows) > 12 and not all_stages:
        rows = rows[:5] + [["..."] * len(rows[0])] + rows[-5:]
    lines.append(table(["group" if groups else "stage", "layers"]
                       + [f"weights {t}" for t in dev.tier_names]
                       + [f"kv {t}" for t in dev.tier_names] + ["pinned on chip"], rows))
    lines += [f"  spilled (stage {st['stage']}): {note}"
              for st in data["stages"] for note in st["spilled"]]
    lines.append("\nfewest chips under each policy this device supports:")
    lines.append(table(("policy", "chips", "tp", "pp", "fits", "short by"),
                       [(c.policy, c.chips if c.fits else "-", c.tp if c.fits else "-",
                         c.pp if c.fits else "-", "yes" if c.fits else c.reason,
                         format_quantity(c.shortfall_bytes, "capacity") if not c.fits else "")
                        for c in table_rows]))
    return "\n".join(lines)


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def compare_text(rows: Sequence[Any], heading: str) -> str:
    """The comparison table in at most 120 columns: one unit per column, notes below."""
    notes: list[str] = []

    def note(text: str) -> str:
        if not text:
            return ""
        notes.append(text)
        return f"[{len(notes)}]"

    body = []
    for r in rows:
        if not r.fits:
            body.append([r.device, "-", r.policy, "-", "-", "-", "-", "-", "-", "-",
                         note(f"{r.device}: short by "
                              f"{format_quantity(r.shortfall_bytes, 'capacity')}: {r.note}")])
            continue
        body.append([r.device, f"{r.chips}={r.tp}x{r.pp}", r.policy,
                     _num(r.time_per_token_s * 1e3, ".2f"), _num(r.tokens_per_s, ".1f"),
                     _num(r.tokens_per_s_total, ".1f"),
                     _num(r.energy_per_token_j * 1e3, ".2f"),
                     _num(r.usd_per_million_tokens, ".2f"), r.bottleneck,
                     _num(r.off_chip_weight_bytes / 1e9 if r.off_chip_weight_bytes is not None
                          else None, ".2f"),
                     note(f"{r.device}: {r.note}" if r.note else "")])
    text = table(("device", "chips", "policy", "ms/tok", "tok/s/seq", "tok/s", "mJ/tok",
                  "$/Mtok", "bound", "wGB/step", "note"), body)
    lines = [_wrap(heading), text, "", _wrap(
        "chips: tp x pp; tok/s: the whole batch; wGB/step: weight bytes read off chip per warm "
        "step, all chips; $/Mtok: the device file's price per chip-hour (or --price) x chips "
        "over the aggregate tokens/s, '-' where no price is public.")]
    lines += [_wrap(f"[{i}] {n}") for i, n in enumerate(notes, 1)]
    return "\n".join(lines)


def _wrap(line: str, width: int = COMPARE_WIDTH) -> str:
    """A note line wrapped to ``width`` columns (table lines are narrower already)."""
    if len(line) <= width:
        return line
    import textwrap
    return "\n".join(textwrap.wrap(line, width, subsequent_indent="    "))


def _watts(value: float | None) -> str:
    return "not given" if value is None else format_quantity(value, "power")


def runtime_text(data: dict[str, Any]) -> str:
    """``memsim show --runtime NAME``: every figure with its unit and source."""
    lib = data["collective_library"]
    lines = [f"{data['name']} ({data['file']}): {data['description']}",
             *([f"  derived from {data['base']}: figures this file does not replace are its, with "
                f"their sources"]
               if data.get("base") else []),
             f"  {data['summary']}; {data['launches_per_dense_layer']} launches per dense layer",
             table(("field", "value", "source"),
                   [(r["field"], r["value"], r["source"] or "-") for r in data["figures"]]),
             "", f"collective library {lib['name']} ({lib['file']}): {lib['description']}"]
    lines += [f"  {key}: {value}" for key, value in lib["origin"].items()]
    lines.append(table(("field", "value", "source"),
                       [(r["field"], r["value"], r["source"] or "-") for r in lib["figures"]]))
    return "\n".join(lines)


def runtimes_table(data: Sequence[dict[str, Any]]) -> str:
    """``memsim runtimes``: one row per software stack."""
    def graph(d: dict[str, Any]) -> str:
        return next((r["value"] for r in d["figures"] if r["field"] == "graph"), "-")
    return table(("runtime", "base", "graph", "launch", "graph launch", "host per step",
                  "collective library"),
                 [(d["name"], d.get("base") or "-", graph(d), format_quantity(d["launch_s"], "time"),
                   format_quantity(d["graph_launch_s"], "time"),
                   format_quantity(d["host_per_step_s"], "time"),
                   d["collective_library"]["name"]) for d in data])


def chunk_text(report: Any) -> str:
    """A line above a mixed step's table: its time is the decoders' inter-token latency, that
    of the warm (last) step, whose chunk follows the cached prompt and every earlier chunk."""
    chunk = report.workload.get("prefill_chunk", 0)
    if not chunk:
        return ""
    cached = report.workload["prefill_context"] + (len(report.steps) - 1) * chunk
    return (f"inter-token latency of the {report.workload['batch']} decoding sequence(s), with "
            f"a {chunk}-token prompt chunk in each step (this one after {cached} cached prompt "
            f"tokens): {format_quantity(report.time_per_token, 'time')}, bound by "
            f"{report.bottleneck}\n")


def prefill_text(report: Any, ttft: dict[str, Any], *, per_op: bool = False) -> str:
    """``memsim run --prefill``: the time to first token, what bounds it, bytes and energy."""
    lines = [f"{report.model} on {report.device}: prefill of {ttft['prompt']} prompt tokens x "
             f"batch {report.workload['batch']}"
             + (f" after {ttft['cached']} cached" if ttft["cached"] else "")
             + f", weights {report.workload['weights']}, kv {report.workload['kv']}",
             f"  time to first token {format_quantity(ttft['time_to_first_token_s'], 'time')}"
             f"  bound by {ttft['bound_by']}",
             f"  energy              {format_quantity(report.warm.energy_j, 'energy')} for the "
             f"prompt(s); {report.flops:,} FLOP",
             f"  system              {report.chips} chip(s): tp {report.tp} x pp {report.pp}, "
             f"policy {report.policy}",
             "  whole system:"]
    lines += [f"    {t:<6} read {report.bytes_read[t]:>20,} B   written "
              f"{report.bytes_written[t]:>18,} B" for t in report.tier_names]
    table_text = report.table(per_op=per_op)
    ops = table_text[table_text.index("\n\n") + 2:] if "\n\n" in table_text else ""
    return "\n".join(lines) + ("\n\n" + ops if ops else "")


def max_batch_text(model: str, workload: Any, rows: Sequence[Any]) -> str:
    """``memsim plan --max-batch``: the largest batch per chip count and its speed."""
    body = [(r.chips, r.tp, r.pp, r.ep, r.policy, r.batch,
             _num(r.time_per_token_s * 1e3 if r.batch else None, ".2f"),
             _num(r.tokens_per_s_total if r.batch else None, ".0f")) for r in rows]
    lines = [f"{model}: the largest batch whose weights and KV caches at context "
             f"{workload.context} fit (weights {workload.weights}, kv {workload.kv})",
             table(("chips", "tp", "pp", "ep", "policy", "max batch", "ms/token", "tok/s total"),
                   body)]
    lines += [f"  {r.chips} chip(s) (tp {r.tp} x pp {r.pp}): {r.reason}"
              for r in rows if not r.batch]
    return "\n".join(lines)


def break_even_text(largest: int | None, scan: Sequence[tuple[int, float]]) -> str:
    """``memsim spec --scan-batch``: speedup per batch and where speculation stops paying."""
    lines = [table(("batch", "speedup"), [(b, f"{s:.2f}x") for b, s in scan])]
    if largest is None:
        lines.append("speculation pays at no batch scanned")
    elif largest == scan[-1][0]:
        lines.append(f"speculation still pays at batch {largest}, the largest scanned that fits")
    else:
        lines.append(f"speculation pays up to batch {largest}; beyond it plain decode is faster")
    return "\n".join(lines)


def search_text(result: Any, *, limit: int = 15) -> str:
    """``memsim search``: the configurations that meet the target, cheapest first."""
    head = (f"{result.model}, batch {result.batch}, context {result.context}, target "
            f"{result.target}: {result.points} configurations emulated ({result.computed} "
            f"new, {result.points - result.computed} read from "
            f"{result.store or 'a temporary store'}), "
            f"{result.pruned} ruled out before emulating, {result.errors} failed, "
            f"{result.met} meet the target")
    if not result.configurations:
        return _wrap(head) + "\n" + _wrap(result.explanation)
    ranked = list(enumerate(result.configurations, 1))
    columns = ("#", "device", "chips", "weights", "kv", "ms/tok", "tok/s", "tok/s/chip",
               "$/Mtok", "bound", "pareto")

    def rows(pairs: Sequence[tuple[int, Any]]) -> list[tuple]:
        return [(i, c.device, f"{c.chips}={c.tp}x{c.pp}", c.weights, c.kv,
                 f"{c.time_per_token_s * 1e3:.2f}", f"{c.tokens_per_s_total:.1f}",
                 f"{c.tokens_per_s_per_chip:.1f}", _num(c.usd_per_million_tokens, ".2f"),
                 c.bottleneck, "*" if c.pareto else "") for i, c in pairs]
    lines = [_wrap(head), table(columns, rows(ranked[:limit]))]
    if len(ranked) > limit:
        lines.append(f"... and {len(ranked) - limit} more (--top, --json)")
    front = sorted((p for p in ranked if p[1].pareto), key=lambda p: p[1].time_per_token_s)
    lines += ["", "the Pareto front, fastest first (# is the rank above):",
              table(columns, rows(front))]
    lines.append(_wrap("ranked by $/Mtok (the device file's price per chip-hour x chips over "
                       "tok/s; fewest chips first where no price is public); pareto *: no "
                       "other configuration has both lower ms/tok and higher tok/s/chip"))
    return "\n".join(lines)


def serving_text(result: Any) -> str:
    """``memsim serve``: the steady state of continuous batching, then its kinds of step."""
    budget = "no token budget" if result.token_budget is None else \
        f"token budget {result.token_budget:,}"
    lines = [
        f"{result.model} on {result.device}: {result.concurrency} clients, "
        f"{result.input_tokens:,} prompt + {result.output_tokens:,} output tokens per request, "
        f"{result.scheduling} scheduling, {budget}",
        f"  output tokens/s       {result.output_tokens_per_s:,.1f} in aggregate, "
        f"{result.tokens_per_s_per_user:,.1f} per user",
        f"  inter-token latency   {format_quantity(result.inter_token_latency_s, 'time')}",
        f"  time to first token   {format_quantity(result.time_to_first_token_s, 'time')} "
        "(queue and prompt steps; no front end)",
        f"  in the engine         {result.live_sequences} sequences; per step "
        f"{result.decode_sequences_per_step:,.2f} decoding, "
        f"{result.prompt_tokens_per_step:,.1f} prompt tokens",
        f"  mean step             {format_quantity(result.step_time_s, 'time')}, "
        f"bound by {result.bottleneck}",
        "",
        table(("step", "share", "decoding", "prompt tokens", "at position", "time", "bound by"),
              [(s.kind, f"{s.share:.3f}", s.decode_sequences, s.prompt_tokens,
                s.prompt_context, format_quantity(s.time_s, "time"), s.bottleneck)
               for s in result.steps]),
    ]
    if result.limits:
        lines += ["", f"  approximations: {result.limits}"]
    return "\n".join(lines) + "\n"
