"""Validation: memsim's predictions beside public measurements and the landscape's claims.

``memsim validate`` (or ``python -m memsim.validate``) reads a validation folder (the
repository's ``validation/``, shipped inside the package as ``memsim/validation``:
``measurements.toml``, device and model files for hardware and models outside the catalog,
``findings.toml`` explaining rows memsim gets wrong), predicts each measured configuration, and
renders the comparison as Markdown with the median error per group (device family, runtime,
batch 1 or batched, one chip or several, speculative speedups). ``summary()`` returns the same
medians as data. Rows memsim cannot predict (serving rows without the requests' lengths,
figures that include unpublished speculative decoding, formats memsim does not know)
are listed with the reason. Serving rows (continuous batching: ``serving`` with the requests'
``input_tokens`` and ``output_tokens``) are predicted by :func:`memsim.serving.serve` and have
their own group.

Example: ``memsim.validate.summary().median("batch 1")`` is the median absolute error over the
batch-1 decode rows.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from memsim import kernel_rows
from memsim.compare import compare_device
from memsim.datafile import check_keys, read_toml_file, require_int, require_str
from memsim.device import Device
from memsim.emulate import emulate
from memsim.errors import ConfigError
from memsim.inputs import decode_from, device_from, model_from
from memsim.model import Model
from memsim.runtime import runtime_names
from memsim.serving import SCHEDULING, Serving, serve
from memsim.speculative import Acceptance, closed_form_tokens, speculative
from memsim.units import format_quantity
from memsim.workload import Decode, Prefill

DECODE_METRICS = ("tokens_per_s_per_user", "ms_per_token", "tokens_per_s_total")
METRICS = DECODE_METRICS + ("ttft_ms", "speedup")
RUNTIMES = tuple(runtime_names())    # the catalog's, derived files (vllm-0.6-rocm) included
SPEC_METHODS = ("draft", "heads", "ngram")
REQUIRED = ("id", "device", "model", "weights", "software", "runtime", "batch", "context",
            "metric", "value", "source")
OPTIONAL = ("chips", "parallel", "kv", "activations", "note", "prompt", "serving",
            "speculative_in_figure", "method", "draft", "gamma", "tree", "accepted_tokens",
            "acceptance", "input_tokens", "output_tokens", "cached_tokens", "concurrency",
            "token_budget", "max_batch", "scheduling")
SERVING_METRICS = ("ms_per_token", "tokens_per_s_total", "tokens_per_s_per_user")
SERVING_GROUP = "serving (continuous batching)"
HEADER = "# memsim against measurements"

# Device name prefix -> family (catalog and validation device files alike; the device files
# themselves carry no family key).
FAMILY_PREFIXES = (
    ("a100", "NVIDIA"), ("h100", "NVIDIA"), ("h200", "NVIDIA"), ("b200", "NVIDIA"),
    ("gb200", "NVIDIA"), ("l40", "NVIDIA"), ("rtx-", "NVIDIA"),
    ("m1-", "Apple"), ("m2-", "Apple"), ("m3-", "Apple"), ("m4-", "Apple"),
    ("mi2", "AMD"), ("mi3", "AMD"), ("tpu-", "Google TPU"), ("inferentia", "AWS"),
    ("trainium", "AWS"), ("groq", "Groq"), ("wse", "Cerebras"), ("gaudi", "Intel"),
    ("maia", "Microsoft"), ("mtia", "Meta"), ("ipu", "Graphcore"),
)

NO_SERVING_SHAPE = ("serving row ({serving}) without input_tokens and output_tokens: memsim "
                    "predicts continuous batching from the requests' lengths")
SPEC_IN_FIGURE = ("the published figure includes speculative decoding whose draft and "
                  "acceptance are not published; memsim's plain decode is not comparable")


def device_family(name: str) -> str:
    """The vendor family of a device name (``"other"`` when no prefix matches)."""
    for prefix, family in FAMILY_PREFIXES:
        if name.startswith(prefix):
            return family
    return "other"


@dataclass(frozen=True)
class Row:
    """One measurement and memsim's prediction of it."""

    measurement: dict[str, Any]
    predicted: float | None
    error: float | None           # memsim's speed over the measured speed, minus one
    bottleneck: str
    problem: str                   # why there is no prediction
    roofline_error: float | None = None   # the same for bytes over peak bandwidth
    serving: Serving | None = None         # a serving row's steady state

    @property
    def id(self) -> str:
        return self.measurement["id"]

    @property
    def family(self) -> str:
        """The device's vendor family."""
        return device_family(self.measurement["device"])

    @property
    def runtime(self) -> str:
        """The software stack that took the measurement."""
        return self.measurement["runtime"]

    @property
    def chips(self) -> int:
        return int(self.measurement.get("chips", 1))

    @property
    def is_speculative(self) -> bool:
        """A speedup row: memsim predicts speculative decoding's speedup."""
        return self.measurement["metric"] == "speedup"

    @property
    def is_prefill(self) -> bool:
        """A time-to-first-token row: memsim predicts the prompt's prefill step."""
        return self.measurement["metric"] == "ttft_ms"

    @property
    def is_serving(self) -> bool:
        """A serving row: continuous batching of requests, predicted by :func:`memsim.serve`."""
        return bool(self.measurement.get("serving"))

    @property
    def is_decode(self) -> bool:
        """A decode-speed row (not serving, not a speedup, not a time to first token)."""
        return self.measurement["metric"] in DECODE_METRICS and not self.is_serving


@dataclass(frozen=True)
class Median:
    """The median absolute error of one group of predicted rows."""

    group: str                     # e.g. "batch 1", "family NVIDIA", "runtime vllm"
    rows: int                      # predicted rows in the group
    median_abs_error: float | None  # None for an empty group


@dataclass(frozen=True)
class Summary:
    """Medians per group and the rows memsim cannot predict, as data.

    Decode groups (``all``, ``batch 1``, ``batched``, ``single chip``, ``multi-chip``,
    ``family X``, ``runtime X``) hold the decode-speed rows; ``speculative`` holds the speedup
    rows (their error is on the speedup); ``time to first token`` the prefill rows;
    ``serving (continuous batching)`` the serving rows (their own metric: inter-token latency or
    output tokens/s of the steady state).
    """

    measurements: int
    predicted: int
    groups: tuple[Median, ...]
    unpredictable: tuple[tuple[str, str], ...]    # (row id, reason)

    def median(self, group: str) -> float | None:
        """The median absolute error of a group by name (None if empty or unknown)."""
        for item in self.groups:
            if item.group == group:
                return item.median_abs_error
        return None

    def to_dict(self) -> dict[str, Any]:
        """Plain data."""
        return asdict(self)


def _median(name: str, rows: Sequence[Row]) -> Median:
    errors = [abs(r.error) for r in rows if r.error is not None]
    return Median(name, len(errors), statistics.median(errors) if errors else None)


def summarize(rows: Sequence[Row]) -> Summary:
    """Medians of |error| per group; groups in a fixed order, then families and runtimes."""
    decode = [r for r in rows if r.is_decode and r.error is not None]
    serving = [r for r in rows if r.is_serving]
    groups = [
        _median("all", decode),
        _median("batch 1", [r for r in decode if r.measurement["batch"] == 1]),
        _median("batched", [r for r in decode if r.measurement["batch"] > 1]),
        _median("single chip", [r for r in decode if r.chips == 1]),
        _median("multi-chip", [r for r in decode if r.chips > 1]),
        _median("speculative", [r for r in rows if r.is_speculative]),
        _median("time to first token", [r for r in rows if r.is_prefill]),
        _median(SERVING_GROUP, serving),
    ]
    for family in sorted({r.family for r in decode}):
        groups.append(_median(f"family {family}", [r for r in decode if r.family == family]))
    for runtime in sorted({r.runtime for r in decode}):
        groups.append(_median(f"runtime {runtime}", [r for r in decode
                                                     if r.runtime == runtime]))
    return Summary(
        measurements=len(rows),
        predicted=sum(r.error is not None for r in rows),
        groups=tuple(groups),
        unpredictable=tuple((r.id, r.problem) for r in rows if r.error is None),
    )


def default_folder() -> Path:
    """The validation folder: a source checkout's ``validation/``, else the packaged copy."""
    here = Path(__file__).resolve().parent
    checkout = here.parent / "validation"
    return checkout if (checkout / "measurements.toml").exists() else here / "validation"


def resolve_device(name: str, folder: Path) -> Device:
    """A device by name: the validation folder's ``devices/NAME.toml``, else the catalog's."""
    local = folder / "devices" / f"{name}.toml"
    return device_from(str(local) if local.exists() else name)


def resolve_model(name: str, folder: Path) -> Model:
    """A model by name: the validation folder's ``models/NAME.toml``, else the catalog's."""
    local = folder / "models" / f"{name}.toml"
    return model_from(str(local) if local.exists() else name)


def _check_row(row: dict[str, Any], i: int, file: str) -> None:
    prefix = f"measurement.{i}."
    check_keys(row, required=REQUIRED, optional=OPTIONAL, file=file, prefix=prefix)
    require_str(row["id"], file=file, field=prefix + "id")
    require_str(row["source"], file=file, field=prefix + "source")
    require_int(row["batch"], file=file, field=prefix + "batch")
    require_int(row["context"], file=file, field=prefix + "context", minimum=0)
    require_str(row["metric"], file=file, field=prefix + "metric", choices=METRICS)
    require_str(row["runtime"], file=file, field=prefix + "runtime", choices=RUNTIMES)
    value = row["value"]
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0
            or not math.isfinite(value)):
        raise ConfigError(f"expected a positive, finite number, got {value!r}", file=file,
                          field=prefix + "value")
    if "chips" in row:
        require_int(row["chips"], file=file, field=prefix + "chips")
    if row["metric"] == "ttft_ms":
        require_int(row.get("prompt"), file=file, field=prefix + "prompt")
    if row.get("serving"):
        _check_serving(row, prefix, file)
    elif "input_tokens" in row or "output_tokens" in row:
        _check_static_batch(row, prefix, file)
    if row["metric"] == "speedup":
        require_str(row.get("method"), file=file, field=prefix + "method", choices=SPEC_METHODS)
        require_int(row.get("gamma"), file=file, field=prefix + "gamma")
        if ("accepted_tokens" in row) == ("acceptance" in row):
            raise ConfigError("a speedup row gives accepted_tokens (mean tokens per "
                              "iteration) or acceptance (rate per drafted token), one of them",
                              file=file, field=prefix + "accepted_tokens")
        if row["method"] == "draft":
            require_str(row.get("draft"), file=file, field=prefix + "draft")


def _check_static_batch(row: dict[str, Any], prefix: str, file: str) -> None:
    """A static batch timed end to end: its prompt and output lengths, both given."""
    prompt = require_int(row.get("input_tokens"), file=file, field=prefix + "input_tokens")
    require_int(row.get("output_tokens"), file=file, field=prefix + "output_tokens")
    require_str(row["metric"], file=file, field=prefix + "metric", choices=DECODE_METRICS)
    if "cached_tokens" in row:
        cached = require_int(row["cached_tokens"], file=file, field=prefix + "cached_tokens",
                             minimum=0)
        if cached >= prompt:
            raise ConfigError(f"expected fewer cached tokens than the prompt's {prompt} (the "
                              f"last token is always computed), got {cached}", file=file,
                              field=prefix + "cached_tokens")


def _check_serving(row: dict[str, Any], prefix: str, file: str) -> None:
    """A serving row's request shape and engine settings, where it states them."""
    require_str(row["serving"], file=file, field=prefix + "serving")
    if "input_tokens" in row or "output_tokens" in row:
        require_int(row.get("input_tokens"), file=file, field=prefix + "input_tokens",
                    minimum=0)
        require_int(row.get("output_tokens"), file=file, field=prefix + "output_tokens")
        require_str(row["metric"], file=file, field=prefix + "metric", choices=SERVING_METRICS)
    for name in ("concurrency", "token_budget", "max_batch"):
        if name in row:
            require_int(row[name], file=file, field=prefix + name)
    if "scheduling" in row:
        require_str(row["scheduling"], file=file, field=prefix + "scheduling",
                    choices=SCHEDULING)


def load_measurements(folder: Path) -> list[dict[str, Any]]:
    """The measurement tables, checked for their keys and forms."""
    file = str(folder / "measurements.toml")
    rows = read_toml_file(file).get("measurement", [])
    seen = set()
    for i, row in enumerate(rows):
        _check_row(row, i, file)
        if row["id"] in seen:
            raise ConfigError(f"id {row['id']!r} used twice", file=file,
                              field=f"measurement.{i}.id")
        seen.add(row["id"])
    return rows


def acceptance_for(tokens: float, gamma: int, tree: Sequence[int] | None = None) -> float:
    """The constant per-position acceptance rate whose expected tokens per iteration is
    ``tokens`` (bisection; a candidate tree of branching factors per depth accepts a depth
    when any of its ``b`` candidates is accepted: ``1 - (1 - a)^b``)."""
    def expected(rate: float) -> float:
        if tree:
            return Acceptance(tuple(1.0 - (1.0 - rate) ** b for b in tree)).expected_tokens
        return closed_form_tokens(rate, gamma)

    most = expected(1.0)
    if not 1.0 <= tokens <= most:
        raise ConfigError(f"mean accepted tokens {tokens} outside 1 .. {most:g} for this gamma "
                          "or tree", field="accepted_tokens")
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if expected(mid) < tokens else (low, mid)
    return (low + high) / 2


def _unpredictable(row: dict[str, Any]) -> str:
    """Why memsim cannot predict a row as stated ("" when it can try)."""
    if row.get("serving") and "input_tokens" not in row:
        return NO_SERVING_SHAPE.format(serving=row["serving"])
    if row.get("speculative_in_figure"):
        return SPEC_IN_FIGURE
    return ""


def _decode_fields(row: dict[str, Any]) -> dict[str, Any]:
    chips = int(row.get("chips", 1))
    parallel = row.get("parallel", "tp")
    return dict(batch=row["batch"], context=row["context"], weights=row["weights"],
                kv=row.get("kv", "bf16"), activations=row.get("activations", "auto"),
                tp=chips if parallel == "tp" else 1,
                pp=chips if parallel == "pp" else 1, runtime=row["runtime"])


def _predict_speedup(row: dict[str, Any], dev: Device, mod: Model, folder: Path) -> Row:
    method = row["method"]
    tree = tuple(row["tree"]) if row.get("tree") else None
    rate = (float(row["acceptance"]) if "acceptance" in row
            else acceptance_for(float(row["accepted_tokens"]), row["gamma"], tree))
    draft = resolve_model(row["draft"], folder) if method == "draft" else None
    report = speculative(dev, mod, draft, row["gamma"], rate, method=method, tree=tree,
                         **_decode_fields(row))
    return Row(row, report.speedup, report.speedup / row["value"] - 1,
               f"verify {report.verify_bound_by}", "")


def _predict_serving(row: dict[str, Any], dev: Device, mod: Model) -> Row:
    fields = {k: v for k, v in _decode_fields(row).items() if k not in ("batch", "context")}
    state = serve(dev, mod, input_tokens=row["input_tokens"], output_tokens=row["output_tokens"],
                  concurrency=row.get("concurrency", row["batch"]),
                  token_budget=row.get("token_budget"), max_batch=row.get("max_batch"),
                  scheduling=row.get("scheduling", "mixed"), **fields)
    value = {"ms_per_token": 1e3 * state.inter_token_latency_s,
             "tokens_per_s_total": state.output_tokens_per_s,
             "tokens_per_s_per_user": state.tokens_per_s_per_user}[row["metric"]]
    return Row(row, value, _speed_ratio(row, value) - 1, state.bottleneck, "", None,
               state)


def predict(row: dict[str, Any], folder: Path) -> Row:
    """memsim's figure for one measured configuration, in the measurement's metric."""
    reason = _unpredictable(row)
    if reason:
        return Row(row, None, None, "", reason)
    try:
        dev = resolve_device(row["device"], folder)
        mod = resolve_model(row["model"], folder)
        if row["metric"] == "speedup":
            return _predict_speedup(row, dev, mod, folder)
        if row.get("serving"):
            return _predict_serving(row, dev, mod)
        prefill_s = 0.0
        if row["metric"] == "ttft_ms":
            fields = {k: v for k, v in _decode_fields(row).items() if k != "context"}
            report = emulate(dev, mod, Prefill(prompt=row["prompt"], **fields))
        else:
            report = emulate(dev, mod, decode_from(_decode_fields(row)))
            if "output_tokens" in row:
                prefill_s = _static_prefill_s(row, dev, mod)
    except ConfigError as exc:
        return Row(row, None, None, "", str(exc))
    if prefill_s:       # a static batch's output tokens over its prefill and decode steps
        value = _in_metric(row, report.time_per_token + prefill_s / row["output_tokens"])
    else:
        value = {"tokens_per_s_per_user": report.tokens_per_s,
                 "ms_per_token": 1e3 * report.time_per_token,
                 "tokens_per_s_total": report.tokens_per_s_total,
                 "ttft_ms": 1e3 * report.time_per_step}[row["metric"]]
    main = dev.main_memory
    chip_bytes = sum(report.chip(s)["bytes_read"][main.name] + report.chip(s)["bytes_written"][
        main.name] for s in range(report.pp))
    roofline_s = chip_bytes / main.bandwidth           # one chip per stage, stages in turn
    return Row(row, value, _speed_ratio(row, value) - 1, report.bottleneck, "",
               _speed_ratio(row, _in_metric(row, roofline_s)) - 1)


def _static_prefill_s(row: dict[str, Any], dev: Device, mod: Model) -> float:
    """Seconds to prefill a static batch's prompts (``input_tokens`` each, every sequence of
    the batch in one prompt step), which the row's end-to-end figure includes; the first
    ``cached_tokens`` of each prompt already in the KV cache (a benchmark that repeats its
    prompts under prefix caching) are read, not computed."""
    fields = {k: v for k, v in _decode_fields(row).items() if k != "context"}
    cached = row.get("cached_tokens", 0)
    return emulate(dev, mod, Prefill(prompt=row["input_tokens"] - cached, cached=cached,
                                     **fields)).time_per_step


def _in_metric(row: dict[str, Any], step_s: float) -> float:
    """A step time in the measurement's metric."""
    return {"tokens_per_s_per_user": 1.0 / step_s, "ms_per_token": 1e3 * step_s,
            "tokens_per_s_total": row["batch"] / step_s, "ttft_ms": 1e3 * step_s}[row["metric"]]


def _speed_ratio(row: dict[str, Any], predicted: float) -> float:
    """Predicted speed over measured speed (a time metric inverted)."""
    if row["metric"] in ("ms_per_token", "ttft_ms"):
        return row["value"] / predicted
    return predicted / row["value"]


def _landscape() -> list[str]:
    """The landscape's Llama 3 70B batch-1 table, recomputed."""
    model = model_from("llama-3-70b")
    bf16 = 2 * model.total_params
    h100 = device_from("h100-sxm")
    lines = [
        "## The landscape's figures, checked",
        "",
        f"- *70B in FP16 is ~140 GB*: Llama 3 70B has {model.total_params / 1e9:.2f} B "
        f"parameters, {bf16 / 1e9:.1f} GB in BF16. *At 3.35 TB/s that is >= 42 ms a token*: "
        f"{bf16 / h100.tier('hbm').bandwidth * 1e3:.1f} ms at the peak, "
        f"{bf16 / h100.tier('hbm').sustained_bandwidth * 1e3:.1f} ms at the sustained "
        f"{format_quantity(h100.tier('hbm').sustained_bandwidth, 'bandwidth')}; but 140 GB does "
        "not fit one 80 GB H100, so no single H100 runs it.",
        "",
        "Llama 3 70B, batch 1, context 4096, BF16 weights (memsim: each device at the fewest "
        "chips that hold the model under its own memory policy; 8x H100 as claimed, TP 8):",
        "",
        "| hardware | claim ms/token | claim tokens/s | claim $/M tokens | memsim system | memsim "
        "ms/token | memsim tokens/s | memsim $/M tokens | bound by |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    claims = [("8x NVIDIA H100", "h100-sxm", 45, 22, 1.20, 8),
              ("Groq LPU (claim: 1 chip)", "groq-lpu", 8, 125, 0.80, None),
              ("Cerebras WSE-3", "wse-3", 12, 83, 0.65, None),
              ("AWS Inferentia2", "inferentia2", 30, 33, 0.90, None)]
    for label, name, ms, tps, cost, tp in claims:
        dev = device_from(name)
        if tp:
            report = emulate(dev, model, Decode(batch=1, context=4096, tp=tp))
            chips, seconds, rate, bound = f"{tp} (TP {tp})", report.time_per_token, \
                report.tokens_per_s, report.bottleneck
            price = (dev.usd_per_chip_hour * tp / (report.tokens_per_s_total * 3600) * 1e6
                     if dev.usd_per_chip_hour else None)
        else:
            row = compare_device(dev, model, Decode(batch=1, context=4096))
            chips = f"{row.chips} ({row.tp}x{row.pp}, {row.policy})"
            seconds, rate, bound, price = (row.time_per_token_s, row.tokens_per_s,
                                           row.bottleneck, row.usd_per_million_tokens)
        lines.append(f"| {label} | {ms} | {tps} | {cost:.2f} | {chips} | {1e3 * seconds:.2f} | "
                     f"{rate:.1f} | {'-' if price is None else f'{price:.2f}'} | {bound} |")
    lines += [
        "",
        "Where they differ, and why: the claims read like a bytes-over-bandwidth estimate for one "
        "chip (Groq's '1 chip' cannot hold 141 GB in 230 MB; memsim needs hundreds of LPUs, and "
        "with the weights on chip the step is bound by compute, link hops and dispatch, not "
        "memory). memsim's 8x H100 time is the weights' HBM traffic split eight ways plus two "
        "all-reduces per layer and a launch per op; costs use the device files' on-demand prices "
        "(none is public for Groq and Cerebras chips).",
        "",
    ]
    return lines


def _fmt(error: float | None) -> str:
    return "-" if error is None else f"{100 * error:+.0f}%"


def _median_lines(summary: Summary) -> list[str]:
    lines = ["## Median absolute error by group", "",
             "Decode rows (tokens per second or milliseconds per token) by batch, chip count, "
             "device family and runtime; speculative rows on the speedup; serving rows on their "
             "steady state's inter-token latency or output tokens/s. `python -c \"import "
             "memsim.validate as v; print(v.summary().to_dict())\"` gives the same as data.", "",
             "| group | predicted rows | median abs error |", "|---|---|---|"]
    for item in summary.groups:
        value = "-" if item.median_abs_error is None else f"{100 * item.median_abs_error:.1f}%"
        lines.append(f"| {item.group} | {item.rows} | {value} |")
    return lines + [""]


def _decode_table(rows: Sequence[Row]) -> list[str]:
    lines = ["## Decode rows", "",
             "Error: memsim's speed over the measured speed, minus one (positive: memsim predicts "
             "faster than measured); the roofline column is the same for bytes over peak "
             "bandwidth.", "",
             "| id | family | device x chips | model | weights | runtime | batch | context | "
             "metric | measured | memsim | error | roofline error | memsim bound by |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r.measurement
        predicted = "-" if r.predicted is None else f"{r.predicted:.1f}"
        lines.append(f"| {m['id']} | {r.family} | {m['device']} x {r.chips} | {m['model']} | "
                     f"{m['weights']} | {m['runtime']} | {m['batch']} | {m['context']} | "
                     f"{m['metric']} | {m['value']} | {predicted} | {_fmt(r.error)} | "
                     f"{_fmt(r.roofline_error)} | {r.bottleneck or r.problem} |")
    return lines + [""]


def _serving_table(rows: Sequence[Row]) -> list[str]:
    lines = ["## Serving rows (continuous batching)", "",
             "memsim predicts the steady state of continuous batching (`memsim.serve`): from the "
             "requests' input and output tokens, the clients' concurrency and the engine's token "
             "budget, Little's law gives the requests finishing per step, the decodes and prompt "
             "tokens each step carries, and which steps carry prompt chunks; every kind of step "
             "is emulated (a decode step with a `prefill_chunk`, a plain decode step or a "
             "prefill). Live: sequences in the engine (the concurrency, the engine's max batch or "
             "what memsim's capacity check holds at input + output tokens, the least). Metric "
             "`ms_per_token` is the mean inter-token latency, `tokens_per_s_total` output tokens "
             "per second.", "",
             "| id | device x chips | model | weights | runtime | scheduling | ISL / OSL | "
             "concurrency | budget | live | steps (share: decodes + prompt tokens) | metric | "
             "measured | memsim | error | memsim bound by |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r.measurement
        state = r.serving
        steps = "-" if state is None else ", ".join(
            f"{s.share:.2f}: {s.decode_sequences} + {s.prompt_tokens}" for s in state.steps)
        predicted = "-" if r.predicted is None else f"{r.predicted:.1f}"
        lines.append(f"| {m['id']} | {m['device']} x {r.chips} | {m['model']} | {m['weights']} | "
                     f"{m['runtime']} | {m.get('scheduling', 'mixed')} | "
                     f"{m.get('input_tokens', '-')} / {m.get('output_tokens', '-')} | "
                     f"{m.get('concurrency', m['batch'])} | {m.get('token_budget', '-')} | "
                     f"{'-' if state is None else state.live_sequences} | {steps} | "
                     f"{m['metric']} | {m['value']} | {predicted} | {_fmt(r.error)} | "
                     f"{r.bottleneck or r.problem} |")
    limited = [r for r in rows if r.serving is not None and r.serving.limits]
    if limited:
        lines += ["", "What the emulated steps approximate:", ""]
        lines += [f"- **{r.id}**: {r.serving.limits}" for r in limited]
    return lines + [""]


def _speculative_table(rows: Sequence[Row]) -> list[str]:
    lines = ["## Speculative decoding rows", "",
             "memsim is given the reported mean accepted tokens per iteration (or acceptance "
             "rate), turned into a constant per-position rate, and predicts the speedup over "
             "plain decode on the same system (`memsim.speculative`).", "",
             "| id | device | target | method | draft | gamma / tree | accepted tokens | "
             "runtime | measured speedup | memsim speedup | error | memsim |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r.measurement
        shape = f"{m['gamma']}" + (f" / {tuple(m['tree'])}" if m.get("tree") else "")
        accepted = m.get("accepted_tokens", f"rate {m.get('acceptance')}")
        predicted = "-" if r.predicted is None else f"{r.predicted:.2f}"
        lines.append(f"| {m['id']} | {m['device']} | {m['model']} | {m['method']} | "
                     f"{m.get('draft', '-')} | {shape} | {accepted} | {m['runtime']} | "
                     f"{m['value']} | {predicted} | {_fmt(r.error)} | "
                     f"{r.bottleneck or r.problem} |")
    return lines + [""]


def _unpredictable_lines(rows: Sequence[Row]) -> list[str]:
    missing = [r for r in rows if r.error is None]
    lines = ["## Rows memsim does not predict, and why", ""]
    for r in missing:
        m = r.measurement
        what = f"{m['metric']} {m['value']}" + (f", prompt {m['prompt']}" if m.get("prompt")
                                                 else "")
        lines.append(f"- **{r.id}** ({m['device']} x {r.chips}, {m['model']}, {m['weights']}, "
                     f"{m['runtime']}, batch {m['batch']}; {what}): {r.problem}")
    return lines + [""]


def render(rows: Sequence[Row], folder: Path) -> str:
    """The Markdown report (docs/validation.md)."""
    findings: dict[str, str] = {}
    findings_file = folder / "findings.toml"
    if findings_file.exists():
        findings = {str(k): str(v) for k, v in read_toml_file(findings_file).items()}
    summary = summarize(rows)
    decode = [r for r in rows if not r.is_speculative and not r.is_serving]
    roof1 = [abs(r.roofline_error) for r in decode if r.roofline_error is not None
             and r.measurement["batch"] == 1]
    batch1, every = summary.groups[1], summary.groups[0]
    lines = [
        HEADER, "",
        "Generated by `memsim validate` from `validation/` (measurements, their sources, device "
        "and model files for hardware and models outside the catalog). Do not edit by hand.", "",
        f"{summary.measurements} measurements; memsim predicts {summary.predicted}.",
    ]
    if batch1.median_abs_error is not None:
        lines[-1] += (f" Median absolute error: **{100 * batch1.median_abs_error:.1f}%** over the "
                      f"{batch1.rows} batch-1 decode rows, "
                      f"{100 * (every.median_abs_error or 0.0):.1f}% over all {every.rows} "
                      "decode rows.")
    serving = summary.median(SERVING_GROUP)
    if serving is not None:
        rows_served = next(g.rows for g in summary.groups if g.group == SERVING_GROUP)
        lines[-1] += (f" Serving (continuous batching, `memsim.serve`): **{100 * serving:.1f}%** "
                      f"over {rows_served} rows.")
    if roof1:
        lines += ["", f"A bytes-over-peak-bandwidth roofline of the same rows (the bytes memsim "
                      f"counts, over the main memory's peak) is off by a median "
                      f"**{100 * statistics.median(roof1):.1f}%** at batch 1: the gap memsim's "
                      "cycle model (sustained bandwidth, launches, collective latency, waves, "
                      "dequantization) is there to close."]
    lines += [""] + _median_lines(summary) + _decode_table(decode)
    lines += _serving_table([r for r in rows if r.is_serving])
    lines += _speculative_table([r for r in rows if r.is_speculative])
    lines += _unpredictable_lines(rows)
    tables = kernel_rows.load_tables(folder)
    lines += kernel_rows.render(tables, kernel_rows.predict(tables, folder, resolve_device,
                                                            resolve_model), findings)
    worst = sorted((r for r in rows if r.error is not None), key=lambda r: -abs(r.error))[:10]
    lines += ["## The worst rows, explained", ""]
    for r in worst:
        lines.append(f"- **{r.id}** ({100 * r.error:+.0f}%): "
                     f"{findings.get(r.id, 'not yet explained')}")
    lines += ["", "## Sources", ""]
    for r in rows:
        note = f" ({r.measurement['note']})" if r.measurement.get("note") else ""
        lines.append(f"- **{r.id}** [{r.measurement['software']}]: "
                     f"{r.measurement['source']}{note}")
    lines += [""] + _landscape()
    return "\n".join(lines) + "\n"


def _write(text: str, output: Path) -> None:
    """Write the report, refusing to replace a file that is not an earlier report."""
    if output.exists():
        try:
            first = output.read_text(encoding="utf-8").split("\n", 1)[0]
        except (OSError, UnicodeDecodeError):
            first = ""
        if first.strip() != HEADER:
            raise ConfigError(f"{output} exists and is not a memsim validation report; choose "
                              "another path or remove it", field="--output")
    output.write_text(text, encoding="utf-8")


def validate(folder: Path | None = None, output: Path | None = None) -> tuple[list[Row], str]:
    """Predict every measurement and render the report; write it only to ``output`` (an
    existing file there must be an earlier report). Returns the rows and the Markdown."""
    folder = Path(folder) if folder is not None else default_folder()
    rows = _predict_all(folder)
    text = render(rows, folder)
    if output is not None:
        _write(text, Path(output))
    return rows, text


def _predict_all(folder: Path) -> list[Row]:
    """Every measurement of a validation folder, predicted."""
    if not (folder / "measurements.toml").exists():
        raise ConfigError("no measurements.toml in the validation folder", file=str(folder),
                          field="--folder")
    return [predict(row, folder) for row in load_measurements(folder)]


def summary(folder: Path | None = None) -> Summary:
    """The medians per group and the unpredictable rows of a validation folder, as data (the
    report is not rendered: its kernel rows and landscape checks are not in the medians)."""
    return summarize(_predict_all(Path(folder) if folder is not None else default_folder()))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m memsim.validate [FOLDER] [OUTPUT]``: print the report, or write OUTPUT."""
    args = list(sys.argv[1:] if argv is None else argv)
    folder = Path(args[0]) if args else default_folder()
    output = Path(args[1]) if len(args) > 1 else None
    rows, text = validate(folder, output)
    if output is None:
        print(text, end="")
    else:
        print(f"wrote {output}: {len(rows)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
