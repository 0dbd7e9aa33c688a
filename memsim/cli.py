"""The ``memsim`` command line: catalogs, formats, one emulated run, the benchmark."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from memsim.device import Device, device, device_names
from memsim.errors import ConfigError
from memsim.formats import FORMATS
from memsim.model import model, model_names
from memsim.units import format_quantity
from memsim.workload import RESIDENCY_POLICIES, Decode


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


def cmd_run(args: argparse.Namespace) -> int:
    from memsim.emulate import emulate

    dev = build_device(args.device, args.set, args.add_tier)
    workload = Decode(batch=args.batch, context=args.context, weights=args.weights, kv=args.kv,
                      activations=args.activations, steps=args.steps,
                      new_tokens=args.new_tokens, kv_block=args.kv_block, tile_k=args.tile_k,
                      tile_n=args.tile_n, residency=args.residency, seed=args.seed)
    report = emulate(dev, model(args.model), workload)
    if args.json:
        print(report.to_json())
    elif args.csv:
        print(report.to_csv(), end="")
    else:
        print(report.table(per_op=args.ops))
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
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true")
    out.add_argument("--csv", action="store_true", help="one row per op")
    out.add_argument("--ops", action="store_true", help="every op of every layer in the table")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("bench", help="measure the walkers' speed (ratios against a bare loop)")
    p.add_argument("--quick", action="store_true", help="smaller workloads")
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``memsim`` console script; user errors print one line and exit 2."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
        return args.func(args)
    except ConfigError as exc:
        print(f"memsim: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
