"""A target to meet: the configurations of a model that meet a latency or throughput target.

:func:`search` walks devices, chip counts (tensor parallel x pipeline stages), weight formats
and KV formats; for each it emulates a few systems as one stored study (:mod:`memsim.study`,
:mod:`memsim.sweep`: resumable, one row per point), keeps those that meet every target, ranks
them by cost per million tokens (chips where no price is public) and marks the Pareto front of
latency against throughput per chip.

Pruning happens before emulating:

- chip counts: the fewest chips that hold the model under the device's own policy
  (:func:`memsim.capacity.fewest_chips`); when they pipeline, tensor parallel alone on the
  smallest degree that shards the model on at least as many chips; then on at least twice as
  many chips, :data:`TP_DOUBLINGS` times, within the link domain; the chip counts are found once per device and weight
  format, with the widest KV format asked (any narrower one fits the same chips; a narrower one
  that would fit on fewer chips is not looked for);
- a bound: every chip reads its share of the weights once per step, at most at the device's
  fastest tier bandwidth, and what its on-chip tier cannot hold from the tiers beyond
  (:func:`_bound_s`); a point whose bound already misses the target is not emulated.

Targets: ``ms_per_token<=X``, ``tokens_per_s>=X`` (per sequence), ``tokens_per_s_total>=X``
(the batch), comma-separated to combine.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memsim.capacity import fewest_chips
from memsim.checkpoints import MIXTURES, weight_formats
from memsim.compare import usd_per_million_tokens
from memsim.device import Device, device_names
from memsim.errors import ConfigError
from memsim.formats import get_format
from memsim.inputs import decode_from, device_from, model_from
from memsim.layout import tp_degrees
from memsim.model import Model
from memsim.plan import tp_ranks_per_chip
from memsim.store import Store
from memsim.study import grid
from memsim.sweep import sweep

WEIGHT_FORMATS = ("bf16", "fp8-e4m3", "int8", "int4-g128")
KV_FORMATS = ("bf16", "fp8-e4m3")
TP_DOUBLINGS = 1
BOUND_SAFETY = 0.9      # the bound's spare: a point within 10% of missing it is emulated
METRICS = {"ms_per_token": "<=", "tokens_per_s": ">=", "tokens_per_s_total": ">="}
_TARGET = re.compile(r"\s*([a-z_]+)\s*(<=|>=)\s*([0-9.eE+-]+)\s*")
_OPS = {"<=": operator.le, ">=": operator.ge}


@dataclass(frozen=True)
class Target:
    """One bound on a figure: ``metric op value`` (``ms_per_token <= 20``)."""

    metric: str
    op: str
    value: float

    def met(self, figures: dict[str, float]) -> bool:
        """Whether a point's figures meet this bound."""
        return _OPS[self.op](figures[self.metric], self.value)

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"


def parse_target(text: str) -> tuple[Target, ...]:
    """``"ms_per_token<=20,tokens_per_s_total>=500"`` as Targets."""
    targets = []
    for part in str(text).split(","):
        match = _TARGET.fullmatch(part)
        value = float(match.group(3)) if match and _number(match.group(3)) else None
        if (match is None or match.group(1) not in METRICS or METRICS[match.group(1)]
                != match.group(2) or value is None or not value > 0):
            raise ConfigError(f"expected targets such as ms_per_token<=20, tokens_per_s>=50 "
                              f"or tokens_per_s_total>=2000 (comma-separated), got {part!r}",
                              field="--target")
        targets.append(Target(match.group(1), match.group(2), value))
    return tuple(targets)


def _number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


@dataclass(frozen=True)
class Configuration:
    """One emulated configuration and its figures; ``pareto`` marks the front of latency
    against throughput per chip among the configurations that meet the target."""

    device: str
    tp: int
    pp: int
    weights: str
    kv: str
    policy: str
    time_per_token_s: float
    tokens_per_s: float
    tokens_per_s_total: float
    bottleneck: str
    usd_per_million_tokens: float | None
    pareto: bool = False

    @property
    def chips(self) -> int:
        """Chips in the configuration."""
        return self.tp * self.pp

    @property
    def tokens_per_s_per_chip(self) -> float:
        """Tokens per second of the batch, per chip."""
        return self.tokens_per_s_total / self.chips

    def to_dict(self) -> dict[str, Any]:
        """Plain data."""
        return {**dataclasses.asdict(self), "chips": self.chips,
                "tokens_per_s_per_chip": self.tokens_per_s_per_chip}


@dataclass(frozen=True)
class SearchResult:
    """What a search found: the configurations that meet the target, ranked, and its counts.

    ``points`` configurations were emulated (``computed`` of them by this run, the rest read
    from the store), ``pruned`` skipped by the bound, ``met`` meet every target; when none
    does, ``explanation`` says why in one line.
    """

    model: str
    target: str
    batch: int
    context: int
    store: str
    points: int
    computed: int
    pruned: int
    errors: int
    configurations: tuple[Configuration, ...]
    explanation: str = ""

    @property
    def met(self) -> int:
        """Configurations that meet the target."""
        return len(self.configurations)

    def to_dict(self) -> dict[str, Any]:
        """Plain data."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["configurations"] = [c.to_dict() for c in self.configurations]
        return {**data, "met": self.met}


def _bound_s(device: Device, model: Model, weights: str, chips: int) -> float:
    """Seconds a step takes at least: each chip reads its share of the weights a step uses
    (every active weight but the embedding table, of which only rows are looked up), at most
    at the device's fastest tier bandwidth, and what the on-chip tier cannot hold from the
    tiers beyond it. The format's base bits are taken (its per-role exceptions are wider),
    with :data:`BOUND_SAFETY` to spare; 0 for llama.cpp mixtures."""
    base = weight_formats(weights).base
    if base in MIXTURES:
        return 0.0
    read = model.active_params - (0 if model.tied_embeddings else model.vocab * model.hidden)
    per_chip = read * get_format(base).bits_per_element(4096) / 8 / chips
    fastest = max(t.bandwidth for t in device.tiers)
    off_chip = sum(t.bandwidth for t in device.tiers[1:])
    spilled = max(0.0, per_chip - device.tiers[0].capacity)
    return BOUND_SAFETY * max(per_chip / fastest, spilled / off_chip if off_chip else 0.0)


def _could_meet(targets: Sequence[Target], bound_s: float, batch: int) -> bool:
    best = {"ms_per_token": bound_s * 1e3,
            "tokens_per_s": 1 / bound_s if bound_s else math.inf,
            "tokens_per_s_total": batch / bound_s if bound_s else math.inf}
    return all(t.met(best) for t in targets)


def _systems(device: Device, model: Model, workload: Any) -> list[tuple[int, int]]:
    """``(tp, pp)`` to emulate: the fewest chips; when they pipeline, tensor parallel alone on
    at least as many; then tensor parallel on at least twice as many chips,
    :data:`TP_DOUBLINGS` times, within the link domain."""
    fewest = fewest_chips(device, model, workload, device.layout.policy)
    if not fewest.fits:
        return []
    limit = device.link.max_chips if device.link is not None else 1
    degrees = tp_degrees(model, limit, tp_ranks_per_chip(device))
    systems, chips = [(fewest.tp, fewest.pp)], fewest.chips
    if fewest.pp > 1:                   # tensor parallel alone on about as many chips
        chips = next((d for d in degrees if d >= chips), 0)
        systems += [(chips, 1)] if chips else []
    for _ in range(TP_DOUBLINGS if chips else 0):
        chips = next((d for d in degrees if d >= 2 * chips), 0)
        if not chips:
            break
        systems.append((chips, 1))
    return systems


def search(model: Model | str, target: str | Sequence[Target], *, batch: int = 1,
           context: int = 4096, devices: Sequence[str] | None = None,
           weights: Sequence[str] = WEIGHT_FORMATS, kv: Sequence[str] = KV_FORMATS,
           store: str | Path | None = None, jobs: int = 1,
           progress: bool = False) -> SearchResult:
    """The configurations of ``model`` that meet ``target``, ranked by cost per million tokens.

    Parameters
    ----------
    model : catalog name or file.
    target : ``"ms_per_token<=20"`` and the like (:func:`parse_target`), or Targets.
    batch, context : the decode workload.
    devices : device names or files (default: the catalog).
    weights, kv : formats to try.
    store : results store of the study (resumable; ``None``: a temporary one).
    """
    targets = parse_target(target) if isinstance(target, str) else tuple(target)
    mod = model_from(model)
    names = list(devices) if devices else device_names()
    points, pruned, bounds = [], 0, []
    for name in names:
        dev = device_from(name)
        widest = max(kv, key=lambda k: get_format(k).bits_per_element(4096))
        for w in weights:
            systems = _systems(dev, mod, decode_from(batch=batch, context=context, weights=w,
                                                     kv=widest))
            for k in kv:
                for tp, pp in systems:
                    bound = _bound_s(dev, mod, w, tp * pp)
                    bounds.append(bound)
                    if not _could_meet(targets, bound, batch):
                        pruned += 1
                        continue
                    points += grid(device=name, model=mod.name if isinstance(model, Model)
                                   else model, batch=batch, context=context, weights=w, kv=k,
                                   tp=tp, pp=pp)
    text = ",".join(str(t) for t in targets)
    with tempfile.TemporaryDirectory() as scratch:
        path = str(store) if store is not None else str(Path(scratch) / "search.sqlite")
        result = sweep(points, path, jobs=jobs, progress=progress,
                       name=f"search {mod.name} {text}")
        with Store(path) as held:
            keys = {p.key for p in points}
            rows = [r for r in held.rows() if r["key"] in keys]
    found, closest = [], None
    errors = 0
    for row in rows:
        if row["figures"] is None:
            errors += 1
            continue
        config = _configuration(row, device_from(row["inputs"]["device"]))
        figures = {"ms_per_token": config.time_per_token_s * 1e3,
                   "tokens_per_s": config.tokens_per_s,
                   "tokens_per_s_total": config.tokens_per_s_total}
        if all(t.met(figures) for t in targets):
            found.append(config)
        elif closest is None or _miss(targets, figures) < closest[0]:
            closest = (_miss(targets, figures), config)
    ranked = _rank(_pareto(found))
    explanation = "" if ranked else _explain(text, len(rows), pruned, closest)
    return SearchResult(model=mod.name, target=text, batch=batch, context=context,
                        store=str(store) if store is not None else "",
                        points=len(points), computed=result.computed, pruned=pruned,
                        errors=errors, configurations=tuple(ranked), explanation=explanation)


def _configuration(row: dict[str, Any], dev: Device) -> Configuration:
    workload, figures = row["inputs"]["workload"], row["figures"]
    chips = workload["tp"] * workload["pp"]
    price = dev.usd_per_chip_hour
    return Configuration(
        device=row["inputs"]["device"], tp=workload["tp"], pp=workload["pp"],
        weights=workload["weights"], kv=workload["kv"], policy=figures["policy"],
        time_per_token_s=figures["time_per_token_s"], tokens_per_s=figures["tokens_per_s"],
        tokens_per_s_total=figures["tokens_per_s_total"], bottleneck=figures["bottleneck"],
        usd_per_million_tokens=(usd_per_million_tokens(price, chips, figures["tokens_per_s_total"])
                                if price else None))


def _miss(targets: Sequence[Target], figures: dict[str, float]) -> float:
    """How far a point misses its targets: the largest ratio by which one is missed."""
    return max((figures[t.metric] / t.value if t.op == "<=" else t.value / figures[t.metric])
               for t in targets)


def _pareto(configs: list[Configuration]) -> list[Configuration]:
    """Mark the configurations no other beats on both latency and throughput per chip."""
    def dominated(c: Configuration) -> bool:
        return any(o.time_per_token_s <= c.time_per_token_s
                   and o.tokens_per_s_per_chip >= c.tokens_per_s_per_chip
                   and (o.time_per_token_s < c.time_per_token_s
                        or o.tokens_per_s_per_chip > c.tokens_per_s_per_chip)
                   for o in configs)
    return [dataclasses.replace(c, pareto=not dominated(c)) for c in configs]


def _rank(configs: list[Configuration]) -> list[Configuration]:
    """Cheapest per million tokens first; unpriced ones after, fewest chips first."""
    return sorted(configs, key=lambda c: (c.usd_per_million_tokens is None,
                                          c.usd_per_million_tokens or c.chips,
                                          c.time_per_token_s, c.device, c.weights, c.kv))


def _explain(text: str, emulated: int, pruned: int,
             closest: tuple[float, Configuration] | None) -> str:
    line = f"no configuration meets {text}: {emulated} emulated, {pruned} ruled out by the bound"
    if closest is not None:
        c = closest[1]
        line += (f"; the closest, {c.device} {c.chips} chip(s) (tp {c.tp} x pp {c.pp}) "
                 f"{c.weights}/{c.kv}, gives {c.time_per_token_s * 1e3:.3g} ms per token and "
                 f"{c.tokens_per_s_total:.4g} tokens/s in total")
    return line
