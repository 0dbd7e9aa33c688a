"""What a decode run asks of a device: batch, context, formats, tiling, residency, parallelism,
placement, seed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from memsim.checkpoints import MIXTURES, usual_activations, weight_formats
from memsim.errors import ConfigError
from memsim.formats import get_format
from memsim.routing import parse_routing
from memsim.runtime import Runtime, runtime_names

RESIDENCY_POLICIES = ("auto", "lru", "pinned")
ACTIVATION_FORMATS = ("bf16", "fp16", "fp32", "fp8-e4m3", "fp8-e5m2", "fp8-e4m3-b128", "mxfp8",
                      "nvfp4", "int8")
INT64_MAX = 2**63 - 1
POLICY_CHOICES = ("auto", "hbm-centric", "sram-resident", "hybrid", "tiered", "weight-streaming")


def _positive_int(value: Any, field: str, *, minimum: int = 1,
                  maximum: int = INT64_MAX) -> int:
    """The value as a Python int when it is an integer (numpy's too) in [minimum, maximum]."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ConfigError(f"expected an integer >= {minimum}, got {value!r}", field=field)
    if not minimum <= int(value) <= maximum:
        raise ConfigError(f"expected an integer in [{minimum}, {maximum}], got {value!r}",
                          field=field)
    return int(value)


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
    runtime : the software stack (``runtimes/*.toml``, ``memsim.runtime``): a name, a
        :class:`~memsim.runtime.Runtime` (a what-if), or ``auto`` for the one the device file
        names (``vendor`` when it names none).
    placement : ``{selector: tier}`` overrides, applied in order, e.g. ``{"kv": "cxl"}``,
        ``{"weights[40:80]": "cxl"}``, ``{"weights": "cxl:0.3"}`` (the last 30% of each weight's
        column tiles; for a KV cache, its oldest blocks). See :mod:`memsim.layout`.
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

    def __post_init__(self) -> None:
        minimums = {"context": 0, "seed": 0, "draft_heads": 0}
        for name in ("batch", "context", "steps", "new_tokens", "kv_block", "seed", "tp", "pp",
                     "ep", "draft_heads") + tuple(n for n in ("tile_k", "tile_n", "microbatches")
                                                 if getattr(self, n) is not None):
            object.__setattr__(self, name, _positive_int(getattr(self, name), name,
                                                         minimum=minimums.get(name, 1)))
        object.__setattr__(self, "weights", weight_formats(self.weights, field="weights").name)
        if self.activations == "auto":
            base = weight_formats(self.weights).base
            object.__setattr__(self, "activations", usual_activations(MIXTURES.get(base, base)))
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
            if self.runtime != "auto" and self.runtime not in runtime_names():
                raise ConfigError(f"expected 'auto' or one of {', '.join(runtime_names())}, got "
                                  f"{self.runtime!r}", field="runtime")
        elif not isinstance(self.runtime, Runtime):
            raise ConfigError(f"expected a runtime name or a Runtime, got {self.runtime!r}",
                              field="runtime")

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
