"""What a run asks of a device: batch, context, formats, tiling, residency, parallelism,
placement, seed; a decode run (:class:`Decode`, which may carry a prompt chunk: a mixed serving
step) or a prompt's prefill (:class:`Prefill`, lowered to a one-step :class:`Decode`)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from memsim.checkpoints import usual_activations, weight_formats
from memsim.errors import ConfigError
from memsim.formats import get_format
from memsim.runtime import Runtime, runtime, runtime_names

RESIDENCY_POLICIES = ("auto", "lru", "pinned")
ACTIVATION_FORMATS = ("bf16", "fp16", "fp32", "fp8-e4m3", "fp8-e5m2", "fp8-e4m3-b128", "mxfp8",
                      "nvfp4", "int8")
INT64_MAX = 2**63 - 1
MAX_ZIPF_EXPONENT = 100.0
POLICY_CHOICES = ("auto", "hbm-centric", "sram-resident", "hybrid", "tiered", "weight-streaming")


def _positive_int(value: Any, field: str, *, minimum: int = 1,
                  maximum: int = INT64_MAX) -> int:
    """The value as a Python int when it is an integer (numpy's too) in [minimum, maximum]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"expected an integer >= {minimum}, got {value!r}", field=field)
    if not minimum <= int(value) <= maximum:
        raise ConfigError(f"expected an integer in [{minimum}, {maximum}], got {value!r}",
                          field=field)
    return int(value)


def parse_routing(text: str) -> tuple[str, float]:
    """``(kind, zipf exponent)`` of a routing spec; a trace is kind ``"trace"``."""
    if text == "uniform":
        return "uniform", 0.0
    if text.startswith("zipf:"):
        try:
            exponent = float(text[5:])
        except ValueError:
            exponent = -1.0
        if not (math.isfinite(exponent) and 0 < exponent <= MAX_ZIPF_EXPONENT):
            raise ConfigError(f"expected zipf:S with 0 < S <= {MAX_ZIPF_EXPONENT:g}, got "
                              f"{text!r}", field="routing")
        return "zipf", exponent
    if text.endswith(".npy"):
        return "trace", 0.0
    raise ConfigError(f"expected 'uniform', 'zipf:S' or a .npy trace path, got {text!r}",
                      field="routing")


@dataclass(frozen=True)
class Decode:
    """One decode workload.

    Attributes
    ----------
    batch : sequences decoded together.
    context : tokens already in each sequence's KV cache when the first emulated step starts.
    weights : what the checkpoint stores (:func:`memsim.checkpoints.weight_formats`): a format
        name whose checkpoints' per-role defaults apply (``int4-g128`` keeps the embedding and
        LM head in BF16 as GPTQ/AWQ do), a llama.cpp mixture (``q4_k_m``), role overrides
        (``int4-g128,lm_head=int4-g128``) or ``uniform:FORMAT``; kept as its canonical text.
    kv : KV-cache storage format (see ``memsim formats``).
    activations : the type matmuls take their activations in: ``auto`` takes the weights'
        usual one (:func:`usual_activations`: FP8 checkpoints run W8A8, NVFP4 W4A4, integer
        weight-only formats W4A16/W8A16); a quantized type quantizes each matmul's input, while
        norms, attention and collectives stay in BF16.
    steps : consecutive decode steps emulated; the first is cold, the last is the warm steady state.
    new_tokens : tokens each sequence adds per step (1 for plain decode; gamma + 1 when a
        speculative verification step checks gamma drafted tokens).
    kv_block : paged-KV block size in tokens; a partially filled last block is read whole.
    tile_k, tile_n : weight tile (K x N elements); ``None`` takes the device's.
    residency : on-chip replacement policy: ``lru``; ``pinned`` keeps weights on chip once loaded
        (as many as fit, the rest go through LRU); ``auto`` pins under the hybrid policy and uses
        LRU otherwise.
    seed : seeds every pseudo-random choice (token ids of the embedding lookups).
    tp : tensor-parallel chips: weights sharded by heads, FFN columns and vocabulary.
    pp : pipeline stages (each ``tp`` chips), layers split so that stages hold equal bytes.
    microbatches : sequences in flight through the pipeline are cut into this many groups; it
        must divide ``batch``. ``None``: the largest divisor of ``batch`` not above ``pp``.
    policy : memory strategy (``memsim plan`` lists a device's); ``auto`` takes the device's own
        and falls back to ``tiered`` when the model does not fit but a slower tier can take the
        rest.
    ep : expert-parallel chips (MoE models): each holds an equal share of every layer's routed
        experts and of the batch (attention data parallel); tokens go to their experts' chips
        and back over the link (all-to-all).
    routing : how tokens choose experts: ``uniform``, ``zipf:S`` or a ``.npy`` trace (see
        :mod:`memsim.routing`).
    draft_heads : self-drafting heads (Medusa style) run after the LM head on each sequence's
        last position: each a residual block (hidden x hidden) and its own vocabulary projection.
    runtime : the software stack (``runtimes/*.toml``, ``memsim.runtime``): a name, a runtime
        file's path (``.toml``), a :class:`~memsim.runtime.Runtime` (a what-if), or ``auto``
        for the one the device file names (``vendor`` when it names none).
    placement : ``{selector: tier}`` overrides, applied in order, e.g. ``{"kv": "cxl"}``,
        ``{"weights[40:80]": "cxl"}``, ``{"weights": "cxl:0.3"}`` (the last 30% of each weight's
        column tiles; for a KV cache, its oldest blocks). See :mod:`memsim.layout`.
    prefill_chunk : prompt tokens of one more sequence that ride in each step (chunked prefill
        as vLLM and SGLang schedule it, TRT-LLM's in-flight batching): the matmuls take
        ``batch x new_tokens + prefill_chunk`` rows (the weights are read once for all), the
        chunk has its own KV cache, append and causal attention (flash-attention tiles), and the
        LM head runs on its last position only. Its cache grows by the chunk each step. The
        step's time is the decoding sequences' inter-token latency. 0: a plain decode step.
    prefill_context : prompt tokens of that sequence already in its cache before the first step
        (earlier chunks).
    tile_m : matmul rows per M tile (a CTA's output rows): a prompt's GEMM tiles M, and each M
        tile reads its weight tiles again through the on-chip tier. ``None``: the device's
        ``tile.n`` (square CTA tiles) when the step carries a prompt (``prefill`` or
        ``prefill_chunk``), else M is one tile (decode: the staging and GEMV rules apply to all
        rows). Attention over a prompt takes ``tile_m // q_per_kv`` query tokens per tile (the
        query heads of one KV head packed into the tile's rows).
    prefill : the step is a prompt's prefill (what :meth:`Prefill.step` builds): each sequence
        computes ``new_tokens`` prompt tokens after ``context`` cached ones, and the LM head runs
        on its last position only.
    """

    batch: int = 1
    context: int = 4096
    weights: str = "bf16"
    kv: str = "bf16"
    activations: str = "auto"
    steps: int = 2
    new_tokens: int = 1
    kv_block: int = 16
    tile_k: int | None = None
    tile_n: int | None = None
    residency: str = "auto"
    seed: int = 0
    tp: int = 1
    pp: int = 1
    microbatches: int | None = None
    policy: str = "auto"
    placement: Any = ()
    draft_heads: int = 0
    ep: int = 1
    routing: str = "uniform"
    runtime: Any = "auto"
    prefill_chunk: int = 0
    prefill_context: int = 0
    tile_m: int | None = None
    prefill: bool = False

    def __post_init__(self) -> None:
        minimums = {"context": 0, "seed": 0, "draft_heads": 0, "prefill_chunk": 0,
                    "prefill_context": 0}
        for name in ("batch", "context", "steps", "new_tokens", "kv_block", "seed", "tp", "pp",
                     "ep", "draft_heads", "prefill_chunk", "prefill_context") + tuple(
                         n for n in ("tile_k", "tile_n", "microbatches", "tile_m")
                         if getattr(self, n) is not None):
            object.__setattr__(self, name, _positive_int(getattr(self, name), name,
                                                         minimum=minimums.get(name, 1)))
        object.__setattr__(self, "weights", weight_formats(self.weights, field="weights").name)
        if self.activations == "auto":
            object.__setattr__(self, "activations", usual_activations(self.weights))
        for name in ("kv", "activations"):
            get_format(getattr(self, name), field=name)
        if get_format(self.activations).name not in ACTIVATION_FORMATS:
            raise ConfigError(f"expected activations in one of {', '.join(ACTIVATION_FORMATS)} "
                              f"or 'auto', got {self.activations!r}", field="activations")
        if self.residency not in RESIDENCY_POLICIES:
            raise ConfigError(f"expected one of {', '.join(RESIDENCY_POLICIES)}, got "
                              f"{self.residency!r}", field="residency")
        if not isinstance(self.routing, str):
            raise ConfigError(f"expected a routing such as 'uniform', got {self.routing!r}",
                              field="routing")
        parse_routing(self.routing)
        if self.microbatches is None:
            object.__setattr__(self, "microbatches", max(
                d for d in range(1, min(self.batch, self.pp) + 1) if self.batch % d == 0))
        object.__setattr__(self, "microbatches",
                           _positive_int(self.microbatches, "microbatches"))
        if self.batch % self.microbatches:
            raise ConfigError(f"microbatches must divide the batch ({self.batch}), got "
                              f"{self.microbatches}", field="microbatches")
        if self.policy not in POLICY_CHOICES:
            raise ConfigError(f"expected one of {', '.join(POLICY_CHOICES)}, got "
                              f"{self.policy!r}", field="policy")
        object.__setattr__(self, "placement", _placement_pairs(self.placement))
        if isinstance(self.runtime, str):
            if self.runtime.endswith(".toml"):
                runtime(self.runtime)          # read and checked now: errors name the file
            elif self.runtime != "auto" and self.runtime not in runtime_names():
                raise ConfigError(f"expected 'auto', a runtime file (.toml) or one of "
                                  f"{', '.join(runtime_names())}, got {self.runtime!r}",
                                  field="runtime")
        elif not isinstance(self.runtime, Runtime):
            raise ConfigError(f"expected a runtime name or a Runtime, got {self.runtime!r}",
                              field="runtime")
        self._check_prompt()

    def _check_prompt(self) -> None:
        """A prefill step or a prompt chunk: the combinations memsim models."""
        if not isinstance(self.prefill, bool):
            raise ConfigError(f"expected true or false, got {self.prefill!r}", field="prefill")
        object.__setattr__(self, "prefill", bool(self.prefill))
        if self.prefill_context and not self.prefill_chunk:
            raise ConfigError("prefill_context is the chunked sequence's cached prompt; it needs "
                              "a prefill_chunk", field="prefill_context")
        if self.prefill_chunk and self.prefill:
            raise ConfigError("a prefill step has no other prompt chunk riding in it: use "
                              "Prefill(...) or Decode(prefill_chunk=...), not both",
                              field="prefill_chunk")
        if self.prefill_chunk and (self.pp > 1 or self.ep > 1 or self.microbatches > 1
                                   or self.draft_heads):
            raise ConfigError("a prompt chunk in a decode step is modelled on tensor-parallel "
                              "chips only (pp=1, ep=1, one microbatch, no draft heads)",
                              field="prefill_chunk")

    @property
    def carries_prompt(self) -> bool:
        """True when the step computes prompt tokens (a prefill or a prompt chunk)."""
        return self.prefill or self.prefill_chunk > 0

    @property
    def step_tokens(self) -> int:
        """Tokens one step runs through the matmuls: every sequence's new tokens and the chunk."""
        return self.batch * self.new_tokens + self.prefill_chunk

    @property
    def chips(self) -> int:
        """Chips the workload runs on: tensor parallel x pipeline stages x expert parallel."""
        return self.tp * self.pp * self.ep

    @property
    def microbatch(self) -> int:
        """Sequences in one microbatch."""
        return self.batch // self.microbatches

    def to_dict(self) -> dict[str, Any]:
        """Plain fields, for reports and result stores."""
        data = asdict(self)
        data["placement"] = dict(self.placement)
        if isinstance(self.runtime, Runtime):
            data["runtime"] = self.runtime.file
        return data


@dataclass(frozen=True)
class Prefill:
    """A prompt's prefill: one step computing ``prompt`` tokens of each of ``batch`` sequences.

    The matmuls take ``batch x prompt`` rows, tiled by ``tile_m`` (see :class:`Decode`); the
    attention is causal flash attention over the prompt (each query tile reads the K/V blocks up
    to its last position, through the on-chip tier); the whole prompt's KV is written once; the
    LM head runs on each sequence's last position, whose logits give the first token. So the
    step's time is the time to first token (the first decode step is not added).

    ``cached`` tokens of a prefix before them already have their KV (prefix caching): they are
    read, not computed, so the whole prompt is ``cached + prompt`` tokens long. The other fields
    are :class:`Decode`'s and are validated by it.
    """

    batch: int = 1
    prompt: int = 2048
    cached: int = 0
    weights: str = "bf16"
    kv: str = "bf16"
    activations: str = "auto"
    kv_block: int = 16
    tile_k: int | None = None
    tile_n: int | None = None
    tile_m: int | None = None
    residency: str = "auto"
    seed: int = 0
    tp: int = 1
    pp: int = 1
    microbatches: int | None = None
    policy: str = "auto"
    placement: Any = ()
    ep: int = 1
    routing: str = "uniform"
    runtime: Any = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt", _positive_int(self.prompt, "prompt"))
        object.__setattr__(self, "cached", _positive_int(self.cached, "cached", minimum=0))
        step = self.step()
        for name in ("weights", "activations", "microbatches", "placement"):
            object.__setattr__(self, name, getattr(step, name))

    def step(self) -> Decode:
        """The prefill as the one step the planner lowers."""
        fields = {name: getattr(self, name) for name in self.__dataclass_fields__
                  if name not in ("prompt", "cached")}
        return Decode(context=self.cached, new_tokens=self.prompt, steps=1, prefill=True,
                      **fields)

    def to_dict(self) -> dict[str, Any]:
        """Plain fields, for reports and result stores."""
        return {"prefill": True, "prompt": self.prompt, **self.step().to_dict()}


def _placement_pairs(placement: Any) -> tuple[tuple[str, str], ...]:
    """``{selector: target}`` or ``[(selector, target), ...]`` as a tuple of string pairs."""
    items = placement.items() if isinstance(placement, Mapping) else placement
    try:
        pairs = tuple((key, value) for key, value in items)
    except (TypeError, ValueError):
        raise ConfigError(f"expected a mapping such as {{'kv': 'cxl'}}, got {placement!r}",
                          field="placement") from None
    for key, value in pairs:
        if not isinstance(key, str) or not isinstance(value, str):
            raise ConfigError(f"selectors and targets are strings ('kv': 'cxl'), got "
                              f"{key!r}: {value!r}", field="placement")
    return pairs
