"""Where a model's bytes live: memory policies, placement rules, tensor-parallel shards, stages.

Tensor parallel runs at any degree: widths the ranks do not divide are padded as AWS Neuron pads
them (:func:`shard`), and the padding is stored, read and computed like the model's own.

A *policy* gives every kind of tensor a default home tier (the device file names the device's
own; ``policies(device)`` lists the others it supports). *Placement rules* then move chosen
tensors, or a fraction of each, to other tiers: a selector names tensors and a target a tier,

    selector := ROLE [ "[" FIRST ":" LAST "]" ]      target := TIER [ ":" FRACTION ]

where ROLE is ``weights``, ``kv``, ``norms`` or one tensor role (``embedding``, ``qkv``,
``o_proj``, ``gate``, ``up``, ``down``, ``attn_norm``, ``ffn_norm``, ``final_norm``,
``lm_head``), the optional slice selects layers as in Python (``weights[40:80]``), and FRACTION
in (0, 1] moves only that share of each tensor: the last column tiles of a weight, the last rows
of an embedding; of the routed ``experts``, the coldest share of each layer's experts by routing
probability (``experts=cxl:0.75``: the three quarters least chosen live behind CXL); of a KV cache, the oldest blocks when the target is further out than its home
(``kv=cxl:0.5``: recent tokens stay near) and the most recent blocks when it is nearer
(``kv=sram:0.1`` on a hybrid chip: the KV of recent tokens on chip).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from memsim.device import Device
from memsim.errors import ConfigError
from memsim.model import Model

LAYER_ROLES = ("attn_norm", "qkv", "kv", "o_proj", "ffn_norm", "gate", "up", "down", "router",
               "experts", "shared_experts")
GLOBAL_ROLES = ("embedding", "final_norm", "lm_head", "draft_head")
GROUPS = {
    "weights": frozenset(r for r in LAYER_ROLES + GLOBAL_ROLES if r != "kv"),
    "kv": frozenset({"kv"}),
    "norms": frozenset({"attn_norm", "ffn_norm", "final_norm"}),
}
_SELECTOR = re.compile(r"^\s*([a-z_]+)\s*(?:\[\s*(-?\d*)\s*:\s*(-?\d*)\s*\])?\s*$")


@dataclass(frozen=True)
class PlacementRule:
    """Tensors of ``roles`` in layers ``[first, last)`` (all when None) go to ``tier``."""

    text: str
    roles: frozenset[str]
    first: int | None
    last: int | None
    tier: str
    fraction: float = 1.0

    def matches(self, role: str, layer: int, n_layers: int) -> bool:
        """True when the rule applies to tensor ``role`` of ``layer`` (-1: not in a layer)."""
        if role not in self.roles:
            return False
        if self.first is None and self.last is None:
            return True
        if layer < 0:
            return False
        return layer in range(n_layers)[slice(self.first, self.last)]


def parse_placement(pairs: tuple[tuple[str, str], ...], device: Device,
                    n_layers: int) -> tuple[PlacementRule, ...]:
    """Validate ``selector -> target`` pairs against the device's tiers and the model's layers."""
    rules = []
    for selector, target in pairs:
        field = f"placement.{selector}"
        match = _SELECTOR.match(selector)
        roles = GROUPS.get(match.group(1)) if match else None
        if roles is None and match and match.group(1) in LAYER_ROLES + GLOBAL_ROLES:
            roles = frozenset({match.group(1)})
        if roles is None:
            names = ", ".join(dict.fromkeys(list(GROUPS) + list(LAYER_ROLES + GLOBAL_ROLES)))
            raise ConfigError(f"expected ROLE or ROLE[FIRST:LAST] with ROLE one of {names}, "
                              f"got {selector!r}", field=field)
        first = int(match.group(2)) if match.group(2) else None
        last = int(match.group(3)) if match.group(3) else None
        sliced = "[" in selector
        if sliced and roles <= set(GLOBAL_ROLES):
            raise ConfigError(f"{match.group(1)} is not in a layer: a layer range selects "
                              "nothing", field=field)
        if sliced and not range(n_layers)[slice(first, last)]:
            raise ConfigError(f"layers [{match.group(2)}:{match.group(3)}] select none of the "
                              f"{n_layers} layers", field=field)
        tier, sep, fraction_text = target.partition(":")
        tier = tier.strip()
        if tier not in device.tier_names:
            raise ConfigError(f"no tier {tier!r} on {device.name}; tiers are "
                              f"{', '.join(device.tier_names)} (add one with --add-tier)",
                              field=field)
        fraction = 1.0
        if sep:
            try:
                fraction = float(fraction_text)
            except ValueError:
                fraction = -1.0
            if not 0.0 < fraction <= 1.0:
                raise ConfigError(f"expected TIER or TIER:FRACTION with 0 < FRACTION <= 1, got "
                                  f"{target!r}", field=field)
        rules.append(PlacementRule(f"{selector}={target}", roles, first, last, tier, fraction))
    return tuple(rules)


# Policies ---------------------------------------------------------------------------------

def spill_tier(device: Device) -> str | None:
    """The tier that takes what does not fit: the file's ``layout.spill``, else an added tier
    further out than the weights' home."""
    if device.layout.spill is not None:
        return device.layout.spill
    outer = device.tiers[-1].name
    if device.tier_index(outer) > device.tier_index(device.layout.weights):
        return outer
    return None


def policies(device: Device) -> tuple[str, ...]:
    """The memory strategies this device supports, its own first."""
    own = device.layout.policy
    found = [own]
    spill = spill_tier(device)
    if own == "sram-resident" and spill is not None:
        found.append("weight-streaming")
    if spill is not None and own != "tiered":
        found.append("tiered")
    return tuple(found)


def default_homes(device: Device, policy: str) -> tuple[str, str]:
    """Home tiers ``(weights, kv)`` of a policy on this device."""
    if policy not in policies(device):
        raise ConfigError(f"{device.name} does not support the {policy!r} policy; it supports "
                          f"{', '.join(policies(device))}", field="policy")
    on_chip = device.tiers[0].name
    if policy == "sram-resident":
        return on_chip, on_chip
    if policy == "weight-streaming":
        return spill_tier(device), on_chip
    return device.layout.weights, device.layout.kv


# Tensor parallel ------------------------------------------------------------------------

@dataclass(frozen=True)
class Shard:
    """What one chip of a tensor-parallel group holds of each layer.

    ``heads``, ``kv_heads``, ``ffn`` and ``dense_ffn`` are this chip's widths after padding
    (see :func:`shard`); the ``padded_*`` fields count what padding added over the whole group:
    query heads, KV heads (replicas and padding) and FFN columns that hold zeros but are stored,
    read and multiplied like the rest. ``ranks_per_chip`` is how many of the engine's
    tensor-parallel ranks one chip runs (two NeuronCores per Inferentia2 chip).
    """

    tp: int
    heads: int
    kv_heads: int
    ffn: int
    vocab_rows: int
    dense_ffn: int = 0
    ranks_per_chip: int = 1
    padded_heads: int = 0
    padded_kv_heads: int = 0
    padded_ffn: int = 0
    padded_dense_ffn: int = 0

    @property
    def q_per_kv(self) -> int:
        """Query heads sharing one KV head on this chip."""
        return self.heads // self.kv_heads

    @property
    def ranks(self) -> int:
        """The engine's tensor-parallel degree: ranks over the whole group."""
        return self.tp * self.ranks_per_chip

    @property
    def padded(self) -> bool:
        """True when the group stores padding or replicas beyond plain division."""
        return bool(self.padded_heads or self.padded_kv_heads or self.padded_ffn
                    or self.padded_dense_ffn)

    def describe(self, model: Model) -> str:
        """One line for a report: what the padding adds, or ``""`` when nothing is padded."""
        if not self.padded:
            return ""
        parts = []
        if self.padded_heads:
            parts.append(f"query heads {model.heads} -> {model.heads + self.padded_heads}")
        if self.padded_kv_heads:
            kv_heads = model.kv_heads + self.padded_kv_heads
            how = ("MLA's latent cache, q_a and kv_a whole on every rank" if model.is_mla
                   else "padded with the query heads" if model.heads == model.kv_heads
                   else "replicated, one per rank" if self.ranks % model.kv_heads == 0
                   else "converted to multi-head, one per padded query head")
            parts.append(f"KV heads {model.kv_heads} -> {kv_heads} ({how})")
        widths = [(self.padded_ffn, model.ffn, "FFN")]
        if model.is_moe and model.dense_ffn:
            widths = [(self.padded_ffn, model.ffn, "expert FFN"),
                      (self.padded_dense_ffn, model.dense_ffn, "dense FFN")]
        parts += [f"{name} {width} -> {width + extra}" for extra, width, name in widths if extra]
        ranks = (f"{self.ranks} ranks ({self.tp} chips x {self.ranks_per_chip})"
                 if self.ranks_per_chip > 1 else f"{self.tp} chips")
        return (f"tensor parallel over {ranks}: {', '.join(parts)}; padding and replicas are "
                f"stored, read and computed like the model's own")


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def group_kv_heads(heads: int, kv_heads: int, ranks: int) -> int:
    """KV heads a tensor-parallel group of ``ranks`` stores, replicas and padding included.

    The rule of AWS Neuron's NxD Inference (``get_shardable_head_counts``): KV heads that
    ``ranks`` divides are split; when ``ranks`` is a multiple of them each rank holds one
    replica (``REPLICATE_TO_TP_DEGREE``, what vLLM's ``QKVParallelLinear`` does too); otherwise
    the attention becomes multi-head with one KV head per padded query head
    (``CONVERT_TO_MHA``).
    """
    padded_heads = _round_up(heads, ranks)
    if heads == kv_heads:
        return padded_heads
    if kv_heads % ranks == 0:
        return kv_heads
    if ranks % kv_heads == 0:
        return ranks
    return padded_heads


def shard(model: Model, tp: int, ranks_per_chip: int = 1) -> Shard:
    """Megatron-style shards over ``tp`` chips running ``ranks_per_chip`` ranks each: heads,
    KV heads, FFN columns; the vocabulary split in equal ranges, the last one padded.

    Widths that the ranks do not divide are padded as engines pad them, and the padding is
    real bytes and real work on the chip:

    - query heads up to a multiple of the ranks (NxD's ``get_number_of_extra_heads``: 64 heads
      on 24 NeuronCores become 72, 3 per core);
    - KV heads split, replicated or converted to multi-head as :func:`group_kv_heads` says;
    - FFN columns (and an MoE model's dense FFN) up to a multiple of the ranks, zero columns of
      gate and up and zero rows of down.

    A width the ranks divide is split plainly, so every deployment vLLM or TRT-LLM accepts
    shards as before (vLLM requires the ranks to divide the heads and replicates KV heads when
    the ranks are a multiple of them).

    Sources: [V] head padding and the KV rule: ``get_shardable_head_counts`` in
    aws-neuron/neuronx-distributed-inference ``modules/attention/gqa.py`` (as adapted in
    huggingface/optimum-neuron ``optimum/neuron/models/inference/backend/modules/attention/
    gqa.py``) and ``get_number_of_extra_heads`` in neuronx_distributed
    ``parallel_layers/pad.py``; [V] vLLM: ``QKVParallelLinear.__init__`` in
    vllm-project/vllm ``vllm/model_executor/layers/linear.py`` (``divide(total_num_heads,
    tp_size)``; one KV head with ``tp_size // total_num_kv_heads`` replicas when
    ``tp_size >= total_num_kv_heads``); [E] FFN padding to a multiple of the ranks: zero
    columns as users pad Qwen2-72B's 29568 for vLLM TP 8 (huggingface.co Qwen/Qwen2-72B-
    Instruct-AWQ discussion 3); Neuron's own FFN rule was not found. The compiler's padding of
    a shard to whole tiles is not counted: the walker reads a short last tile as it is.
    """
    ranks = tp * ranks_per_chip
    dense_width = model.dense_ffn or model.ffn
    heads = _round_up(model.heads, ranks)
    kv_heads = group_kv_heads(model.heads, model.kv_heads, ranks)
    ffn = _round_up(model.ffn, ranks)
    dense_ffn = _round_up(dense_width, ranks)
    return Shard(tp=tp, heads=heads // tp, kv_heads=kv_heads // tp, ffn=ffn // tp,
                 vocab_rows=-(-model.vocab // ranks) * ranks_per_chip,
                 dense_ffn=dense_ffn // tp, ranks_per_chip=ranks_per_chip,
                 padded_heads=heads - model.heads, padded_kv_heads=kv_heads - model.kv_heads,
                 padded_ffn=ffn - model.ffn,
                 padded_dense_ffn=dense_ffn - dense_width if model.dense_ffn else 0)


def divides(model: Model, ranks: int) -> bool:
    """True when ``ranks`` shard the model without padding: they divide the heads and the FFN
    widths, and divide the KV heads or are a multiple of them (the degrees vLLM accepts)."""
    widths = (model.heads, model.ffn, model.dense_ffn or model.ffn)
    return (all(w % ranks == 0 for w in widths)
            and (model.kv_heads % ranks == 0 or ranks % model.kv_heads == 0))


def tp_degrees(model: Model, limit: int, ranks_per_chip: int = 1) -> list[int]:
    """Tensor-parallel degrees (chips) up to ``limit`` that shard this model without padding;
    :func:`shard` pads any other."""
    return [tp for tp in range(1, limit + 1) if divides(model, tp * ranks_per_chip)]


def collective_steps(topology: str, chips: int) -> int:
    """Link latencies one pass of a bandwidth-optimal collective waits for, in sequence.

    A ring (and a switch, where NCCL runs a ring) passes chunks ``chips - 1`` times; fully
    connected chips send every chunk at once; a torus runs a ring along each dimension of a
    near-cubic factorisation (a mesh is taken as a torus: the missing wrap-around links would
    halve the bandwidth of the edge rings, which memsim does not model).
    """
    if chips <= 1:
        return 0
    if topology == "fully-connected":
        return 1
    if topology in ("torus-2d", "mesh"):
        return sum(d - 1 for d in _factor(chips, 2))
    if topology == "torus-3d":
        return sum(d - 1 for d in _factor(chips, 3))
    return chips - 1


def _factor(n: int, dims: int) -> list[int]:
    """``n`` as a product of ``dims`` factors with the fewest ring hops (smallest sum of
    ``d - 1``), largest first."""
    if dims == 1:
        return [n]
    best = [n] + [1] * (dims - 1)
    for d in range(1, n + 1):
        if n % d == 0:
            cand = sorted([d] + _factor(n // d, dims - 1), reverse=True)
            if sum(cand) < sum(best):
                best = cand
    return best


# Pipeline stages ------------------------------------------------------------------------

def balanced_stages(item_bytes: list[tuple[int, ...]], capacity: tuple[int, ...],
                    stages: int) -> list[int] | None:
    """Cut a sequence of items (bytes per tier each) into ``stages`` contiguous stages so that
    the fullest stage is as empty as possible; ``None`` when no cut fits every stage in
    ``capacity``. Returns the index of each stage's first item.

    A greedy fill with a capacity cap gives the fewest stages under that cap, so a bisection on
    the cap finds the balanced cut.
    """
    if stages > len(item_bytes):
        return None
    lo, hi = 0.0, 1.0
    best = _greedy(item_bytes, capacity, 1.0)
    if best is None or len(best) > stages:
        return None
    for _ in range(40):
        mid = (lo + hi) / 2
        cut = _greedy(item_bytes, capacity, mid)
        if cut is not None and len(cut) <= stages:
            hi, best = mid, cut
        else:
            lo = mid
    return _spread(best, len(item_bytes), stages)


def fewest_stage_cut(item_bytes: list[tuple[int, ...]],
                     capacity: tuple[int, ...]) -> list[int] | None:
    """The fewest contiguous stages that fit ``capacity`` (a greedy fill is optimal); ``None``
    when one item alone does not fit."""
    return _greedy(item_bytes, capacity, 1.0)


def _greedy(item_bytes: list[tuple[int, ...]], capacity: tuple[int, ...],
            share: float) -> list[int] | None:
    limit = [c * share for c in capacity]
    starts = [0]
    used = [0] * len(capacity)
    for i, item in enumerate(item_bytes):
        if any(b > lim for b, lim in zip(item, limit)):
            return None
        if any(u + b > lim for u, b, lim in zip(used, item, limit)):
            starts.append(i)
            used = [0] * len(capacity)
        used = [u + b for u, b in zip(used, item)]
    return starts


def _spread(starts: list[int], n_items: int, stages: int) -> list[int]:
    """Add stages (split the longest) until there are ``stages``; splitting never overfills."""
    starts = list(starts)
    while len(starts) < stages:
        ends = starts[1:] + [n_items]
        longest = max(range(len(starts)), key=lambda s: ends[s] - starts[s])
        starts.insert(longest + 1, starts[longest] + math.ceil((ends[longest] - starts[longest]) / 2))
    return starts
