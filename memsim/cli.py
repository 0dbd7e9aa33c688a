"""The ``memsim`` command line: catalogs, formats, one emulated run, the benchmark."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from memsim.device import Device, device, device_names
from memsim.errors import CapacityError, ConfigError
from memsim.formats import FORMATS
from memsim.model import model, model_names
from memsim.units import format_quantity
from memsim.workload import POLICY_CHOICES, RESIDENCY_POLICIES, Decode


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned text columns."""
    cells = [list(map(str, headers))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _device_summary(dev: Device) -> dict[str, Any]:
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


def cmd_devices(args: argparse.Namespace) -> int:
    summaries = [_device_summary(device(name)) for name in device_names()]
    if args.json:
        print(json.dumps(summaries, indent=2))
        return 0
    rows = [(s["name"], s["vendor"], format_quantity(s["on_chip_bytes"], "capacity"),
             f"{format_quantity(s['main_memory_bytes'], 'capacity')} {s['main_memory']}",
             format_quantity(s["main_memory_bandwidth"], "bandwidth"),
             format_quantity(s["bf16_peak"], "compute_rate"),
             f"{format_quantity(s['lowest_precision_peak'], 'compute_rate')} "
             f"{s['lowest_precision']}",
             f"{s['ridge_flop_per_byte']:.0f}", s["layout"]) for s in summaries]
    print(_table(("device", "vendor", "on-chip SRAM", "main memory", "bandwidth", "BF16 peak",
                  "lowest-precision peak", "ridge FLOP/B", "layout"), rows))
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    models = [model(name) for name in model_names()]
    data = [{"name": m.name, "layers": m.layers, "hidden": m.hidden, "heads": m.heads,
             "kv_heads": m.kv_heads, "head_dim": m.head_dim, "ffn": m.ffn, "vocab": m.vocab,
             "experts": m.experts, "experts_per_token": m.experts_per_token,
             "params": m.total_params, "active_params": m.active_params,
             "kv_bytes_per_token_bf16": 2 * m.kv_elements_per_token()} for m in models]
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    rows = [(d["name"], d["layers"], d["hidden"], f"{d['heads']}/{d['kv_heads']}", d["ffn"],
             d["vocab"], f"{d['experts']}/{d['experts_per_token']}" if d["experts"] > 1 else "-",
             f"{d['params'] / 1e9:.2f} B", f"{d['active_params'] / 1e9:.2f} B",
             format_quantity(d["kv_bytes_per_token_bf16"], "capacity", binary=True))
            for d in data]
    print(_table(("model", "layers", "hidden", "heads/kv", "ffn", "vocab", "experts/top-k",
                  "params", "active", "KV/token bf16"), rows))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    dev = device(args.device)
    if args.json:
        print(json.dumps({"summary": _device_summary(dev), "file": dev.data}, indent=2,
                         default=str))
        return 0
    s = _device_summary(dev)
    print(f"{dev.display_name} ({dev.name}), {dev.vendor}; layout {dev.layout.policy}")
    print(f"  clock {format_quantity(dev.clock_hz, 'frequency')}, {dev.cores} {dev.core_name}s "
          f"with {format_quantity(dev.core_memory, 'capacity', binary=True)} each; op launch "
          f"{format_quantity(dev.op_launch_s, 'time')}")
    print("  compute  " + ", ".join(f"{c} {format_quantity(v, 'compute_rate')}"
                                    for c, v in dev.compute)
          + f"; vector {format_quantity(dev.vector_ops_per_s, 'compute_rate')}")
    print(f"  ridge    {s['ridge_flop_per_byte']:.0f} FLOP per byte of {dev.main_memory.name}")
    rows = [(t.name, t.kind, format_quantity(t.capacity, "capacity"),
             format_quantity(t.bandwidth, "bandwidth"),
             format_quantity(t.sustained_bandwidth, "bandwidth"),
             format_quantity(t.latency_s, "time"),
             format_quantity(t.energy_j_per_byte / 8, "energy_per_bit"),
             format_quantity(t.granularity, "capacity")) for t in dev.tiers]
    print(_table(("tier", "kind", "capacity", "peak", "sustained", "latency", "energy",
                  "granularity"), rows))
    layout = dev.layout
    print(f"  homes    weights {layout.weights}, kv {layout.kv}, activations "
          f"{layout.activations}" + (f", spill {layout.spill}" if layout.spill else ""))
    if dev.link:
        print(f"  link     {format_quantity(dev.link.bandwidth, 'bandwidth')} per direction, "
              f"{format_quantity(dev.link.latency_s, 'time')}, {dev.link.topology}, up to "
              f"{dev.link.max_chips} chips")
    print("  sources")
    for key, text in dev.sources:
        print(f"    {key}: {text}")
    return 0


def cmd_formats(args: argparse.Namespace) -> int:
    data = [{"name": f.name, "bits_per_element_k4096": f.bits_per_element(4096),
             "compute": f.compute, "description": f.description, "source": f.source}
            for f in FORMATS.values()]
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(_table(("format", "bits/weight", "compute", "storage"),
                 [(d["name"], f"{d['bits_per_element_k4096']:.4f}", d["compute"],
                   d["description"]) for d in data]))
    print("\nbits/weight includes group metadata for rows of 4,096 inputs; "
          "int4-gN works for any group size N >= 8.")
    return 0


def _parse_sets(pairs: Sequence[str]) -> dict[str, str]:
    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"expected KEY=VALUE such as tiers.hbm.bandwidth=5TB/s, got {pair!r}",
                              field="--set")
        overrides[key.strip()] = value.strip()
    return overrides


def build_device(name: str, sets: Sequence[str] = (), add_tiers: Sequence[str] = ()) -> Device:
    """A catalog device (or file) with CLI what-ifs applied: tiers added, then fields set."""
    dev = device(name)
    for template in add_tiers:
        dev = dev.with_tier(template)
    overrides = _parse_sets(sets)
    return dev.with_overrides(overrides) if overrides else dev


def _parse_places(pairs: Sequence[str]) -> list[tuple[str, str]]:
    places = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ConfigError(f"expected SELECTOR=TIER[:FRACTION] such as kv=cxl or "
                              f"weights[40:80]=cxl, got {pair!r}", field="--place")
        places.append((key.strip(), value.strip()))
    return places


def _workload(args: argparse.Namespace, **fields: Any) -> Decode:
    """The Decode a command's flags describe (``fields`` override them)."""
    values = dict(batch=args.batch, context=args.context, weights=args.weights, kv=args.kv,
                  activations=args.activations, steps=args.steps, new_tokens=args.new_tokens,
                  kv_block=args.kv_block, tile_k=args.tile_k, tile_n=args.tile_n,
                  residency=args.residency, seed=args.seed, tp=args.tp or 1, pp=args.pp or 1,
                  ep=args.ep or 1, microbatches=args.microbatches, policy=args.policy,
                  placement=_parse_places(args.place), routing=args.routing)
    values.update(fields)
    return Decode(**values)


def cmd_run(args: argparse.Namespace) -> int:
    from memsim.emulate import emulate

    dev = build_device(args.device, args.set, args.add_tier)
    report = emulate(dev, model(args.model), _workload(args))
    cost = None
    if args.spill_cost:
        from memsim.compare import spill_cost
        cost = spill_cost(dev, model(args.model), _workload(args))
    if args.json:
        print(report.to_json(extra={"spill_cost": cost.to_dict()} if cost else None))
    elif args.csv:
        print(report.to_csv(), end="")
    else:
        print(report.table(per_op=args.ops))
        if cost is not None:
            print(f"\nagainst the same device with {cost.main_tier} holding everything "
                  f"({format_quantity(cost.baseline_capacity, 'capacity')}, a hypothetical): "
                  f"{cost.slowdown:.2f}x the time per token "
                  f"({format_quantity(cost.time_per_token_s, 'time')} vs "
                  f"{format_quantity(cost.baseline_time_per_token_s, 'time')})")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from memsim.capacity import capacity_table, smallest_system
    from memsim.plan import plan_system

    dev = build_device(args.device, args.set, args.add_tier)
    mod = model(args.model)
    table = capacity_table(dev, mod, _workload(args))
    refusal = None
    try:
        system = plan_system(dev, mod, _workload(args))
    except CapacityError as exc:
        if args.tp or args.pp or args.ep:
            raise
        refusal = str(exc)
        chosen, system = smallest_system(dev, mod, _workload(args), table)
        if system is None:
            raise
    stages = [{"stage": p.stage, "layers": [p.layers[0], p.layers[-1]] if p.layers else [],
               "weights": p.bytes_by_tier("weight"), "kv": p.bytes_by_tier("kv"),
               "pinned_bytes": sum(t.bytes for t in p.tensors if t.pinned),
               "spilled": list(p.spilled),
               "tensors": [{"name": t.name, "tiers": {p.tier_names[i]: b for i, b in t.tier_bytes},
                            "pinned": t.pinned} for t in p.tensors if not t.aliased]}
              for p in system.stages]
    data = {"device": dev.name, "model": mod.name, "one_chip_refusal": refusal,
            "policy": system.policy,
            "tp": system.workload.tp, "pp": len(system.stages), "chips": system.chips,
            "microbatches": system.workload.microbatches,
            "capacity": [c.to_dict() for c in table], "stages": stages}
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    if refusal:
        print(f"as given it does not fit: {refusal}\nthe smallest system that holds it:")
    print(f"{mod.name} on {dev.name}: policy {system.policy}, {system.chips} chip(s) = tp "
          f"{system.workload.tp} x pp {len(system.stages)}, {system.workload.microbatches} "
          f"microbatch(es); bytes each chip of a stage holds:")
    rows = []
    for st in stages:
        span = f"{st['layers'][0]}-{st['layers'][1]}" if st["layers"] else "-"
        rows.append([st["stage"], span]
                    + [format_quantity(st["weights"][t], "capacity") for t in dev.tier_names]
                    + [format_quantity(st["kv"][t], "capacity") for t in dev.tier_names]
                    + [format_quantity(st["pinned_bytes"], "capacity")])
    if len(rows) > 12 and not args.all_stages:
        rows = rows[:5] + [["..."] * len(rows[0])] + rows[-5:]
    print(_table(["stage", "layers"] + [f"weights {t}" for t in dev.tier_names]
                 + [f"kv {t}" for t in dev.tier_names] + ["pinned on chip"], rows))
    for st in stages:
        for note in st["spilled"]:
            print(f"  spilled (stage {st['stage']}): {note}")
    print("\nfewest chips under each policy this device supports:")
    print(_table(("policy", "chips", "tp", "pp", "fits", "short by"),
                 [(c.policy, c.chips if c.fits else "-", c.tp if c.fits else "-",
                   c.pp if c.fits else "-", "yes" if c.fits else c.reason,
                   format_quantity(c.shortfall_bytes, "capacity") if not c.fits else "")
                  for c in table]))
    return 0


def _parse_prices(pairs: Sequence[str]) -> dict[str, float]:
    prices = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        try:
            price = float(value)
        except ValueError:
            price = -1.0
        if not sep or not key.strip() or price <= 0:
            raise ConfigError(f"expected DEVICE=USD_PER_CHIP_HOUR such as h100-sxm=2.99, got "
                              f"{pair!r}", field="--price")
        prices[key.strip()] = price
    return prices


def cmd_compare(args: argparse.Namespace) -> int:
    from memsim.compare import compare

    names = [n.strip() for n in args.devices.split(",")] if args.devices else device_names()
    devices = [build_device(name, (), args.add_tier) for name in names]
    rows = compare(model(args.model), _workload(args), devices, _parse_prices(args.price))
    if args.json:
        print(json.dumps([r.to_dict() for r in rows], indent=2))
        return 0
    if args.csv:
        import csv
        import io
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=list(rows[0].to_dict()), lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow(row.to_dict())
        print(out.getvalue(), end="")
        return 0

    def num(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    table = []
    for r in rows:
        if not r.fits:
            table.append([r.device, "-", r.policy, "-", "-", "-", "-", "-", "-", "-",
                          f"short by {format_quantity(r.shortfall_bytes, 'capacity')}: {r.note}"])
            continue
        table.append([r.device, f"{r.chips} ({r.tp}x{r.pp})", r.policy,
                      num(r.time_per_token_s * 1e3, ".2f"), num(r.tokens_per_s, ".1f"),
                      num(r.tokens_per_s_total, ".1f"),
                      format_quantity(r.energy_per_token_j, "energy"),
                      num(r.usd_per_million_tokens, ".2f"), r.bottleneck,
                      format_quantity(r.off_chip_weight_bytes, "capacity"), r.note])
    first = rows[0] if rows else None
    if first is not None:
        print(f"{args.model}: batch {args.batch}, context {args.context}, weights {args.weights}, "
              f"kv {args.kv}; each device at the fewest chips that hold it (its own memory "
              "policy unless that cannot)")
    print(_table(("device", "chips (tp x pp)", "policy", "ms/token", "tok/s/seq", "tok/s total",
                  "energy/token", "$/M tokens", "bound by", "off-chip weight B/step", "note"),
                 table))
    print("\n$/M tokens: the device file's price per chip-hour (or --price) x chips over the "
          "aggregate tokens/s; '-' where no price is public.")
    return 0


def _acceptance(text: str) -> float | list[float]:
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise ConfigError(f"expected a rate such as 0.8 or one per position such as "
                          f"0.9,0.8,0.7, got {text!r}", field="--acceptance") from None
    return values[0] if len(values) == 1 else values


def cmd_spec(args: argparse.Namespace) -> int:
    from memsim.speculative import speculative

    dev = build_device(args.device, args.set, args.add_tier)
    gamma: int | str = args.gamma
    if gamma != "auto":
        try:
            gamma = int(gamma)
        except ValueError:
            raise ConfigError(f"expected an integer or 'auto', got {gamma!r}",
                              field="--gamma") from None
    tree = None
    if args.tree:
        try:
            tree = [int(v) for v in args.tree.split(",")]
        except ValueError:
            raise ConfigError(f"expected branching factors such as 3,2,1, got {args.tree!r}",
                              field="--tree") from None
    workload = _workload(args)
    fields = {f.name: getattr(workload, f.name) for f in dataclasses.fields(workload)
              if f.name not in ("new_tokens", "draft_heads")}
    report = speculative(
        dev, model(args.target), model(args.draft) if args.draft else None, gamma,
        _acceptance(args.acceptance), method=args.method, tree=tree,
        draft_device=build_device(args.draft_device) if args.draft_device else None,
        draft_weights=args.draft_weights, samples=args.samples, **fields)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, allow_nan=False))
    else:
        print(report.table())
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from memsim.study import load_study
    from memsim.sweep import sweep

    study = load_study(args.study)
    result = sweep(study, args.store, jobs=args.jobs, scheduler=args.scheduler,
                   progress=not args.quiet)
    print(f"{result.study}: {result.points} points, {result.computed} computed "
          f"({result.errors} with an error), {result.skipped} already in {result.store}; "
          f"{result.seconds:.1f} s, {result.points_per_s:.1f} points/s")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from memsim.store import Store

    if not Path(args.store).exists():
        raise ConfigError("no such results store", file=args.store, field="store")
    with Store(args.store) as store:
        if args.format == "parquet":
            if not args.output:
                raise ConfigError("Parquet needs an output file (-o)", field="--output")
            store.to_parquet(args.output, args.study)
            return 0
        text = store.to_csv(args.study) if args.format == "csv" else store.to_json(args.study)
    if args.output:
        Path(args.output).write_text(text)
    else:
        print(text, end="")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from memsim.plot import plot

    where = {}
    for pair in args.where:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"expected FIELD=VALUE such as device=h100-sxm, got {pair!r}",
                              field="--where")
        where[key.strip()] = value.strip()
    out = plot(args.kind, args.store, args.output, study=args.study, x=args.x, where=where)
    print(f"wrote {out}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from memsim.validate import default_folder, validate

    folder = Path(args.folder) if args.folder else default_folder()
    output = Path(args.output) if args.output else folder.parent / "docs" / "validation.md"
    rows, _ = validate(folder, output)
    predicted = [r for r in rows if r.error is not None]
    print(f"wrote {output}: {len(rows)} measurements, {len(predicted)} predicted")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from memsim.bench import run_benchmarks

    print(run_benchmarks(quick=args.quick))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memsim", description="Emulate LLM decode through an accelerator's memory tiers.")
    sub = parser.add_subparsers(dest="command", required=True)

    catalog_commands = (
        ("devices", cmd_devices, "the device catalog", ()),
        ("models", cmd_models, "the model catalog", ()),
        ("show", cmd_show, "one device, every figure with its source", ("device",)),
        ("formats", cmd_formats, "storage formats and their bits per weight", ()),
    )
    for name, func, text, positionals in catalog_commands:
        p = sub.add_parser(name, help=text)
        for positional in positionals:
            p.add_argument(positional)
        p.add_argument("--json", action="store_true")
        p.set_defaults(func=func)

    p = sub.add_parser("run", help="emulate decode steps of MODEL on DEVICE")
    p.add_argument("device", help="catalog name or a device .toml file")
    p.add_argument("model", help="catalog name or a model .toml file")
    _workload_flags(p)
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true")
    out.add_argument("--csv", action="store_true", help="one row per op")
    out.add_argument("--ops", action="store_true", help="every op of every layer in the table")
    p.add_argument("--spill-cost", action="store_true",
                   help="also emulate the device with its main memory holding everything, and "
                        "print the slowdown")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("plan", help="where MODEL's bytes live on DEVICE, and the fewest chips")
    p.add_argument("device", help="catalog name or a device .toml file")
    p.add_argument("model", help="catalog name or a model .toml file")
    _workload_flags(p)
    p.add_argument("--all-stages", action="store_true", help="list every pipeline stage")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("compare", help="every device at the smallest system that holds MODEL")
    p.add_argument("model", help="catalog name or a model .toml file")
    p.add_argument("--devices", default=None, help="comma-separated device names (default: all)")
    p.add_argument("--price", action="append", default=[], metavar="DEVICE=USD",
                   help="price per chip-hour, overriding the device file's (repeatable)")
    _workload_flags(p, parallel=False)
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true")
    out.add_argument("--csv", action="store_true")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("spec", help="speculative decoding of TARGET on DEVICE: draft, verify, "
                                    "accept")
    p.add_argument("device", help="catalog name or a device .toml file")
    p.add_argument("target", help="the target model")
    p.add_argument("--draft", default=None, help="the draft model (method draft)")
    p.add_argument("--method", choices=("draft", "heads", "ngram"), default="draft",
                   help="draft model, Medusa-style heads on the target, or n-gram lookup")
    p.add_argument("--gamma", default="4", help="drafted tokens per iteration, or 'auto'")
    p.add_argument("--acceptance", default="0.8",
                   help="acceptance rate, or one per drafted position: 0.9,0.8,0.7")
    p.add_argument("--tree", default=None, help="heads: branching per depth, e.g. 3,2,1")
    p.add_argument("--samples", type=int, default=0, help="Monte Carlo draws (0: closed form)")
    p.add_argument("--draft-device", default=None,
                   help="run the draft on its own device (default: the target's first chip)")
    p.add_argument("--draft-weights", default=None, help="the draft's weight format")
    _workload_flags(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_spec, steps=2)

    p = sub.add_parser("sweep", help="run a study file's points into a results store")
    p.add_argument("study", help="a TOML study file (see memsim.study)")
    p.add_argument("--store", default="results.sqlite", help="SQLite results store")
    p.add_argument("--jobs", type=int, default=1, help="local worker processes")
    p.add_argument("--scheduler", default=None,
                   help="Dask: 'local' for a LocalCluster, or tcp://HOST:PORT")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("export", help="a results store as CSV, JSON or Parquet")
    p.add_argument("store", help="SQLite results store")
    p.add_argument("--format", choices=("csv", "json", "parquet"), default="csv")
    p.add_argument("--study", default=None, help="only this study's rows")
    p.add_argument("-o", "--output", default=None, help="file to write (default: stdout)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("plot", help="plot a stored study (latency, devices, sram, roofline, "
                                    "bytes)")
    p.add_argument("kind", choices=("latency", "devices", "sram", "roofline", "bytes"))
    p.add_argument("store", help="SQLite results store")
    p.add_argument("-o", "--output", required=True, help="a .png or .svg file")
    p.add_argument("--study", default=None, help="only this study's rows")
    p.add_argument("--x", default=None, help="latency: the workload field on the x axis")
    p.add_argument("--where", action="append", default=[], metavar="FIELD=VALUE",
                   help="keep rows whose device, model, workload or what-if field has this "
                        "value (repeatable)")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("validate", help="predict public measurements; write docs/validation.md")
    p.add_argument("--folder", default=None, help="validation folder (default: the repository's)")
    p.add_argument("-o", "--output", default=None, help="Markdown file to write")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("bench", help="measure the walkers' speed (ratios against a bare loop)")
    p.add_argument("--quick", action="store_true", help="smaller workloads")
    p.set_defaults(func=cmd_bench)
    return parser


def _workload_flags(p: argparse.ArgumentParser, *, parallel: bool = True) -> None:
    """The flags that describe a Decode workload and device what-ifs."""
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--context", type=int, default=4096,
                   help="tokens in each sequence's KV cache before the first step")
    p.add_argument("--weights", default="bf16")
    p.add_argument("--kv", default="bf16")
    p.add_argument("--activations", default="bf16")
    p.add_argument("--steps", type=int, default=2, help="consecutive steps (first cold, last warm)")
    p.add_argument("--new-tokens", type=int, default=1, help="tokens per sequence per step")
    p.add_argument("--kv-block", type=int, default=16, help="paged-KV block size in tokens")
    p.add_argument("--tile-k", type=int, default=None)
    p.add_argument("--tile-n", type=int, default=None)
    p.add_argument("--residency", choices=RESIDENCY_POLICIES, default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="device what-if, e.g. --set tiers.hbm.bandwidth=5TB/s (repeatable)")
    p.add_argument("--add-tier", action="append", default=[], metavar="TEMPLATE",
                   help="add a tier template outermost, e.g. cxl-gen5-x16 (repeatable)")
    p.add_argument("--place", action="append", default=[], metavar="SELECTOR=TIER[:FRACTION]",
                   help="placement rule, e.g. kv=cxl, weights[40:80]=cxl, weights=cxl:0.3 "
                        "(repeatable, later rules win)")
    p.add_argument("--policy", choices=POLICY_CHOICES, default="auto",
                   help="memory strategy (auto: the device's own, tiered when it must spill)")
    p.add_argument("--routing", default="uniform",
                   help="MoE routing: uniform, zipf:S, or a .npy trace [steps, layers, tokens, k]")
    if parallel:
        p.add_argument("--ep", type=int, default=None, help="expert-parallel chips (MoE)")
        p.add_argument("--tp", type=int, default=None, help="tensor-parallel chips")
        p.add_argument("--pp", type=int, default=None, help="pipeline stages")
        p.add_argument("--microbatches", type=int, default=None,
                       help="microbatches in flight (default: largest divisor of batch <= pp)")
    else:
        p.set_defaults(tp=None, pp=None, ep=None, microbatches=None)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``memsim`` console script; user errors print one line and exit 2."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
        return args.func(args)
    except ConfigError as exc:
        print(f"memsim: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:             # a reader such as `head` stopped early
        sys.stderr = open(os.devnull, "w")
        return 0


if __name__ == "__main__":
    sys.exit(main())
