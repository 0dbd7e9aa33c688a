"""What a decode run asks of a device: batch, context, formats, tiling, residency, parallelism,
placement, seed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from memsim.errors import ConfigError
from memsim.formats import get_format
from memsim.routing import parse_routing

RESIDENCY_POLICIES = ("auto", "lru", "pinned")
ACTIVATION_FORMATS = ("bf16", "fp16", "fp32", "fp8-e4m3", "fp8-e5m2", "nvfp4", "mxfp8")


def usual_activations(weights: str) -> str:
    """The activation type a checkpoint of ``weights`` usually runs with.

    FP8 checkpoints (NVIDIA ModelOpt / llm-compressor FP8) quantize activations to FP8 E4M3 per
    tensor; NVFP4 checkpoints (ModelOpt NVFP4) quantize them to NVFP4; MXFP8 runs MXFP8 x MXFP8;
    every integer format (int8, int4-gN, llama.cpp's) is weight-only and keeps 16-bit activations.
    """
    compute = get_format(weights, field="weights").compute
    if compute == "fp8":
        return "mxfp8" if weights == "mxfp8" else "fp8-e4m3"
    if weights == "nvfp4":
        return "nvfp4"
    if compute in ("fp16", "fp32"):
        return compute
    return "bf16"
POLICY_CHOICES = ("auto", "hbm-centric", "sram-resident", "hybrid", "tiered", "weight-streaming")


def _positive_int(value: Any, field: str, *, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"expected an integer >= {minimum}, got {value!r}", field=field)


@dataclass(frozen=True)
class Decode:
    """One decode workload.

    Attributes
    ----------
    batch : sequences decoded together.
    context : tokens already in each sequence's KV cache when the first emulated step starts.
    weights, kv : storage formats (see ``memsim formats``).
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

    def __post_init__(self) -> None:
        _positive_int(self.batch, "batch")
        _positive_int(self.context, "context", minimum=0)
        _positive_int(self.steps, "steps")
        _positive_int(self.new_tokens, "new_tokens")
        _positive_int(self.kv_block, "kv_block")
        _positive_int(self.seed, "seed", minimum=0)
        for name in ("tile_k", "tile_n"):
            if getattr(self, name) is not None:
                _positive_int(getattr(self, name), name)
        if self.activations == "auto":
            object.__setattr__(self, "activations", usual_activations(self.weights))
        for name in ("weights", "kv", "activations"):
            get_format(getattr(self, name), field=name)
        if get_format(self.activations).name not in ACTIVATION_FORMATS:
            raise ConfigError(f"expected activations in one of {', '.join(ACTIVATION_FORMATS)} "
                              f"or 'auto', got {self.activations!r}", field="activations")
        if self.residency not in RESIDENCY_POLICIES:
            raise ConfigError(f"expected one of {', '.join(RESIDENCY_POLICIES)}, got "
                              f"{self.residency!r}", field="residency")
        _positive_int(self.draft_heads, "draft_heads", minimum=0)
        _positive_int(self.tp, "tp")
        _positive_int(self.ep, "ep")
        if not isinstance(self.routing, str):
            raise ConfigError(f"expected a routing such as 'uniform', got {self.routing!r}",
                              field="routing")
        parse_routing(self.routing)
        _positive_int(self.pp, "pp")
        if self.microbatches is None:
            object.__setattr__(self, "microbatches", max(
                d for d in range(1, min(self.batch, self.pp) + 1) if self.batch % d == 0))
        _positive_int(self.microbatches, "microbatches")
        if self.batch % self.microbatches:
            raise ConfigError(f"microbatches must divide the batch ({self.batch}), got "
                              f"{self.microbatches}", field="microbatches")
        if self.policy not in POLICY_CHOICES:
            raise ConfigError(f"expected one of {', '.join(POLICY_CHOICES)}, got "
                              f"{self.policy!r}", field="policy")
        object.__setattr__(self, "placement", _placement_pairs(self.placement))

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
