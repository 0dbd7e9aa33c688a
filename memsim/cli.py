"""The ``memsim`` command line: each verb parses its flags, builds its inputs through
:mod:`memsim.inputs`, makes one API call and renders the answer with :mod:`memsim.render`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import memsim
from memsim import render
from memsim.device import device_names
from memsim.errors import CapacityError, ConfigError
from memsim.formats import FORMATS
from memsim.inputs import DeviceRequest, decode_from, device_from, model_from, parse_pairs
from memsim.model import model_names
from memsim.workload import POLICY_CHOICES, RESIDENCY_POLICIES, Decode

PARALLEL_FIELDS = ("tp", "pp", "ep", "microbatches")
FIELD_CHOICES = {"residency": RESIDENCY_POLICIES, "policy": POLICY_CHOICES}
FIELD_FLAGS = {"placement": "--place"}
FIELD_METAVARS = {"placement": "SELECTOR=TIER[:FRACTION]"}
# Decode fields with no flag of their own: a prefill step is asked for with `run --prefill N`
LOWERED_FIELDS = ("prefill",)


def _request(args: argparse.Namespace, name: str | None = None) -> DeviceRequest:
    """The device a verb's flags describe."""
    stack = getattr(args, "runtime", None)
    return DeviceRequest(name or args.device, sets=tuple(args.set),
                         add_tiers=tuple(args.add_tier), policy=args.policy,
                         runtime=stack if isinstance(stack, str) else "auto")


def _workload(args: argparse.Namespace, *, skip: tuple[str, ...] = ()) -> Decode:
    """The Decode a verb's generated workload flags describe."""
    fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(Decode)
              if hasattr(args, f.name) and f.name not in skip + LOWERED_FIELDS}
    if "placement" in fields:
        fields["placement"] = parse_pairs(fields["placement"], field="--place",
                                          example="SELECTOR=TIER[:FRACTION] such as kv=cxl or "
                                                  "weights[40:80]=cxl")
    return decode_from(fields)


def cmd_devices(args: argparse.Namespace) -> int:
    devices = [device_from(name) for name in device_names()]
    if args.json:
        print(json.dumps([render.device_summary(d) for d in devices], indent=2))
    else:
        print(render.devices_table(devices))
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    models = [model_from(name) for name in model_names()]
    data = [{"name": m.name, "layers": m.layers, "hidden": m.hidden, "heads": m.heads,
             "kv_heads": m.kv_heads, "head_dim": m.head_dim, "ffn": m.ffn, "vocab": m.vocab,
             "experts": m.experts, "experts_per_token": m.experts_per_token,
             "params": m.total_params, "active_params": m.active_params,
             "kv_bytes_per_token_bf16": 2 * m.kv_elements_per_token()} for m in models]
    print(json.dumps(data, indent=2) if args.json else render.models_table(data))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    if args.runtime is not None:
        from memsim.runtime import describe, runtime

        data = describe(runtime(args.runtime))
        print(json.dumps(data, indent=2) if args.json else render.runtime_text(data))
        return 0
    if args.device is None:
        raise ConfigError("expected a device name or file, or --runtime NAME", field="show")
    dev = device_from(args.device)
    if args.json:
        print(json.dumps({"summary": render.device_summary(dev), "file": dev.data}, indent=2,
                         default=str))
    else:
        print(render.show_text(dev))
    return 0


def cmd_runtimes(args: argparse.Namespace) -> int:
    from memsim.runtime import describe, runtime, runtime_names

    data = [describe(runtime(name)) for name in runtime_names()]
    print(json.dumps(data, indent=2) if args.json else render.runtimes_table(data))
    return 0


def cmd_formats(args: argparse.Namespace) -> int:
    data = [{"name": f.name, "bits_per_element_k4096": f.bits_per_element(4096),
             "compute": f.compute, "description": f.description, "source": f.source}
            for f in FORMATS.values()]
    print(json.dumps(data, indent=2) if args.json else render.formats_table(data))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from memsim.compare import spill_cost
    from memsim.emulate import emulate

    dev, mod, workload = device_from(_request(args)), model_from(args.model), _workload(args)
    if args.prefill is not None:
        return _prefill(args, dev, mod, workload)
    if args.cached:
        raise ConfigError("the cached prompt prefix needs --prefill N",
                          field="--cached")
    report = emulate(dev, mod, workload)
    cost = spill_cost(dev, mod, workload) if args.spill_cost else None
    if args.json:
        print(report.to_json(extra={"spill_cost": cost.to_dict()} if cost else None))
    elif args.csv:
        print(render.run_csv(report), end="")
    else:
        print(render.chunk_text(report) + report.table(per_op=args.ops)
              + (render.spill_cost_text(cost) if cost else ""))
    return 0


def _prefill(args: argparse.Namespace, dev: Any, mod: Any, decode: Decode) -> int:
    """``memsim run --prefill N``: one prompt's prefill, its time to first token."""
    from memsim.emulate import emulate
    from memsim.workload import Prefill

    if decode.prefill_chunk or decode.prefill_context or args.spill_cost:
        raise ConfigError("--prefill runs a prompt alone; --prefill-chunk, --prefill-context "
                          "and --spill-cost are for decode steps", field="--prefill")
    fields = {f.name: getattr(decode, f.name) for f in dataclasses.fields(Prefill)
              if hasattr(decode, f.name)}
    report = emulate(dev, mod, Prefill(**fields, prompt=args.prefill, cached=args.cached))
    ttft = {"time_to_first_token_s": report.time_per_step, "bound_by": report.bottleneck,
            "prompt": args.prefill, "cached": args.cached}
    if args.json:
        print(report.to_json(extra={"prefill": ttft}))
    elif args.csv:
        print(render.run_csv(report, extra=ttft), end="")
    else:
        print(render.prefill_text(report, ttft, per_op=args.ops))
    return 0


_SERVE_SETS = ("batch", "context", "steps", "prefill_chunk", "prefill_context", "new_tokens")


def cmd_serve(args: argparse.Namespace) -> int:
    from memsim.serving import serve

    dev, mod = device_from(_request(args)), model_from(args.model)
    decode = _workload(args, skip=_SERVE_SETS)
    fields = {f.name: getattr(decode, f.name) for f in dataclasses.fields(Decode)
              if f.name not in _SERVE_SETS + LOWERED_FIELDS}
    result = serve(dev, mod, input_tokens=args.input_tokens, output_tokens=args.output_tokens,
                   concurrency=args.concurrency, token_budget=args.token_budget,
                   max_batch=args.max_batch, scheduling=args.scheduling, **fields)
    print(json.dumps(result.to_dict(), indent=2) if args.json else render.serving_text(result))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from memsim.capacity import capacity_table, smallest_system
    from memsim.plan import plan_system

    dev, mod, workload = device_from(_request(args)), model_from(args.model), _workload(args)
    if args.max_batch:
        return _max_batch(args, dev, mod, workload)
    table = capacity_table(dev, mod, workload)
    refusal = None
    try:
        system = plan_system(dev, mod, workload)
    except CapacityError as exc:
        if workload.chips > 1:
            raise
        refusal = str(exc)
        _, system = smallest_system(dev, mod, workload, table)
        if system is None:
            raise
    data = render.plan_data(dev, mod, system, table, refusal)
    print(json.dumps(data, indent=2) if args.json
          else render.plan_text(dev, data, table, all_stages=args.all_stages))
    return 0


def _max_batch(args: argparse.Namespace, dev: Any, mod: Any, workload: Decode) -> int:
    """``memsim plan --max-batch``: the largest batch per chip count (or at --tp/--pp/--ep)."""
    from memsim.capacity import max_batch, max_batch_table

    rows = (max_batch_table(dev, mod, workload) if workload.chips == 1
            else [max_batch(dev, mod, workload)])
    print(json.dumps([r.to_dict() for r in rows], indent=2) if args.json
          else render.max_batch_text(mod.name, workload, rows))
    return 0


def _prices(pairs: Sequence[str]) -> dict[str, float]:
    prices = {}
    for key, value in parse_pairs(pairs, field="--price",
                                  example="DEVICE=USD_PER_CHIP_HOUR such as h100-sxm=2.99"):
        try:
            prices[key] = DeviceRequest(key, usd_per_chip_hour=value).usd_per_chip_hour
        except ConfigError:
            raise ConfigError(f"expected DEVICE=USD_PER_CHIP_HOUR such as h100-sxm=2.99, got "
                              f"{key}={value}", field="--price") from None
    return prices


def _device_list(text: str | None) -> list[str]:
    if text is None:
        return device_names()
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise ConfigError(f"expected comma-separated device names such as h100-sxm,mi300x "
                          f"(omit --devices for all), got {text!r}", field="--devices")
    return names


def cmd_compare(args: argparse.Namespace) -> int:
    from memsim.compare import compare

    prices = _prices(args.price)
    devices = [device_from(_request(args, name), usd_per_chip_hour=prices.get(name))
               for name in _device_list(args.devices)]
    rows = compare(model_from(args.model), _workload(args), devices)
    if args.json or args.csv:
        data = [r.to_dict() for r in rows]
        print(json.dumps(data, indent=2) if args.json else render.csv_text(data).rstrip("\n"))
        return 0
    print(render.compare_text(rows, f"{args.model}: batch {args.batch}, context {args.context}, "
                                    f"weights {args.weights}, kv {args.kv}; each device at the "
                                    "fewest chips that hold it (its own policy unless that "
                                    "cannot)"))
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    from memsim.search import KV_FORMATS, WEIGHT_FORMATS, search

    result = search(args.model, args.target, batch=args.batch, context=args.context,
                    devices=_device_list(args.devices) if args.devices else None,
                    weights=_names(args.formats, WEIGHT_FORMATS, "--formats"),
                    kv=_names(args.kv_formats, KV_FORMATS, "--kv-formats"), store=args.store,
                    jobs=args.jobs, progress=not args.quiet and not args.json)
    print(json.dumps(result.to_dict(), indent=2) if args.json
          else render.search_text(result, limit=args.top))
    return 0


def _names(text: str | None, default: Sequence[str], field: str) -> tuple[str, ...]:
    if text is None:
        return tuple(default)
    names = tuple(n.strip() for n in text.split(","))
    if not all(names):
        raise ConfigError(f"expected comma-separated format names such as bf16,int4-g128 "
                          f"(see memsim formats), got {text!r}", field=field)
    return names


def _acceptance(text: str) -> float | list[float]:
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise ConfigError(f"expected a rate such as 0.8 or one per position such as "
                          f"0.9,0.8,0.7, got {text!r}", field="--acceptance") from None
    return values[0] if len(values) == 1 else values


def _gamma(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"expected an integer or 'auto', got {text!r}", field="--gamma") from None


def _tree(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(v) for v in text.split(",")]
    except ValueError:
        raise ConfigError(f"expected branching factors such as 3,2,1, got {text!r}",
                          field="--tree") from None


def cmd_spec(args: argparse.Namespace) -> int:
    from memsim.speculative import speculative

    workload = _workload(args, skip=("new_tokens", "draft_heads"))
    fields = {f.name: getattr(workload, f.name) for f in dataclasses.fields(workload)
              if f.name not in ("new_tokens", "draft_heads")}
    call = dict(method=args.method, tree=_tree(args.tree),
                draft_device=device_from(args.draft_device) if args.draft_device else None,
                draft_weights=args.draft_weights, samples=args.samples)
    inputs = (device_from(_request(args)), model_from(args.target),
              model_from(args.draft) if args.draft else None, _gamma(args.gamma),
              _acceptance(args.acceptance))
    if args.scan_batch:
        from memsim.speculative import break_even_batch

        fields.pop("batch")
        largest, scan = break_even_batch(*inputs, **call, **fields)
        data = {"largest_paying_batch": largest, "scan": [{"batch": b, "speedup": s}
                                                          for b, s in scan]}
        print(json.dumps(data, indent=2, allow_nan=False) if args.json
              else render.break_even_text(largest, scan))
        return 0
    report = speculative(*inputs, **call, **fields)
    print(json.dumps(report.to_dict(), indent=2, allow_nan=False) if args.json
          else report.table())
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from memsim.study import load_study
    from memsim.sweep import SweepInterrupted, sweep

    try:
        result = sweep(load_study(args.study), args.store, jobs=args.jobs,
                       scheduler=args.scheduler, progress=not args.quiet)
    except SweepInterrupted as stop:
        print(f"memsim: interrupted: {stop.written} rows of this run are kept in {stop.store}; "
              f"run the same command again to compute the rest", file=sys.stderr)
        return 130
    print(f"{result.study}: {result.points} points, {result.computed} computed "
          f"({result.errors} with an error), {result.skipped} already in {result.store}; "
          f"{result.seconds:.1f} s, {result.points_per_s:.1f} points/s")
    if result.computed and result.errors == result.computed:
        print(f"memsim: error: every point of this run failed; the first: {result.first_error}",
              file=sys.stderr)
        return 1
    return 0


def _output(path: str | None, field: str = "--output") -> Path | None:
    """An output file whose folder exists."""
    if path is None:
        return None
    out = Path(path)
    if not out.parent.exists():
        raise ConfigError(f"the folder {str(out.parent)!r} does not exist", file=path, field=field)
    if out.is_dir():
        raise ConfigError("this is a folder; name a file (in it)", file=path, field=field)
    return out


def cmd_export(args: argparse.Namespace) -> int:
    from memsim.store import Store

    output = _output(args.output)
    if not Path(args.store).exists():
        raise ConfigError("no such results store", file=args.store, field="store")
    if output is not None and output.exists() and output.samefile(args.store):   # links too
        raise ConfigError("the output is the store itself; name another file", file=args.output,
                          field="--output")
    if args.format == "parquet" and output is None:
        raise ConfigError("Parquet needs an output file (-o)", field="--output")
    with Store(args.store, create=False) as store:
        if args.format == "parquet":
            store.to_parquet(output, args.study)
            return 0
        text = store.to_csv(args.study) if args.format == "csv" else store.to_json(args.study)
    if output is not None:
        output.write_text(text)
    else:
        print(text, end="")
    return 0


def cmd_salvage(args: argparse.Namespace) -> int:
    from memsim.store import salvage

    kept, lost = salvage(args.store, _output(args.output))
    print(f"wrote {args.output}: {kept} readable rows of {args.store} ({lost} unreadable)")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from memsim.plot import plot

    where = dict(parse_pairs(args.where, field="--where",
                             example="FIELD=VALUE such as device=h100-sxm"))
    out = plot(args.kind, args.store, _output(args.output), study=args.study, x=args.x,
               where=where)
    print(f"wrote {out}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from memsim.validate import validate

    output = _output(args.output)
    rows, text = validate(Path(args.folder) if args.folder else None, output)
    predicted = sum(1 for r in rows if r.error is not None)
    summary = f"{len(rows)} measurements, {predicted} predicted"
    if output is None:
        print(text, end="")
        print(summary, file=sys.stderr)
    else:
        print(f"wrote {output}: {summary}")
    return 0


def cmd_completion(args: argparse.Namespace) -> int:
    try:
        import shtab
    except ImportError:
        raise ConfigError("shell completion needs shtab: pip install shtab",
                          field="completion") from None
    print(shtab.complete(_parser(), shell=args.shell))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from memsim.bench import run_benchmarks

    print(run_benchmarks(quick=args.quick))
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line: the flag, what is wrong, the valid values."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    formatter = argparse.ArgumentDefaultsHelpFormatter
    parser = _Parser(prog="memsim", formatter_class=formatter,
                     description="Emulate LLM decode through an accelerator's memory tiers.")
    parser.add_argument("--version", action="version", version=f"memsim {memsim.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def verb(name: str, func: Any, text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=text, description=text, formatter_class=formatter)
        p.set_defaults(func=func)
        return p

    def json_flag(p: argparse.ArgumentParser) -> None:
        p.add_argument("--json", action="store_true", help="plain data as JSON")

    for name, func, text in (("devices", cmd_devices, "the device catalog"),
                             ("models", cmd_models, "the model catalog"),
                             ("formats", cmd_formats, "storage formats and their bits per weight")):
        json_flag(verb(name, func, text))
    p = verb("show", cmd_show, "one device (or --runtime NAME), every figure with its source")
    p.add_argument("device", nargs="?", default=None, help="catalog name or a device .toml file")
    p.add_argument("--runtime", default=None,
                   help="show this software stack instead (see memsim runtimes)")
    json_flag(p)
    json_flag(verb("runtimes", cmd_runtimes, "the software stacks a workload can run on"))

    p = verb("run", cmd_run, "emulate decode steps of MODEL on DEVICE")
    _device_model(p)
    _workload_flags(p)
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="the whole report as JSON")
    out.add_argument("--csv", action="store_true",
                     help="one row per op, after '# name,value' lines of the summary")
    out.add_argument("--ops", action="store_true", help="every op of every layer in the table")
    p.add_argument("--spill-cost", action="store_true",
                   help="also emulate the device with its main memory holding everything, and "
                        "print the slowdown")
    p.add_argument("--prefill", type=int, default=None, metavar="TOKENS",
                   help="emulate the prefill of this many prompt tokens per sequence (the ones "
                        "computed, after any --cached prefix) and print the time to first token "
                        "(--batch sequences)")
    p.add_argument("--cached", type=int, default=0, metavar="TOKENS",
                   help="with --prefill: a prefix already in the KV cache before those tokens "
                        "(prefix caching; the prompt is --cached + --prefill tokens long)")

    p = verb("serve", cmd_serve, "continuous batching in steady state: output tokens/s and the "
                                 "inter-token latency of CONCURRENCY clients")
    _device_model(p)
    _workload_flags(p, skip=_SERVE_SETS)
    p.add_argument("--input-tokens", type=int, required=True, help="prompt tokens per request")
    p.add_argument("--output-tokens", type=int, required=True, help="output tokens per request")
    p.add_argument("--concurrency", type=int, required=True,
                   help="clients, each with one request in flight")
    p.add_argument("--token-budget", type=int, default=None,
                   help="tokens one step may compute (vLLM max_num_batched_tokens, TensorRT-LLM "
                        "max_num_tokens); default: a prompt goes whole into one step")
    p.add_argument("--max-batch", type=int, default=None,
                   help="sequences the engine schedules at once (max_num_seqs, max_batch_size)")
    p.add_argument("--scheduling", default="mixed", choices=("mixed", "prefill-first"),
                   help="prompt chunks ride in decode steps (vLLM, SGLang, TensorRT-LLM) or "
                        "prompts are prefilled in steps of their own (TGI)")
    json_flag(p)

    p = verb("plan", cmd_plan, "where MODEL's bytes live on DEVICE, and the fewest chips")
    _device_model(p)
    _workload_flags(p)
    p.add_argument("--all-stages", action="store_true", help="list every pipeline stage")
    p.add_argument("--max-batch", action="store_true",
                   help="the largest batch that fits at --context, per chip count (or at "
                        "--tp/--pp/--ep), with the time per token there")
    json_flag(p)

    p = verb("compare", cmd_compare, "every device at the smallest system that holds MODEL")
    p.add_argument("model", help="catalog name or a model .toml file")
    p.add_argument("--devices", default=None,
                   help="comma-separated device names (default: the whole catalog)")
    p.add_argument("--price", action="append", default=[], metavar="DEVICE=USD",
                   help="price per chip-hour, overriding the device file's (repeatable)")
    _workload_flags(p, skip=PARALLEL_FIELDS)
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="the rows as JSON")
    out.add_argument("--csv", action="store_true", help="the rows as CSV")

    p = verb("spec", cmd_spec, "speculative decoding of TARGET on DEVICE: draft, verify, accept")
    p.add_argument("device", help="catalog name or a device .toml file")
    p.add_argument("target", help="the target model: catalog name or a model .toml file")
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
    p.add_argument("--draft-weights", default=None,
                   help="the draft's weight format (see memsim formats; default: the target's)")
    p.add_argument("--scan-batch", action="store_true",
                   help="scan the batch (1 to 512) and print where speculation stops paying")
    _workload_flags(p, skip=("new_tokens", "draft_heads"))
    json_flag(p)

    p = verb("search", cmd_search, "configurations of MODEL that meet a target, cheapest first")
    p.add_argument("model", help="catalog name or a model .toml file")
    p.add_argument("--target", required=True,
                   help="ms_per_token<=X, tokens_per_s>=X (per sequence), tokens_per_s_total>=X; "
                        "comma-separated to combine")
    p.add_argument("--batch", type=int, default=1, help="sequences decoded together")
    p.add_argument("--context", type=int, default=4096, help="tokens in each KV cache")
    p.add_argument("--devices", default=None,
                   help="comma-separated device names (default: the whole catalog)")
    p.add_argument("--formats", default=None,
                   help="weight formats to try (see memsim formats; default: "
                        "bf16,fp8-e4m3,int8,int4-g128)")
    p.add_argument("--kv-formats", default=None,
                   help="KV-cache formats to try (default: bf16,fp8-e4m3)")
    p.add_argument("--store", default=None,
                   help="SQLite results store: a rerun evaluates only what it lacks (default: a "
                        "temporary one)")
    p.add_argument("--top", type=int, default=15, help="configurations to list")
    p.add_argument("--jobs", type=int, default=2,
                   help="local worker processes for the emulations (this machine has 2 cores)")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    json_flag(p)

    p = verb("sweep", cmd_sweep, "run a study file's points into a results store")
    p.add_argument("study", help="a TOML study file (see memsim.study)")
    p.add_argument("--store", default="results.sqlite", help="SQLite results store (a file)")
    p.add_argument("--jobs", type=int, default=1, help="local worker processes")
    p.add_argument("--scheduler", default=None,
                   help="Dask: 'local' for a LocalCluster, or tcp://HOST:PORT")
    p.add_argument("--quiet", action="store_true", help="no progress line")

    p = verb("export", cmd_export, "a results store as CSV, JSON or Parquet")
    p.add_argument("store", help="SQLite results store")
    p.add_argument("--format", choices=("csv", "json", "parquet"), default="csv",
                   help="output format")
    p.add_argument("--study", default=None, help="only this study's rows")
    p.add_argument("-o", "--output", default=None, help="file to write (default: stdout)")

    p = verb("salvage", cmd_salvage, "copy the readable rows of a damaged store into a new one")
    p.add_argument("store", help="the damaged SQLite results store")
    p.add_argument("-o", "--output", required=True, help="the new store (must not exist)")

    p = verb("plot", cmd_plot, "plot a stored study (latency, devices, sram, roofline, bytes)")
    p.add_argument("kind", choices=("latency", "devices", "sram", "roofline", "bytes"),
                   help="what to draw")
    p.add_argument("store", help="SQLite results store")
    p.add_argument("-o", "--output", required=True, help="a .png or .svg file")
    p.add_argument("--study", default=None, help="only this study's rows")
    p.add_argument("--x", default=None, help="latency: the workload field on the x axis")
    p.add_argument("--where", action="append", default=[], metavar="FIELD=VALUE",
                   help="keep rows whose device, model, workload or what-if field has this "
                        "value (repeatable)")

    p = verb("validate", cmd_validate, "predict public measurements as a Markdown report")
    p.add_argument("--folder", default=None, help="validation folder (default: memsim's own)")
    p.add_argument("-o", "--output", default=None,
                   help="Markdown file to write (default: print it; nothing is written)")

    p = verb("completion", cmd_completion, "a shell completion script (needs shtab), e.g. "
                                           "memsim completion bash > ~/.local/share/"
                                           "bash-completion/completions/memsim")
    p.add_argument("shell", choices=("bash", "zsh", "tcsh"), help="the shell")

    p = verb("bench", cmd_bench, "measure the walkers' speed (ratios against a bare loop)")
    p.add_argument("--quick", action="store_true", help="smaller workloads")
    return parser


def _device_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("device", help="catalog name or a device .toml file")
    p.add_argument("model", help="catalog name or a model .toml file")


def field_help(cls: type) -> dict[str, str]:
    """Each field's help: its ``metadata["help"]``, else its entry in the class docstring's
    ``Attributes`` section (``name : text`` or ``a, b : text``, continued on indented lines)."""
    docs: dict[str, str] = {}
    names: list[str] = []
    text = (cls.__doc__ or "").split("Attributes", 1)[-1]
    for line in text.splitlines():
        match = re.match(r"\s*([a-z_][a-z_0-9, ]*) : (.*)", line)
        if match:
            names = [n.strip() for n in match.group(1).split(",")]
            for name in names:
                docs[name] = match.group(2).strip()
        elif line.strip() and names and not set(line.strip()) <= {"-"}:
            for name in names:
                docs[name] += " " + line.strip()
    plain = {name: re.sub(r":\w+:`([^`]*)`", r"\1", text).replace("``", "")
             for name, text in docs.items()}
    return {f.name: (f.metadata.get("help") or plain.get(f.name, "")).replace("%", "%%")
            for f in dataclasses.fields(cls)}


def _flag_type(hint: Any) -> tuple[Any, Any]:
    """The argparse ``type`` of a field's annotation, and a ``store_true``-style action for
    booleans (``None`` otherwise)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    if args[0] is bool:
        return None, argparse.BooleanOptionalAction
    return (args[0] if args[0] in (int, float) else str), None


def _workload_flags(p: argparse.ArgumentParser, *, skip: Sequence[str] = ()) -> None:
    """A flag per Decode field (STYLE pattern 10), then the device what-if flags."""
    hints = typing.get_type_hints(Decode)
    helps = field_help(Decode)
    for f in dataclasses.fields(Decode):
        if f.name in skip or f.name in LOWERED_FIELDS:
            continue
        flag = FIELD_FLAGS.get(f.name, "--" + f.name.replace("_", "-"))
        if f.name in FIELD_FLAGS:
            p.add_argument(flag, dest=f.name, action="append", default=[],
                           metavar=FIELD_METAVARS.get(f.name), help=helps[f.name]
                           + " (repeatable, later rules win)")
            continue
        kind, action = _flag_type(hints[f.name])
        default = None if f.default is dataclasses.MISSING else f.default
        extra = {"action": action} if action else {"type": kind}
        p.add_argument(flag, dest=f.name, default=default,
                       choices=f.metadata.get("choices", FIELD_CHOICES.get(f.name)),
                       help=helps[f.name] or " ", **extra)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="device what-if, e.g. --set tiers.hbm.bandwidth=5TB/s or --set cores=66 "
                        "(repeatable)")
    p.add_argument("--add-tier", action="append", default=[], metavar="TEMPLATE",
                   help="add a tier template outermost, e.g. cxl-gen5-x16 (repeatable)")


_PLAN_COMMAND = re.compile(r"`memsim plan [^`]*`")
_PARALLEL_FLAGS = tuple("--" + name for name in PARALLEL_FIELDS)


def _suggestion(argv: Sequence[str]) -> str:
    """``memsim plan`` with the user's own flags, less the parallelism it will choose."""
    words = list(argv)
    if words and words[0] in ("run", "plan", "spec"):
        words[0] = "plan"
    kept, skip = [], False
    for word in words:
        if skip:
            skip = False
            continue
        if word in _PARALLEL_FLAGS:
            skip = True
            continue
        if word.split("=", 1)[0] in _PARALLEL_FLAGS:
            continue
        kept.append(word if re.fullmatch(r"[\w@%+=:,./-]+", word) else repr(word))
    return "`memsim " + " ".join(kept) + "`"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``memsim`` console script; user errors print one line and exit 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    try:
        args = parser.parse_args(argv)
        return args.func(args)
    except CapacityError as exc:
        message = str(exc)
        if argv and argv[0] in ("run", "plan", "spec"):
            message = _PLAN_COMMAND.sub(lambda _: _suggestion(argv), message)
        print(f"memsim: error: {message}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"memsim: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("memsim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:             # a reader such as `head` stopped early
        sys.stderr = open(os.devnull, "w")
        return 0


if __name__ == "__main__":
    sys.exit(main())
