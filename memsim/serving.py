"""Serving: the steady state of continuous batching, built from emulated steps.

``(device, model, input_tokens I, output_tokens O, concurrency C)`` → :class:`Serving`: the
steps a serving engine runs once requests enter and leave at the same rate, each step emulated
by the walker (:func:`memsim.emulate`), and what a user sees: output tokens/s, inter-token
latency, a time to first token.

Example: ``memsim.serve("h100-sxm", "llama-3-70b", input_tokens=5000, output_tokens=500,
concurrency=50, token_budget=8192, weights="fp8-e4m3", kv="fp8-e4m3", tp=2)``.

The derivation (a closed loop of ``C`` clients, each sending its next request when the last
one ends, as AIPerf/genai-perf concurrency runs and offline ``trtllm-bench`` runs do):

- The engine holds ``N = min(C, max_batch, the sequences whose KV cache fits at I + O tokens)``
  requests; the others queue outside it.
- A request spends ``s`` steps on its prompt (the last one samples its first token) and then
  ``O - 1`` decode steps. Little's law over the engine: ``N = lam x (s + O - 1)`` with ``lam``
  requests finishing (and arriving) per step. So each step decodes ``lam x (O - 1)`` sequences,
  carries ``lam x I`` prompt tokens and emits ``lam x O`` output tokens. With one step per prompt
  (``s = 1``): ``lam = N / O``, ``N`` output tokens and ``N x I / O`` prompt tokens per step.
- ``mixed`` scheduling (vLLM and SGLang chunked prefill, TensorRT-LLM in-flight batching with
  chunked context; the engines schedule the running decodes first and fill the step's token
  budget, ``max_num_batched_tokens`` / ``max_num_tokens``, with prompt chunks): a prompt takes
  ``k = ceil(I / (budget - (N - 1)))`` chunks. While ``k x (N - 1) <= O - 1`` prompts do not
  overlap: of every ``1 / lam`` steps, ``k`` carry one request's chunks (``N - 1`` decodes and a
  chunk at its real position in the prompt) and the rest decode ``N`` sequences. Otherwise
  every step carries chunks: ``lam = min(N / (O - 1 + k), budget / (O - 1 + I))`` (the second
  when the budget binds and prompts wait), and the step is ``lam x (O - 1)`` decodes and one
  chunk of ``lam x I`` tokens at the prompt's mean position (one sequence's causal attention:
  when it holds several whole prompts its attention is over-counted, see ``limits``).
- ``prefill-first`` scheduling (TGI's continuous batching, Neuron's included): arriving prompts
  are prefilled in a step of their own (:class:`memsim.Prefill`, ``n`` at a time) while the
  decodes wait; then ``n x (O - 1) / N`` decode steps of ``N`` sequences follow.

The inter-token latency is the mean over decode tokens of their step's time; output tokens/s is
``lam x O`` over the mean step time. The time to first token counts the steps from admission to
the first token and, when ``C > N``, the queue ahead (Little's law again: ``(C - N) / lam``
steps); it leaves out the step in flight when a request arrives and the HTTP front end.
Decoding sequences sit at the mean context of a request's life, ``I + O / 2``.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any

from memsim.capacity import max_batch as capacity_max_batch
from memsim.device import Device
from memsim.emulate import emulate, resolve
from memsim.errors import CapacityError, ConfigError
from memsim.model import Model
from memsim.plan import plan_system
from memsim.workload import Decode, Prefill

SCHEDULING = ("mixed", "prefill-first")
MAX_CHUNK_STEPS = 16      # chunk positions emulated per prompt; more chunks share positions


def _count(value: Any, field: str, minimum: int, why: str = "") -> int:
    """An integer field of the request (numpy's too), at least ``minimum`` (``why``: the
    reason, when the minimum is not plain)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ConfigError(f"expected an integer >= {minimum}, got {value!r}{why}", field=field)
    return int(value)


@dataclass(frozen=True)
class ServingStep:
    """One kind of step in the steady state.

    Attributes
    ----------
    kind : ``decode``, ``chunk`` (decodes with a prompt chunk) or ``prefill`` (prompts alone).
    share : fraction of all steps that are of this kind.
    decode_sequences : sequences decoding in the step (each gets one token).
    prompt_tokens : prompt tokens the step computes (chunk or prefill).
    prompt_context : prompt tokens already cached before the chunk (its position).
    time_s : the emulated step time, s.
    bottleneck : what bound the step (a tier, ``compute``, ``link``, ...).
    """

    kind: str
    share: float
    decode_sequences: int
    prompt_tokens: int
    prompt_context: int
    time_s: float
    bottleneck: str


@dataclass(frozen=True)
class Serving:
    """The steady state of continuous batching, and what a user sees.

    Attributes
    ----------
    input_tokens, output_tokens, concurrency, token_budget, scheduling : the request.
    live_sequences : requests inside the engine (``N``).
    requests_per_step : requests finishing per step (``lam``).
    decode_sequences_per_step, prompt_tokens_per_step, output_tokens_per_step : means per step.
    prompt_steps : steps a request spends on its prompt, admission to first token (``s``).
    steps : the kinds of step and their shares.
    step_time_s : mean step time, s.
    inter_token_latency_s : mean time between two tokens of a decoding sequence, s.
    output_tokens_per_s : output tokens per second of the whole system.
    time_to_first_token_s : admission queue plus prompt steps, s (see the module docstring).
    bottleneck : what bound the steps that took most of the time.
    limits : what the emulated steps approximate, in words ("" when nothing).
    """

    device: str
    model: str
    input_tokens: int
    output_tokens: int
    concurrency: int
    token_budget: int | None
    scheduling: str
    live_sequences: int
    requests_per_step: float
    decode_sequences_per_step: float
    prompt_tokens_per_step: float
    output_tokens_per_step: float
    prompt_steps: float
    steps: tuple[ServingStep, ...]
    step_time_s: float
    inter_token_latency_s: float
    output_tokens_per_s: float
    time_to_first_token_s: float
    bottleneck: str
    limits: str = ""

    @property
    def tokens_per_s_per_user(self) -> float:
        """Tokens per second one user sees after the first token: 1 / inter-token latency."""
        return 1.0 / self.inter_token_latency_s

    def to_dict(self) -> dict[str, Any]:
        """Plain data."""
        return {**dataclasses.asdict(self), "tokens_per_s_per_user": self.tokens_per_s_per_user}


def serve(device: Device | str, model: Model | str, *, input_tokens: int, output_tokens: int,
          concurrency: int, token_budget: int | None = None, max_batch: int | None = None,
          scheduling: str = "mixed", **fields: Any) -> Serving:
    """The steady state of ``concurrency`` clients each sending requests of ``input_tokens``
    prompt and ``output_tokens`` output tokens (see the module docstring).

    Parameters
    ----------
    device, model : catalog names, files or loaded objects.
    input_tokens, output_tokens : per request (I >= 0, O >= 2).
    concurrency : clients, each with one request in flight.
    token_budget : tokens one step may compute (vLLM ``max_num_batched_tokens``, TensorRT-LLM
        ``max_num_tokens``); ``None``: no limit, a prompt goes whole into one step. Only
        ``mixed`` scheduling chunks prompts; ``prefill-first`` prefills them whole.
    max_batch : sequences the engine schedules at once (``max_num_seqs``, ``max_batch_size``).
    scheduling : ``mixed`` (prompt chunks ride in decode steps) or ``prefill-first``.
    fields : :class:`memsim.Decode` fields of every step (``weights``, ``kv``, ``tp``,
        ``runtime``, ``policy``, ...); ``batch``, ``context`` and the prompt fields are set here.
    """
    inputs = _count(input_tokens, "input_tokens", 0)
    outputs = _count(output_tokens, "output_tokens", 2, why=(
        ": with one output token no token follows the first, so there is no inter-token "
        "latency and no decode step; `memsim run --prefill TOKENS` times the prompt"))
    clients = _count(concurrency, "concurrency", 1)
    budget = None if token_budget is None else _count(token_budget, "token_budget", 1)
    cap = clients if max_batch is None else min(clients, _count(max_batch, "max_batch", 1))
    if scheduling not in SCHEDULING:
        raise ConfigError(f"expected one of {', '.join(SCHEDULING)}, got {scheduling!r}",
                          field="scheduling")
    taken = {"batch", "context", "steps", "prefill_chunk", "prefill_context", "prefill",
             "new_tokens"} & set(fields)
    if taken:
        raise ConfigError(f"serve sets {', '.join(sorted(taken))} itself", field=sorted(taken)[0])
    unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(Decode)})
    if unknown:
        raise ConfigError(f"expected Decode fields (weights, kv, tp, runtime, ...), got "
                          f"{', '.join(unknown)}", field=unknown[0])
    try:
        template = Decode(batch=1, context=inputs + outputs // 2, **fields)
        dev, mod = resolve(device, model, template)
        live = _live_sequences(dev, mod, template, cap, inputs + outputs)
    except ConfigError as exc:         # the steps' context is the requests' tokens
        if exc.field != "context" or isinstance(exc, CapacityError):
            raise
        raise ConfigError(f"{exc.reason} (a request's context is its input_tokens and "
                          "output_tokens)", file=exc.file, field="input_tokens") from None
    if budget is not None and scheduling == "mixed" and budget < live:
        raise ConfigError(f"a step must hold the {live} decoding sequences: token_budget "
                          f"{budget} is below them", field="token_budget")
    plan = (_mixed(live, inputs, outputs, budget) if scheduling == "mixed"
            else _prefill_first(live, inputs, outputs))
    return _steady_state(dev, mod, template, plan, clients=clients, live=live, inputs=inputs,
                         outputs=outputs, budget=budget, scheduling=scheduling)


def _live_sequences(dev: Device, mod: Model, template: Decode, cap: int, longest: int) -> int:
    """``cap``, or fewer when their KV caches at ``longest`` tokens do not fit."""
    trial = dataclasses.replace(template, batch=cap, context=longest, steps=1)
    try:
        plan_system(dev, mod, trial)
        return cap
    except CapacityError:
        fits = capacity_max_batch(dev, mod, trial).batch
    if fits < 1:
        raise ConfigError(f"not one sequence of {longest} tokens fits {dev.name}",
                          field="input_tokens")
    return min(cap, fits)


@dataclass(frozen=True)
class _Kind:
    """A step kind before emulation."""

    kind: str
    share: float                  # of all steps
    decodes: int                  # sequences that get a token
    prompt: int                   # prompt tokens computed
    position: int                 # prompt tokens cached before them
    waiting: int                  # decoding sequences whose next token waits for this step
    prompts: int = 1              # requests whose prompt tokens these are
    count: int = 1                # steps of one prompt's life this kind stands for


@dataclass(frozen=True)
class _Plan:
    """The steady state before emulation."""

    rate: float                   # requests per step
    prompt_steps: float           # steps from admission to first token
    one_at_a_time: bool           # each prompt's steps are its own (their times add up)
    kinds: tuple[_Kind, ...]
    limits: str = ""


def _decode_only(live: int, outputs: int) -> _Plan:
    """No prompts: every step decodes all sequences; the first token takes one step."""
    return _Plan(live / outputs, 1.0, False, (_Kind("decode", 1.0, live, 0, 0, live),))


def _mixed(live: int, inputs: int, outputs: int, budget: int | None) -> _Plan:
    if inputs == 0:
        return _decode_only(live, outputs)
    room = inputs if budget is None else budget - (live - 1)
    chunks = -(-inputs // room)
    rate = live / (outputs - 1 + chunks)
    if chunks * (live - 1) <= outputs - 1:          # prompts one at a time
        kinds = [_Kind("chunk", rate * len(group), live - 1, min(room, inputs - j * room),
                       j * room, live - 1, count=len(group)) for j, group in _chunk_groups(chunks)]
        if 1 - rate * chunks > 0:
            kinds.append(_Kind("decode", 1 - rate * chunks, live, 0, 0, live))
        limits = (f"a prompt's {chunks} chunks are emulated at {MAX_CHUNK_STEPS} positions"
                  if chunks > MAX_CHUNK_STEPS else "")
        return _Plan(rate, float(chunks), True, tuple(kinds), limits)
    if budget is not None:
        rate = min(rate, budget / (outputs - 1 + inputs))
    decodes = max(1, round(rate * (outputs - 1)))
    prompt = max(1, round(rate * inputs))
    limits = ""
    if prompt > inputs:
        limits = (f"the step's {prompt} prompt tokens hold {prompt / inputs:.1f} prompts but are "
                  "emulated as one sequence's chunk, whose causal attention spans all of them")
    kind = _Kind("chunk", 1.0, decodes, prompt, max(0, (inputs - prompt) // 2), decodes)
    return _Plan(rate, live / rate - (outputs - 1), False, (kind,), limits)


def _chunk_groups(chunks: int) -> list[tuple[int, range]]:
    """The chunks of one prompt, each alone, or (past ``MAX_CHUNK_STEPS``) the full chunks in
    equal runs, each emulated at its middle chunk's position (a chunk's time grows about
    linearly with its position), and the last, partial chunk alone."""
    if chunks <= MAX_CHUNK_STEPS:
        return [(j, range(j, j + 1)) for j in range(chunks)]
    full = chunks - 1
    runs = MAX_CHUNK_STEPS - 1
    edges = [full * i // runs for i in range(runs + 1)]
    groups = [((lo + hi - 1) // 2, range(lo, hi)) for lo, hi in zip(edges, edges[1:], strict=False)]
    return groups + [(full, range(full, chunks))]


def _prefill_first(live: int, inputs: int, outputs: int) -> _Plan:
    if inputs == 0:
        return _decode_only(live, outputs)
    together = min(live, math.ceil(live / max(1, outputs - 1)))   # prompts per prefill step
    decode_steps = together * (outputs - 1) / live     # decode steps per prefill step
    cycle = 1.0 + decode_steps
    kinds = [_Kind("prefill", 1.0 / cycle, 0, together * inputs, 0, live - together,
                   together)]
    if decode_steps > 0:
        kinds.append(_Kind("decode", decode_steps / cycle, live, 0, 0, live))
    return _Plan(together / cycle, 1.0, True, tuple(kinds))


def _emulate_step(dev: Device, mod: Model, template: Decode, kind: _Kind,
                  context: int) -> tuple[float, str]:
    """One step kind through the walker: the warm step where the plan allows it (a decode
    step's context and a chunk's cache grow by one step between the two emulated steps)."""
    if kind.kind == "prefill" or (kind.kind == "chunk" and kind.decodes == 0):
        fields = {f.name: getattr(template, f.name) for f in dataclasses.fields(Prefill)
                  if f.name not in ("batch", "prompt", "cached")}
        report = emulate(dev, mod, Prefill(batch=kind.prompts, prompt=kind.prompt // kind.prompts,
                                           cached=kind.position, **fields))
        return report.time_per_step, report.bottleneck
    step = dict(batch=kind.decodes, context=max(0, context - 1))
    if kind.kind == "chunk" and kind.position >= kind.prompt:
        step.update(prefill_chunk=kind.prompt, prefill_context=kind.position - kind.prompt)
    elif kind.kind == "chunk":         # a first chunk: one (cold) step puts it at its place
        step.update(context=context, steps=1, prefill_chunk=kind.prompt,
                    prefill_context=kind.position)
    report = emulate(dev, mod, dataclasses.replace(template, **step))
    return report.time_per_step, report.bottleneck


def _steady_state(dev: Device, mod: Model, template: Decode, plan: _Plan, *, clients: int,
                  live: int, inputs: int, outputs: int, budget: int | None,
                  scheduling: str) -> Serving:
    context = inputs + outputs // 2
    times = [_emulate_step(dev, mod, template, kind, context) for kind in plan.kinds]
    steps = tuple(ServingStep(k.kind, k.share, k.decodes, k.prompt, k.position, t, bound)
                  for k, (t, bound) in zip(plan.kinds, times))
    step_s = sum(s.share * s.time_s for s in steps)
    tokens = sum(k.share * k.decodes for k in plan.kinds)
    waited = sum(k.share * k.waiting * s.time_s for k, s in zip(plan.kinds, steps))
    prompt_s = (sum(k.count * s.time_s for k, s in zip(plan.kinds, steps) if k.kind != "decode")
                if plan.one_at_a_time else plan.prompt_steps * step_s)
    by_time: dict[str, float] = {}
    for s in steps:
        by_time[s.bottleneck] = by_time.get(s.bottleneck, 0.0) + s.share * s.time_s
    return Serving(
        device=dev.name, model=mod.name, input_tokens=inputs, output_tokens=outputs,
        concurrency=clients, token_budget=budget, scheduling=scheduling, live_sequences=live,
        requests_per_step=plan.rate, decode_sequences_per_step=tokens,
        prompt_tokens_per_step=plan.rate * inputs, output_tokens_per_step=plan.rate * outputs,
        prompt_steps=plan.prompt_steps, steps=steps, step_time_s=step_s,
        inter_token_latency_s=waited / tokens,
        output_tokens_per_s=plan.rate * outputs / step_s,
        time_to_first_token_s=prompt_s + (clients - live) / plan.rate * step_s,
        bottleneck=max(by_time, key=by_time.__getitem__), limits=plan.limits)
