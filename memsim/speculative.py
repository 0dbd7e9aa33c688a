"""Speculative decoding, emulated: draft, verify, accept.

One iteration is ``gamma`` sequential decode steps of a draft model (or nothing, for n-gram
drafting; or the target's own draft heads, Medusa style) and one verification step of the target
that processes every drafted token of every sequence at once (M = batch x (gamma + 1) rows, the
weights read once). A prefix of the drafted tokens is accepted, plus one token from the
verification. The target's KV rows of the rejected drafts were written and are rolled back: they
are counted as wasted writes.

The draft shares the target's chip (its memory and on-chip tier: each evicts the other's tiles)
unless it is given a device of its own. The emulated iterations keep the KV cache at
``context + i (gamma + 1)`` tokens in iteration ``i`` (every draft accepted), an over-count of
at most ``gamma`` tokens per iteration in attention.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memsim.device import Device
from memsim.emulate import Residency, SystemRun, emulate, offset_tensors, resolve
from memsim.errors import CapacityError, ConfigError
from memsim.formats import get_format
from memsim.kernels import sampling as mc
from memsim.inputs import decode_from, model_from
from memsim.limits import MAX_GAMMA, check_samples
from memsim.model import Model
from memsim.plan import SystemPlan, kv_row_bits, plan_system
from memsim.report import StepSummary
from memsim.units import format_quantity
from memsim.workload import Decode

METHODS = ("draft", "heads", "ngram")
MAX_AUTO_GAMMA = 12


@dataclass(frozen=True)
class Acceptance:
    """Probability that each drafted position is accepted, given all before it were."""

    rates: tuple[float, ...]

    @classmethod
    def parse(cls, value: float | Sequence[float], depth: int) -> Acceptance:
        """A constant rate for every position, or one rate per position (``depth`` of them)."""
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            rates: tuple[float, ...] = (float(value),) * depth
        else:
            try:
                rates = tuple(float(v) for v in value)
            except (TypeError, ValueError):
                raise ConfigError(f"expected a rate in [0, 1] or a list of them, got {value!r}",
                                  field="acceptance") from None
            if len(rates) != depth:
                raise ConfigError(f"expected {depth} per-position rates (one per drafted "
                                  f"token), got {len(rates)}", field="acceptance")
        if not all(0.0 <= r <= 1.0 for r in rates):
            raise ConfigError(f"acceptance rates lie in [0, 1], got {value!r}", field="acceptance")
        return cls(rates)

    @property
    def distribution(self) -> tuple[float, ...]:
        """P(an iteration yields t tokens) for t = 1 .. depth + 1."""
        probs = []
        reach = 1.0
        for rate in self.rates:
            probs.append(reach * (1.0 - rate))
            reach *= rate
        probs.append(reach)
        return tuple(probs)

    @property
    def expected_tokens(self) -> float:
        """Mean tokens per sequence per iteration: ``sum_t prod_{j<t} rate_j`` (for a constant
        rate ``a``: ``(1 - a^(gamma+1)) / (1 - a)``)."""
        return sum(t * p for t, p in enumerate(self.distribution, start=1))


def closed_form_tokens(rate: float, gamma: int) -> float:
    """E[tokens per iteration] for a constant acceptance rate (Leviathan et al., 2023)."""
    return gamma + 1.0 if rate == 1.0 else (1.0 - rate ** (gamma + 1)) / (1.0 - rate)


@dataclass(frozen=True)
class MonteCarlo:
    """Sampled tokens per sequence-iteration: the histogram, its mean and standard error."""

    draws: int
    seed: int
    counts: tuple[int, ...]          # counts[t - 1]: draws that yielded t tokens

    @property
    def mean(self) -> float:
        """Sample mean of tokens per iteration."""
        return sum(t * c for t, c in enumerate(self.counts, start=1)) / self.draws

    @property
    def standard_error(self) -> float:
        """Standard error of the mean."""
        mean = self.mean
        var = sum(c * (t - mean) ** 2 for t, c in enumerate(self.counts, start=1))
        return math.sqrt(var / max(self.draws - 1, 1) / self.draws)


def sample_tokens(acceptance: Acceptance, draws: int, seed: int = 0) -> MonteCarlo:
    """Seeded Monte Carlo (Numba): per-sequence Bernoulli draws, in order, until a rejection."""
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 1:
        raise ConfigError(f"expected at least one Monte Carlo draw, got {draws!r}",
                          field="samples")
    check_samples(draws)
    hist = mc.tokens_histogram(np.array(acceptance.rates, dtype=np.float64), draws, seed)
    return MonteCarlo(draws=draws, seed=seed, counts=tuple(int(c) for c in hist[1:]))


@dataclass(frozen=True)
class SpecReport:
    """What one warm iteration of speculative decoding costs, per accepted token."""

    device: str
    target: str
    draft: str | None
    method: str
    gamma: int                       # drafted tokens (tree nodes for draft heads)
    batch: int
    acceptance: tuple[float, ...]    # per drafted position (per tree depth for heads)
    expected_tokens: float           # per sequence per iteration
    distribution: tuple[float, ...]  # P(1 .. depth + 1 tokens)
    monte_carlo: MonteCarlo | None
    draft_time_s: float              # the warm iteration's draft steps
    verify_time_s: float
    transfer_time_s: float           # drafted token ids to a separate target device
    plain_time_per_token_s: float
    target_bytes: dict[str, int]     # the warm verification step, whole system
    target_weight_bytes: dict[str, int]   # of which weights
    target_kv_written: int           # KV rows the verification appended (every drafted token)
    draft_bytes: dict[str, int]      # the warm iteration's draft steps
    wasted_kv_bytes: float           # rolled back per iteration (expected), target and draft
    energy_j: float                  # the warm iteration (see _iteration_energy)
    clock_hz: float
    verify_bound_by: str
    plain_bound_by: str
    draft_bound_by: str
    verify_time_by_bound: dict[str, float] = field(default_factory=dict)
    gamma_scan: tuple[tuple[int, float], ...] = ()
    bookkeeping_time_s: float = 0.0  # the runtime's host work per draft step and per iteration
    runtime: str = ""

    @property
    def tokens_per_iteration(self) -> float:
        """Tokens the whole batch gains per iteration (expected)."""
        return self.expected_tokens * self.batch

    @property
    def iteration_time_s(self) -> float:
        """Draft steps, hand-off, verification and the runtime's bookkeeping, one after the
        other."""
        return (self.draft_time_s + self.transfer_time_s + self.verify_time_s
                + self.bookkeeping_time_s)

    @property
    def time_per_token(self) -> float:
        """Seconds between two tokens of one sequence (expected)."""
        return self.iteration_time_s / self.expected_tokens

    @property
    def tokens_per_s(self) -> float:
        """Tokens per second of one sequence."""
        return 1.0 / self.time_per_token

    @property
    def tokens_per_s_total(self) -> float:
        """Tokens per second of the batch."""
        return self.batch / self.time_per_token

    @property
    def speedup(self) -> float:
        """Plain decode's time per token over speculative decoding's."""
        return self.plain_time_per_token_s / self.time_per_token

    @property
    def why(self) -> str:
        """One sentence on whether and why speculation pays here."""
        ratio = self.verify_time_s / (self.plain_time_per_token_s)
        base = (f"a verification of {self.gamma + 1} tokens per sequence costs {ratio:.2f}x a "
                f"plain step ({self.verify_bound_by}-bound; plain decode is "
                f"{self.plain_bound_by}-bound) and yields {self.expected_tokens:.2f} tokens")
        if self.draft_time_s:
            base += (f", after drafting for {self.draft_time_s / self.plain_time_per_token_s:.2f}"
                     " plain steps")
        return base + (": speculation pays" if self.speedup > 1 else ": speculation does not pay")

    @property
    def cycles_per_token(self) -> float:
        """Device cycles per accepted token of one sequence."""
        return self.time_per_token * self.clock_hz

    @property
    def energy_per_token(self) -> float:
        """Joules per accepted token."""
        return self.energy_j / self.tokens_per_iteration

    def per_token(self, figures: dict[str, int]) -> dict[str, float]:
        """Bytes per accepted token of a per-iteration figure."""
        return {tier: value / self.tokens_per_iteration for tier, value in figures.items()}

    def to_dict(self) -> dict[str, Any]:
        """Plain data, with the per-token figures."""
        data = dataclasses.asdict(self)
        data.update(
            iteration_time_s=self.iteration_time_s, time_per_token_s=self.time_per_token,
            tokens_per_s=self.tokens_per_s, tokens_per_s_total=self.tokens_per_s_total,
            speedup=self.speedup, why=self.why, cycles_per_token=self.cycles_per_token,
            energy_per_token_j=self.energy_per_token,
            target_bytes_per_token=self.per_token(self.target_bytes),
            draft_bytes_per_token=self.per_token(self.draft_bytes),
            wasted_kv_bytes_per_token=self.wasted_kv_bytes / self.tokens_per_iteration,
            monte_carlo=(None if self.monte_carlo is None else
                         {"draws": self.monte_carlo.draws, "seed": self.monte_carlo.seed,
                          "counts": list(self.monte_carlo.counts),
                          "mean": self.monte_carlo.mean,
                          "standard_error": self.monte_carlo.standard_error}),
        )
        return data

    def table(self) -> str:
        """A readable summary."""
        drafter = {"draft": f"draft {self.draft}", "heads": "draft heads",
                   "ngram": "n-gram lookup"}[self.method]
        lines = [
            f"{self.target} on {self.device} with {drafter}: gamma {self.gamma}, batch "
            f"{self.batch}, acceptance {', '.join(f'{a:g}' for a in self.acceptance)}",
            f"  tokens per iteration  {self.expected_tokens:.4f} per sequence (closed form)",
        ]
        if self.monte_carlo is not None:
            lines.append(f"  Monte Carlo           {self.monte_carlo.mean:.4f} +- "
                         f"{self.monte_carlo.standard_error:.4f} over {self.monte_carlo.draws:,} "
                         f"draws (seed {self.monte_carlo.seed})")
        lines += [
            "  P(tokens = 1..)       " + ", ".join(f"{p:.3f}" for p in self.distribution),
            f"  iteration             {format_quantity(self.iteration_time_s, 'time')} = draft "
            f"{format_quantity(self.draft_time_s, 'time')} ({self.draft_bound_by}) + verify "
            f"{format_quantity(self.verify_time_s, 'time')} ({self.verify_bound_by})"
            + (f" + hand-off {format_quantity(self.transfer_time_s, 'time')}"
               if self.transfer_time_s else "")
            + (f" + {self.runtime} bookkeeping "
               f"{format_quantity(self.bookkeeping_time_s, 'time')}"
               if self.bookkeeping_time_s else ""),
            f"  time per token        {format_quantity(self.time_per_token, 'time')} "
            f"({self.tokens_per_s:.1f} tokens/s per sequence, {self.tokens_per_s_total:.1f} in "
            f"aggregate; {self.cycles_per_token:,.0f} cycles)",
            f"  plain decode          {format_quantity(self.plain_time_per_token_s, 'time')} "
            f"per token ({self.plain_bound_by})",
            f"  speedup               {self.speedup:.3f}x: {self.why}",
            f"  energy per token      {format_quantity(self.energy_per_token, 'energy')}",
            "  bytes per accepted token:",
        ]
        target, draft = self.per_token(self.target_bytes), self.per_token(self.draft_bytes)
        for tier in self.target_bytes:
            lines.append(f"    {tier:<6} target {target[tier]:>18,.0f}   draft "
                         f"{draft.get(tier, 0.0):>16,.0f}")
        lines.append(f"    wasted KV writes (rolled back) "
                     f"{self.wasted_kv_bytes / self.tokens_per_iteration:,.0f}")
        if self.gamma_scan:
            lines.append("  gamma scan (speedup): " + ", ".join(f"{g}: {s:.3f}"
                                                             for g, s in self.gamma_scan))
        return "\n".join(lines)


def kv_bytes_per_token(model: Model, kv_format: str) -> float:
    """Bytes one token's K and V (MLA: its latent row) take in every layer and KV head (no block
    rounding)."""
    return model.layers * model.kv_heads * model.kv_parts * kv_row_bits(model, get_format(kv_format)) / 8


def tree_nodes(branching: Sequence[int]) -> int:
    """Nodes of a candidate tree with ``branching[d]`` children per node at depth ``d``."""
    nodes, width = 0, 1
    for b in branching:
        width *= b
        nodes += width
    return nodes


def speculative(device: Device | str, target: Model | str, draft: Model | str | None = None,
                gamma: int | str = 4, acceptance: float | Sequence[float] = 0.8, *,
                method: str = "draft", tree: Sequence[int] | None = None,
                draft_device: Device | str | None = None, draft_weights: str | None = None,
                samples: int = 0, iterations: int = 2, **fields: Any) -> SpecReport:
    """Emulate speculative decoding of ``target`` on ``device``.

    Parameters
    ----------
    draft : the draft model (``method="draft"``); it runs on ``draft_device`` if given, else on
        the target's first chip, sharing its memory and on-chip tier.
    gamma : drafted tokens per iteration, or ``"auto"``: the gamma (1 .. 12) with the best
        speedup for this acceptance.
    acceptance : a constant rate, or one rate per drafted position (per tree depth for heads).
    method : ``draft``, ``heads`` (Medusa-style heads on the target, a candidate ``tree`` of
        branching factors per depth, e.g. ``(2, 2, 1)``, verified in one pass), or ``ngram``
        (prompt lookup: no draft traffic on the device).
    samples : Monte Carlo draws of the accepted tokens (0: closed form only).
    fields : the target's Decode fields (``batch``, ``context``, ``weights``, ``tp``, ...).
    """
    if method not in METHODS:
        raise ConfigError(f"expected one of {', '.join(METHODS)}, got {method!r}", field="method")
    if tree is not None and method != "heads":
        raise ConfigError(f"a candidate tree is the heads method's; {method} drafts one chain "
                          "(gamma tokens)", field="tree")
    given = [name for name, value in (("draft", draft), ("draft_device", draft_device),
                                      ("draft_weights", draft_weights)) if value is not None]
    if given and method != "draft":
        raise ConfigError(f"the {method} method runs no draft model: {given[0]} would be "
                          "ignored", field=given[0])
    if gamma == "auto":
        return _best_gamma(device, target, draft, acceptance, method=method, tree=tree,
                           draft_device=draft_device, draft_weights=draft_weights,
                           samples=samples, iterations=iterations, **fields)
    if isinstance(gamma, bool) or not isinstance(gamma, int) or not 1 <= gamma <= MAX_GAMMA:
        raise ConfigError(f"expected an integer gamma from 1 to {MAX_GAMMA} or 'auto', got "
                          f"{gamma!r}", field="gamma")
    plain = decode_from(fields)
    dev, tgt = resolve(device, target, plain)
    if method == "heads":
        branching = tuple(tree) if tree else (1,) * gamma
        if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in branching):
            raise ConfigError(f"expected branching factors >= 1 per depth, got {tree!r}",
                              field="tree")
        rates = Acceptance.parse(acceptance, len(branching)).rates
        accept = Acceptance(tuple(1.0 - (1.0 - a) ** b for a, b in zip(rates, branching)))
        drafted = tree_nodes(branching)
        verify = dataclasses.replace(plain, new_tokens=drafted + 1, steps=iterations,
                                     draft_heads=len(branching))
    else:
        accept = Acceptance.parse(acceptance, gamma)
        drafted = gamma
        verify = dataclasses.replace(plain, new_tokens=gamma + 1, steps=iterations)
    baseline = emulate(dev, tgt, dataclasses.replace(plain, steps=max(2, plain.steps)))

    target_system = plan_system(dev, tgt, verify)
    draft_model = None
    draft_system = None
    if method == "draft":
        if draft is None:
            raise ConfigError("the draft method needs a draft model (--draft)", field="draft")
        draft_model = model_from(draft)
        own_device = resolve(draft_device, draft_model)[0] if draft_device is not None else None
        draft_workload = Decode(batch=plain.batch, context=plain.context,
                                weights=draft_weights or plain.weights, kv=plain.kv,
                                activations=plain.activations, steps=iterations * gamma,
                                seed=plain.seed, runtime=plain.runtime)
        draft_system = plan_system(own_device or dev, draft_model, draft_workload)
        if own_device is None:
            _check_shared_capacity(dev, target_system, draft_system)
            draft_system = _beside(dev, target_system, draft_model, draft_system)

    target_run, draft_steps = _run_iterations(target_system, draft_system, draft_device is None,
                                              gamma if method == "draft" else 0, iterations)
    warm = target_run.summaries[-1]
    warm_drafts = draft_steps[-1] if draft_steps else []
    draft_bytes = dict.fromkeys(warm.bytes_read, 0)
    for summary in warm_drafts:
        for tier, nbytes in summary.bytes_read.items():
            draft_bytes[tier] = draft_bytes.get(tier, 0) + nbytes
    transfer = 0.0
    if draft_device is not None and method == "draft":
        transfer = dev.host_link.latency_s + drafted * plain.batch * 4 / dev.host_link.bandwidth

    expected = accept.expected_tokens
    rejected = drafted + 1 - expected
    wasted = rejected * plain.batch * kv_bytes_per_token(tgt, plain.kv)
    if draft_model is not None:
        dist = accept.distribution           # the draft keeps min(accepted + 1, gamma) rows
        kept = sum(p * min(t, gamma) for t, p in enumerate(dist, start=1))
        wasted += (gamma - kept) * plain.batch * kv_bytes_per_token(draft_model, plain.kv)
    draft_time = sum(s.time_s for s in warm_drafts)
    bookkeeping = target_system.stages[0].runtime.speculative
    report = SpecReport(
        device=dev.name, target=tgt.name, draft=draft_model.name if draft_model else None,
        method=method, gamma=drafted, batch=plain.batch, acceptance=accept.rates,
        expected_tokens=expected, distribution=accept.distribution,
        monte_carlo=(sample_tokens(accept, samples, plain.seed) if samples else None),
        draft_time_s=draft_time, verify_time_s=warm.time_s, transfer_time_s=transfer,
        plain_time_per_token_s=baseline.time_per_token, target_bytes=dict(warm.bytes_read),
        target_weight_bytes=dict(warm.weight_bytes_read),
        target_kv_written=_kv_written(target_run),
        draft_bytes=draft_bytes, wasted_kv_bytes=wasted,
        energy_j=0.0, clock_hz=dev.clock_hz,        # set below, once the time is known
        verify_bound_by=max(warm.time_by_bound, key=warm.time_by_bound.__getitem__),
        plain_bound_by=baseline.bottleneck,
        draft_bound_by=_bound_of(warm_drafts),
        verify_time_by_bound=dict(warm.time_by_bound),
        bookkeeping_time_s=(bookkeeping.iteration_host_s
                            + len(warm_drafts) * bookkeeping.draft_step_host_s),
        runtime=target_system.stages[0].runtime.name,
    )
    own_draft = draft_system if draft_device is not None else None
    return dataclasses.replace(report, energy_j=_iteration_energy(
        report, [warm, *warm_drafts], target_system, own_draft))


def break_even_batch(device: Device | str, target: Model | str, draft: Model | str | None = None,
                     gamma: int = 4, acceptance: float | Sequence[float] = 0.7, *,
                     batches: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
                     **kwargs: Any) -> tuple[int | None, tuple[tuple[int, float], ...]]:
    """The largest batch of ``batches`` at which speculation still pays (speedup > 1), and the
    speedup at each batch tried: gains vanish once plain decode is no longer memory-bound.
    Batches that do not fit are left out of the scan. Returns ``(None, scan)`` when it pays at
    none."""
    scan = []
    for batch in batches:
        try:
            report = speculative(device, target, draft, gamma, acceptance, batch=batch, **kwargs)
        except CapacityError:
            break
        scan.append((batch, report.speedup))
    paying = [batch for batch, speedup in scan if speedup > 1.0]
    return (max(paying) if paying else None), tuple(scan)


def _iteration_energy(report: SpecReport, steps: list[StepSummary], target: SystemPlan,
                      own_draft: SystemPlan | None) -> float:
    """One iteration's energy, J: the dynamic energy of the bytes and operations of its
    ``steps`` (verification and drafts), plus every powered chip's static power once over the
    whole iteration time. The powered chips are the target's (idle while the draft runs, during
    the hand-off and the bookkeeping: still powered) and, when the draft has a device of its
    own (``own_draft``), that device's chips (idle while the target verifies). A draft on the
    target's first chip adds no chip. The steps' own static energy covers only their own time
    and chips, so it is left out."""
    dynamic = sum(step.energy_j - step.static_energy_j for step in steps)
    systems = [target] + ([own_draft] if own_draft is not None else [])
    watts = sum((system.device.idle_power_w or 0.0) * system.chips for system in systems)
    return dynamic + watts * report.iteration_time_s


def _kv_written(run: SystemRun) -> int:
    """Bytes the warm verification step's KV appends wrote, over the whole system."""
    report = run.report()
    return report.tp * sum(sum(row.bytes_written.values()) for row in report.ops
                           if row.name == "kv_append")


def _bound_of(summaries: list[StepSummary]) -> str:
    if not summaries:
        return "-"
    total: dict[str, float] = {}
    for summary in summaries:
        for label, seconds in summary.time_by_bound.items():
            total[label] = total.get(label, 0.0) + seconds
    return max(total, key=total.__getitem__)


def _beside(dev: Device, target: SystemPlan, draft_model: Model,
            draft: SystemPlan) -> SystemPlan:
    """The draft's plan on the chip it shares with the target's first stage: where the target
    pins weights on chip (a hybrid's pinned residency fills the on-chip tier), the draft pins
    in what the target leaves, not in the whole tier as if it ran alone."""
    first = target.stages[0]
    pinned = first.tensor_table.pinned_bytes()
    if pinned == 0:
        return draft
    tier = dev.tiers[0]
    left = tier.capacity - first.tensor_table.need().get(0, 0) - pinned
    return plan_system(dev.with_overrides({f"tiers.{tier.name}.capacity": f"{left} B"}),
                       draft_model, draft.workload)


def _check_shared_capacity(dev: Device, target: SystemPlan, draft: SystemPlan) -> None:
    """The draft and the target's first chip must fit together in every tier."""
    held = [plan.tensor_table.need() for plan in (target.stages[0], draft.stages[0])]
    for i, tier in enumerate(dev.tiers):
        need = held[0][i] + held[1][i]
        if need > tier.capacity:
            short = need - tier.capacity
            raise CapacityError(
                f"target {target.model.name} and draft {draft.model.name} together need "
                f"{need:,} B in tier {tier.name!r} of one chip but it holds {tier.capacity:,} B: "
                f"short by {short:,} B ({format_quantity(short, 'capacity')}); give the draft "
                "a device of its own (draft_device / --draft-device) or the target more chips",
                shortfall_bytes=short, file=dev.file, field=f"tiers.{tier.name}.capacity")


def _run_iterations(target: SystemPlan, draft: SystemPlan | None, shared: bool, gamma: int,
                    iterations: int) -> tuple[SystemRun, list[list[StepSummary]]]:
    """Alternate ``gamma`` draft steps and one verification step, ``iterations`` times."""
    residencies = None
    draft_run = None
    if draft is not None:
        if shared:
            plan = offset_tensors(draft.stages[0], target.stages[0].n_tensors)
            shared_tier = Residency.shared(target.stages[0], draft.stages[0])
            residencies = [shared_tier] + [Residency(p) for p in target.stages[1:]]
            draft_run = SystemRun(dataclasses.replace(draft, stages=(plan,)), [shared_tier])
        else:
            draft_run = SystemRun(draft)
    run = SystemRun(target, residencies)
    draft_steps: list[list[StepSummary]] = []
    for iteration in range(iterations):
        draft_steps.append([draft_run.step(iteration * gamma + j) for j in range(gamma)]
                           if draft_run else [])
        run.step(iteration)
    return run, draft_steps


def _best_gamma(device: Device | str, target: Model | str, draft: Model | str | None,
                acceptance: float | Sequence[float], **kwargs: Any) -> SpecReport:
    """Try gamma = 1 .. MAX_AUTO_GAMMA and keep the fastest (a list of rates fixes gamma)."""
    if not isinstance(acceptance, (int, float)):
        raise ConfigError("gamma 'auto' needs one constant acceptance rate", field="gamma")
    reports = [speculative(device, target, draft, g, acceptance, **kwargs)
               for g in range(1, MAX_AUTO_GAMMA + 1)]
    best = max(reports, key=lambda r: r.speedup)
    return dataclasses.replace(best, gamma_scan=tuple((r.gamma, r.speedup) for r in reports))
