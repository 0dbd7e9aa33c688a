"""Lowering (device, model, workload) into the flat tables the kernels walk.

The plan places every tensor on a tier (the policy's homes, then the placement rules, then, under
the tiered policy, whole layers spilled to the slower tier until the rest fits), shards it over
the tensor-parallel chips, cuts the layers into pipeline stages that hold equal bytes, checks
capacity, decides which tensors the on-chip tier pins, and writes, per stage, one row per op of
one decode step: the embedding lookup; per layer the input RMSNorm, the fused QKV projection, the
KV append, attention over the cache, the output projection, the FFN RMSNorm, gate, up and down;
the final norm and the LM head; with tensor parallelism the all-reduces after the output and down
projections and the embedding, and the all-gather of the logits; with pipeline stages the
hand-off of activations to the next stage and of the sampled tokens back to the first. A stage's
ops repeat for each microbatch, with the microbatch's own KV cache. A model with multi-head
latent attention (DeepSeek-V2/V3) has MLA's absorbed projections in place of the fused QKV
(``q_a``, ``q_a_norm``, ``q_b`` or ``q_proj``; ``kv_a``, ``kv_a_norm``; ``w_uk`` before and
``w_uv`` after attention) and caches one latent row per token instead of K and V
(``C_KV_PARTS``).

A step that carries a prompt (a prefill, :class:`memsim.workload.Prefill`, or a decode step with
a ``prefill_chunk``) tiles the matmuls' M (``C_TILE_M``) and its prompt attention's queries
(``C_Q_TILE``); a chunk's sequence has its own KV cache per layer (``chunk_kv.L``) and its own
``chunk_kv_append`` and ``chunk_attention`` ops after the decode batch's; the LM head runs on the
last position of each prompt only.

Each stage's plan describes one chip: the chips of a tensor-parallel group do the same work on
their own shards.

A stage is lowered once per layer shape: the first layer of each shape (dense or MoE, with its
tensors' formats, per microbatch) has its tensor specs built and is lowered op row by op row,
and every other layer of that shape shares its specs (``_Item``) and is a numpy copy of its rows
with the REPLICATED_COLUMNS changed. The tensors are placed as a :class:`TensorTable` (one row per
tensor, placed once per spec unless a rule depends on the layer); the placement columns
(TENSOR_COLUMNS) of every op row are read off it in one pass with the batch and context's
(:func:`memsim.kernels.columns.set_point_columns`), and :attr:`Plan.tensors` builds the
:class:`Tensor` objects only when asked.

A process keeps, per stage, what does not depend on the batch and context (keyed by the device,
the model, every other workload field, the policy, the shard and the stage; bounded LRU caches of
read-only values): the op rows (:class:`_StageRows`) and the tensor table's frame with its
weights' placement (:class:`_TableFrame`). A point places its KV caches, checks capacity and sets
the columns and link times that follow from its batch and context on a copy; tests/
test_plan_cache.py holds the figures of varied points equal whatever was planned before.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from memsim.device import Device, FrozenTable, Link, thaw
from memsim.errors import CapacityError, ConfigError
from memsim.checkpoints import WeightFormats, weight_formats
from memsim.formats import Format, get_format
from memsim.gemmtile import GemmTile
from memsim.instructions import MLP_COLUMNS, in_flight_columns
from memsim.handoff import handoff_seconds
from memsim.kernels import step as k
from memsim.kernels.bounds import lru_tiles
from memsim.kernels.columns import held_bytes, set_point_columns
from memsim.limits import check_sizes
from memsim.layout import (PlacementRule, Shard, balanced_stages, collective_steps,
                           default_homes, parse_placement, policies, shard, spill_tier)
from memsim.model import Model
from memsim.precision import FLOAT16_TYPES, MatmulPath, matmul_path, runtime_type
from memsim.runtime import Runtime, collective_library, collective_time, runtime
from memsim.routing import probabilities
from memsim.units import format_quantity
from memsim.wafer import with_resident_tile
from memsim.workload import Decode

#: The op table's GEMV columns of an op whose runtime counts no GEMV instructions.
NO_GEMV = (0.0,) * (k.N_FLOAT_COLS - k.F_GEMV)

TOKEN_ID_BITS = 32      # a sampled token id sent back to the first pipeline stage


@dataclass(frozen=True)
class Tensor:
    """A weight tensor or one layer's KV cache on one chip: where it lives, what it costs.

    Its units (column tiles, KV blocks or embedding rows) below ``split`` live on ``home``, the
    others on ``home_hi``; ``tier_bytes`` is what each of those tiers stores of it.
    """

    name: str
    kind: str          # "weight" or "kv"
    role: str          # "qkv", "kv", "embedding", ... (see memsim.layout)
    layer: int         # -1 for the embedding, final norm and LM head
    home: int
    home_hi: int
    split: int
    tier_bytes: tuple[tuple[int, int], ...]
    pinned: bool = False
    aliased: bool = False    # its storage is another tensor's (a tied LM head)
    fmt: Format | None = None  # storage format (a weight's, per role; a KV cache's)

    @property
    def bytes(self) -> int:
        """Bytes stored, over every tier."""
        return sum(b for _, b in self.tier_bytes)

    def bytes_on(self, tier: int) -> int:
        """Bytes stored on tier ``tier``."""
        return sum(b for t, b in self.tier_bytes if t == tier)


@dataclass(frozen=True)
class Plan:
    """One pipeline stage on one chip: the kernels' input tables and the residency set-up."""

    device: Device
    model: Model
    workload: Decode
    policy: str
    stage: int
    stages: int
    layers: tuple[int, ...]           # the model layers this stage runs
    tier_names: tuple[str, ...]
    tier_capacity: np.ndarray
    tier_bandwidth: np.ndarray        # sustained, bytes/s
    tier_latency_s: np.ndarray
    tier_granularity: np.ndarray
    tier_energy_j_per_byte: np.ndarray
    runtime: Runtime                  # the software stack the step runs under
    launch_s: float                   # device dispatch gap per kernel
    kernel_fixed_s: float             # device time inside each kernel that streams nothing
    host_launch_s: float              # host cost per kernel launch (0 under a captured graph)
    op_int: np.ndarray                # [op, k.C_*]
    op_float: np.ndarray              # [op, k.F_*]
    op_names: tuple[str, ...]
    op_microbatch: np.ndarray         # [op]: the microbatch an op works for
    op_formats: tuple[str, ...]       # [op]: the storage format of the op's tensor (or data)
    tensor_table: TensorTable         # the tensors (C_TENSOR ids) as columns
    residency: str                    # "lru" or "pinned", resolved
    lru_capacity_bits: int
    max_lru_entries: int              # tiles the on-chip LRU can hold at once, at most
    spilled: tuple[str, ...] = ()     # what the tiered policy moved to the spill tier, as text
    tensor_base: int = 0              # C_TENSOR of tensor_table's first row (a shared arena's)

    @property
    def n_ops(self) -> int:
        """Ops in one decode step of this stage."""
        return self.op_int.shape[0]

    @property
    def n_tensors(self) -> int:
        """Tensors of this stage (the ids ``C_TENSOR`` names)."""
        return len(self.tensor_table)

    @functools.cached_property
    def tensors(self) -> tuple[Tensor, ...]:
        """The tensors as objects, built on first use from ``tensor_table``."""
        return self.tensor_table.tensors()

    def bytes_by_tier(self, kind: str) -> dict[str, int]:
        """Bytes of weights (``kind="weight"``) or KV cache (``"kv"``) each tier holds."""
        return dict(self._held[kind])

    @functools.cached_property
    def _held(self) -> dict[str, dict[str, int]]:
        """Bytes each tier holds, by tensor kind."""
        return {kind: dict(zip(self.tier_names, self.tensor_table.held(kind == "weight").tolist()))
                for kind in ("weight", "kv")}


@dataclass(frozen=True)
class SystemPlan:
    """Every pipeline stage's plan; each runs on ``workload.tp`` identical chips."""

    device: Device
    model: Model
    workload: Decode
    policy: str
    shard: Shard
    stages: tuple[Plan, ...]
    parallel_stages: bool = False     # expert parallel: the "stages" are chips side by side

    @property
    def chips(self) -> int:
        """Chips in the system."""
        return self.workload.tp * len(self.stages)

    def bytes_by_tier(self, kind: str) -> dict[str, int]:
        """Bytes of ``kind`` each tier holds over the whole system."""
        total = dict.fromkeys(self.stages[0].tier_names, 0)
        for plan in self.stages:
            for tier, nbytes in plan.bytes_by_tier(kind).items():
                total[tier] += nbytes * self.workload.tp
        return total


def kv_row_bits(model: Model, fmt: Format) -> int:
    """Bits of one token's cached row for one KV head, scales included: its K (or V), or for
    multi-head latent attention its latent (``kv_lora_rank + qk_rope_head_dim`` values)."""
    return fmt.tensor_bits((1, model.head_dim)) - fmt.tensor_meta_bits


def kv_block_bytes(row_bits: int, kv_block: int, granularity: int) -> int:
    """Bytes of one paged-KV block of K (or V, or MLA's latent) for one head, rounded up to the
    tier's access."""
    block_bytes = -(-(kv_block * row_bits) // 8)
    return -(-block_bytes // granularity) * granularity


def kv_cache_bytes(model: Model, workload: Decode, tokens: int, granularity: int,
                   kv_heads: int | None = None, sequences: int | None = None) -> int:
    """Bytes of a paged KV cache for one layer holding ``tokens`` tokens per sequence (every
    KV head and sequence of the workload unless given; K and V, or MLA's one latent)."""
    row_bits = kv_row_bits(model, get_format(workload.kv))
    blocks = -(-tokens // workload.kv_block)
    heads = model.kv_heads if kv_heads is None else kv_heads
    seqs = workload.batch if sequences is None else sequences
    return (seqs * heads * model.kv_parts * blocks
            * kv_block_bytes(row_bits, workload.kv_block, granularity))


def stream_format(workload: Decode) -> Format:
    """The residual stream's type (norms, attention, collectives): the activations' when they are
    a 16- or 32-bit float, else BF16 (quantized activations are a matmul's input only)."""
    return _stream_type(workload.activations)


def _stream_type(activations: str) -> Format:
    act = get_format(activations)
    return act if act.compute in FLOAT16_TYPES + ("fp32",) else get_format("bf16")


def _stream_rate(device: Device, stream: Format) -> float:
    """The matrix rate attention's products run at in the residual stream's type (the same
    tensor cores as the matmuls: sustained where the device file measures it)."""
    return (device.matmul_rate(runtime_type(device, stream.compute)[0])
            or device.matmul_rate("bf16") or device.matmul_rate("fp16"))


def resolve_runtime(device: Device, workload: Decode) -> Runtime:
    """The workload's software stack: its own, else the one the device file names, else the
    vendor's compiled stack (``runtimes/vendor.toml``); the device's ``runtime.*`` what-ifs
    apply to it."""
    if isinstance(workload.runtime, Runtime):
        stack = workload.runtime
    elif workload.runtime != "auto":
        stack = runtime(workload.runtime)
    else:
        stack = runtime(device.runtime or "vendor")
    return _with_what_ifs(stack, device.runtime_overrides) if device.runtime_overrides else stack


@functools.lru_cache(maxsize=64)
def _with_what_ifs(stack: Runtime, overrides: tuple[tuple[str, object], ...]) -> Runtime:
    """A runtime with a device's ``runtime.*`` what-ifs, parsed once (not per stage)."""
    return stack.with_overrides(thaw(FrozenTable(overrides)))


# A device file's link kinds as the collective libraries' cost tables know them (DCN is the
# Ethernet between TPU slices; NeuronLink, IPU-Links and Groq's RealScale have no library row).
LIBRARY_LINK_KIND = {"nvlink": "nvlink", "infinity-fabric": "infinity-fabric", "pcie": "pcie",
                     "ici": "ici", "ethernet": "ethernet", "infiniband": "infiniband",
                     "dcn": "ethernet"}


def handoff_link(device: Device, tp: int, stage: int, stages: int, *, to_first: bool) -> Link:
    """The link a pipeline hand-off crosses: stage ``stage``'s activations from its ``tp`` chips
    to the next stage's, or (``to_first``) the sampled tokens from the last stage's chips back
    to the first stage's. Chips are numbered stage by stage and a link domain holds
    ``link.max_chips`` consecutive ones (an HGX node's eight GPUs on NVSwitch): the hand-off
    stays on the domain's link when the two stages' chips lie in one domain, else it crosses
    the scale-out network. The tokens go back inside a domain when the whole system fits one
    (tp 4 x pp 2 on one 8-GPU node: NVLink, as both stages' chips hang off its NVSwitch)."""
    first, last = (0, tp * stages - 1) if to_first else (tp * stage, tp * (stage + 2) - 1)
    link = device.link
    if device.scale_out is None or first // link.max_chips == last // link.max_chips:
        return link
    return device.scale_out


def group_link(device: Device, chips: int) -> Link:
    """The link a collective of ``chips`` chips runs over: the link domain's, or the scale-out
    network's for a group larger than one domain (whose ``topology`` then sets its hops)."""
    domain = device.link
    return domain if chips <= domain.max_chips or device.scale_out is None else device.scale_out


def exchange_figures(device: Device, tp: int, ep: int, group: int) -> tuple[float, float, float]:
    """The link figures of an expert-parallel exchange (dispatch or combine) of expert group
    ``group``'s emulated chip (its rank 0), which trades token rows with rank 0 of each other
    group: chips ``j x tp`` for groups ``j``, numbered group by group, a link domain holding
    ``link.max_chips`` consecutive chips. Its peers in its own domain are reached over the
    domain's link, the others over the scale-out network, each peer taking an equal share of
    the rows (uniform routing): the exchange lasts as long as the slower share at its link's
    bandwidth, waits out the hops of every link it uses (the slowest's), and its bytes cost
    their links' energy. Returns the rate all its bytes move at (bytes/s), its latency (s) and
    its energy (J per byte). A group within one domain gets the domain's figures unchanged."""
    domain = device.link
    home = group * tp // domain.max_chips
    near = sum(1 for j in range(ep) if j != group and j * tp // domain.max_chips == home)
    far = ep - 1 - near
    hops = domain.latency_s * collective_steps(domain.topology, ep) + domain.collective_latency_s
    if far == 0 or device.scale_out is None:
        return domain.bandwidth, hops, domain.energy_j_per_byte
    out = device.scale_out
    out_hops = out.latency_s * collective_steps(out.topology, ep) + out.collective_latency_s
    peers = ep - 1
    seconds_per_byte = max(near / peers / domain.bandwidth, far / peers / out.bandwidth)
    return (1.0 / seconds_per_byte, max(out_hops, hops if near else 0.0),
            (near * domain.energy_j_per_byte + far * out.energy_j_per_byte) / peers)


# The op columns a collective's time depends on (its buffer, chips, passes and hops).
COLLECTIVE_COLUMNS = (k.C_M, k.C_K, k.C_ACT_BITS, k.C_CHIPS, k.C_PASSES, k.C_LINK_STEPS)


def collective_seconds(stack: Runtime, device: Device, row: np.ndarray) -> tuple[float, float]:
    """Bandwidth and latency time of the collective in op row ``row``, as the stack's library
    runs it (:func:`memsim.runtime.collective_time`), on the link domain or, for a group larger
    than one domain, over both levels: the scale-out network between domains (its bandwidth per
    chip) and the domain's link inside each (a tuned library's ring and tree steps, as NCCL's
    tuner counts them; a simple library's ring is flat over the network). A library without a
    tuning model of its own also pays the device file's collective start-up
    (``collective_latency``)."""
    chips = int(row[k.C_CHIPS])
    domain = device.link
    link = domain if chips <= domain.max_chips else device.scale_out
    kind = "all_reduce" if row[k.C_PASSES] == 2 else "all_gather"
    message_bytes = -(-int(row[k.C_M]) * int(row[k.C_K]) * int(row[k.C_ACT_BITS]) // 8)
    timed = collective_time(stack, kind, message_bytes, chips,
                            LIBRARY_LINK_KIND.get(link.kind or "", "other"), link.bandwidth,
                            link.latency_s, int(row[k.C_LINK_STEPS]),
                            chips_per_node=min(chips, domain.max_chips),
                            intra_link_kind=LIBRARY_LINK_KIND.get(domain.kind or "", "other"),
                            intra_link_latency_s=domain.latency_s)
    start_up = (link.collective_latency_s
                if collective_library(stack.collective.library).model == "simple" else 0.0)
    return timed.bandwidth_s, timed.latency_s + start_up


def distinct_rows(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows of ``keys`` ([row, column] ints) that differ: the index of each distinct row's
    first, in order of appearance, and each row's distinct row (an index into the first)."""
    kind_of: dict[tuple[int, ...], int] = {}
    firsts: list[int] = []
    kinds: list[int] = []
    for row, key in enumerate(map(tuple, keys.tolist())):
        kind = kind_of.get(key)
        if kind is None:
            kind = kind_of[key] = len(firsts)
            firsts.append(row)
        kinds.append(kind)
    return np.array(firsts, dtype=np.int64), np.array(kinds, dtype=np.int64)


def set_collective_times(stack: Runtime, device: Device, op_int: np.ndarray,
                         op_float: np.ndarray, collectives: np.ndarray, firsts: np.ndarray,
                         kind: np.ndarray) -> None:
    """Set the link times (:func:`collective_seconds`) of the collective op rows
    ``collectives``, priced once per kind (``firsts``: each kind's first, an index into
    ``collectives``; ``kind``: each row's), which must be alike in COLLECTIVE_COLUMNS, the
    figures a collective's time depends on."""
    if not len(collectives):
        return
    stack_id, device_id = _Identity(stack), _Identity(device)
    seconds = np.array([_priced_collective(stack_id, device_id, tuple(key)) for key in
                        op_int[collectives[firsts]][:, COLLECTIVE_COLUMNS].tolist()],
                       dtype=np.float64)
    op_float[collectives, k.F_LINK_S:k.F_LINK_LATENCY_S + 1] = seconds[kind]


@functools.lru_cache(maxsize=256)
def _priced_collective(stack: _Identity, device: _Identity,
                       key: tuple[int, ...]) -> tuple[float, float]:
    """:func:`collective_seconds` of a collective whose COLLECTIVE_COLUMNS are ``key``, once
    per stack and device object (the library's tuner weighs every algorithm and protocol, some
    50 us a call): a study's points of one batch share their collectives."""
    row = np.zeros(k.N_INT_COLS, dtype=np.int64)
    row[list(COLLECTIVE_COLUMNS)] = key
    return collective_seconds(stack.value, device.value, row)


def send_seconds(device: Device, stack: Runtime, row: Sequence[int], *, to_first: bool,
                 stage: int, stages: int, tp: int) -> tuple[float, float]:
    """A pipeline hand-off's bandwidth and latency time over the path the stack copies it on
    (:func:`memsim.handoff.handoff_seconds`: the link it crosses, or through the host): stage
    ``stage``'s activations to the next stage, or (``to_first``) the sampled tokens from the last
    stage back to the first, across the whole system."""
    return handoff_seconds(device, stack.pipeline,
                           handoff_link(device, tp, stage, stages, to_first=to_first),
                           row[k.C_M] * row[k.C_K] * row[k.C_ACT_BITS] / 8.0)


def activation_bits(path: MatmulPath, act_in: Format, stream: Format) -> int:
    """Bits per activation element a matmul reads: its activations' own format where the
    device quantizes them for it (W8A8, FP8: ``path.act_quant_ops_per_element``), else the
    stream's 16-bit format."""
    return act_in.element_bits if path.act_quant_ops_per_element else stream.element_bits


def kernel_columns(device: Device, path: MatmulPath, gemm: GemmTile | None) -> tuple[float, ...]:
    """A matmul row's float columns from F_GEMV on: the runtime's GEMV kernel's seconds per
    weight and bytes in flight (``path``), or, where the runtime runs the weights' format on a
    tensor-core GEMM kernel (``gemm``), that kernel's CTAs' bytes in flight in place of the
    GEMV's (zeros: no bound)."""
    if gemm is None:
        return path.gemv_s_per_weight
    return (path.gemv_s_per_weight[:-MLP_COLUMNS]
            + in_flight_columns(device.occupancy, gemm.in_flight))


def kv_dequant_ops(device: Device, kv: Format, stream: Format) -> float:
    """Vector operations per KV element attention spends converting the cache to the
    activations' type: none where both run in one type on ``device``."""
    if runtime_type(device, kv.compute)[0] == runtime_type(device, stream.compute)[0]:
        return 0.0
    return float(max(kv.dequant_ops, 1))


def act_reuse_tiles(device: Device, tile_n: int) -> int:
    """N tiles of ``tile_n`` columns fed by one read of a staged activation chunk: the device
    file's ``tile.activation_width`` (e.g. a cluster of CTAs sharing it by multicast), else the
    matrix unit's widest output (a Hopper warpgroup MMA spans N = 256, PTX ISA)."""
    return max(1, (device.activation_width or device.matrix_unit[1]) // tile_n)


# Tensors of one chip ----------------------------------------------------------------------

@dataclass(frozen=True)
class _Spec:
    """A tensor of one chip before placement: its shape and how it is cut into units."""

    name: str
    kind: str
    role: str
    layer: int
    fmt: Format
    rows: int           # output columns of a weight (N), embedding rows, or KV blocks
    k: int              # contraction length (weights), row bits (KV)
    units: int          # placement units: column tiles, embedding rows, KV blocks, 1 (norm)
    sequences: int = 0  # KV: sequences x KV heads of this chip
    expert: int = -1    # routed experts: the expert's id in its layer
    chunk: bool = False  # KV: the cache of the sequence whose prompt chunk rides in the step
    stored_as: str = ""  # weights: the checkpoint role its format is looked up under
    full_k: int = 0      # weights: the unsharded row length its format is looked up with

    def in_layer(self, layer: int) -> "_Spec":
        """The same tensor in ``layer`` (a layer of the same shape): its name and layer moved."""
        if layer == self.layer:
            return self
        return dataclasses.replace(self, name=layer_name(self.name, layer), layer=layer)


def layer_name(name: str, layer: int) -> str:
    """A layer tensor's name (``role.layer[.rest]``) with its layer changed to ``layer``."""
    parts = name.split(".")
    parts[1] = str(layer)
    return ".".join(parts)


class _Item(NamedTuple):
    """A pipeline item (the embedding, a layer, the head): its tensors as built for the first
    layer of its shape (``specs``, numbered ``shape``), which stand for ``layer``'s own."""

    specs: tuple[_Spec, ...]
    layer: int
    shape: int


@functools.lru_cache(maxsize=64)
def _homes(device: _Identity, policy: str) -> tuple[int, int, tuple[int, ...]]:
    """The policy's home tiers of weights and of KV caches on ``device.value``, as tier
    indices, and each tier's access granularity (once per device object: a device's tier
    look-ups walk its tiers by name)."""
    dev = device.value
    weights, kv = default_homes(dev, policy)
    return dev.tier_index(weights), dev.tier_index(kv), tuple(t.granularity for t in dev.tiers)


# Weights placed by rows (embedding rows, a norm's one vector) rather than by column tiles.
_ROW_UNIT_ROLES = ("embedding", "attn_norm", "ffn_norm", "final_norm")


class _Placer:
    """Gives each tensor spec its tiers: the policy's home, then the last matching rule."""

    def __init__(self, device: Device, model: Model, workload: Decode, policy: str,
                 rules: tuple[PlacementRule, ...], tile_n: int) -> None:
        self.device = device
        self.model = model
        self.workload = workload
        self.rules = rules
        self.tile_n = tile_n
        self.expert_rank = None
        if model.is_moe and any("experts" in rule.roles for rule in rules):
            probs = probabilities(model, workload.routing, workload.seed)
            # rank 0 is each layer's coldest expert
            self.expert_rank = np.argsort(np.argsort(probs, axis=1, kind="stable"), axis=1)
        weights, kv, self.granularity = _homes(_Identity(device), policy)
        self.homes = {"weight": weights, "kv": kv}

    def place(self, spec: _Spec) -> tuple[int, ...]:
        """Home, home_hi and split of ``spec``'s tensor, then its bytes on each tier."""
        default = self.homes[spec.kind]
        lo = hi = default
        split = 0
        # a tied LM head and its embedding are one table: a rule for either places both
        roles = [spec.role]
        if self.model.tied_embeddings and spec.role in ("embedding", "lm_head"):
            roles = ["embedding", "lm_head"]
        for rule in self.rules:
            if any(rule.matches(role, spec.layer, self.model.layers) for role in roles):
                lo, hi, split = self._apply(spec, rule, default)
        sequences = spec.sequences * self.model.kv_parts
        return (lo, hi, split) + _tier_bytes(
            self.granularity, self.workload.kv_block, self.tile_n, spec.kind,
            spec.role in _ROW_UNIT_ROLES, spec.fmt, spec.rows, spec.k, sequences, lo, hi, split)

    def place_placed(self, specs: list[_Spec], per_spec: np.ndarray, spec: np.ndarray,
                     layer: np.ndarray) -> tuple[np.ndarray, ...]:
        """Home, home_hi, split and bytes per tier ([tensor, tier]) of tensors ``spec`` (indices
        into ``specs``, placed as ``per_spec`` says: :meth:`place` of each) of layers
        ``layer``, with one :meth:`place` per tensor for the specs a layer-dependent rule may
        match."""
        out = per_spec[spec]
        if self.rules:
            by_layer = np.array([self._layer_dependent(s) for s in specs], dtype=bool)
            for t in np.flatnonzero(by_layer[spec]).tolist():
                out[t] = self.place(specs[spec[t]].in_layer(int(layer[t])))
        home, home_hi, split = np.ascontiguousarray(out[:, :3].T)   # one Numba array type
        return home, home_hi, split, out[:, 3:]

    def _layer_dependent(self, spec: _Spec) -> bool:
        """True when a rule may place ``spec``'s tensor differently in another layer."""
        roles = {spec.role}
        if self.model.tied_embeddings and spec.role in ("embedding", "lm_head"):
            roles = {"embedding", "lm_head"}
        return spec.layer >= 0 and any(
            roles & set(rule.roles) and (rule.first is not None or rule.last is not None
                                         or spec.role == "experts") for rule in self.rules)

    def _apply(self, spec: _Spec, rule: PlacementRule, default: int) -> tuple[int, int, int]:
        target = self.device.tier_index(rule.tier)
        if spec.role == "experts":        # the coldest share of the layer's experts, whole
            cold = math.ceil(rule.fraction * self.model.experts - 1e-9)
            rank = self.expert_rank[spec.layer - self.model.dense_layers, spec.expert]
            return (target, target, 0) if rank < cold else (default, default, 0)
        far = math.ceil(rule.fraction * spec.units - 1e-9)
        if far >= spec.units or target == default:
            return target, target, 0
        if spec.kind == "kv" and target > default:     # the oldest blocks go further out
            return target, default, far
        if spec.kind == "kv":                           # the most recent blocks come nearer
            return default, target, spec.units - far
        split = spec.units - far
        if spec.role == "embedding":     # whole column tiles of a tied LM head
            split -= split % self.tile_n
        return default, target, split


@functools.lru_cache(maxsize=4096)
def _tier_bytes(granularity: tuple[int, ...], kv_block: int, tile_n: int, kind: str,
                by_rows: bool, fmt: Format, rows: int, k: int, streams: int, lo: int, hi: int,
                split: int) -> tuple[int, ...]:
    """Bytes on each tier of a tensor whose units below ``split`` live on ``lo``, the rest on
    ``hi``: a KV cache of ``rows`` blocks of ``streams`` streams (sequences x heads x parts)
    of ``k``-bit rows, or a weight of ``rows`` columns (``by_rows``: embedding rows or a
    norm's vector; else column tiles of ``tile_n``) of length ``k``."""
    out = [0] * len(granularity)
    if kind == "kv":
        near = min(split, rows)
        for tier, blocks in ((lo, near), (hi, rows - near)):
            out[tier] += streams * blocks * kv_block_bytes(k, kv_block, granularity[tier])
        return tuple(out)
    cols = min(rows, split if by_rows else split * tile_n)
    total = fmt.tensor_bits((rows, k))
    lo_bits = fmt.tensor_bits((cols, k)) if cols else 0
    out[lo] += -(-lo_bits // 8)
    out[hi] += -(-(total - lo_bits) // 8)
    return tuple(out)


@dataclass(frozen=True)
class TensorTable:
    """The tensors of one chip as columns, one row per tensor (the order of the op table's
    ``C_TENSOR`` ids): each row's spec (``specs[spec]`` as built for the first layer of its
    shape, standing for ``layer``'s own), placement and bytes per tier.
    :meth:`tensors` builds the :class:`Tensor` objects."""

    specs: tuple[_Spec, ...]
    spec: np.ndarray           # [tensor] index into specs
    layer: np.ndarray          # [tensor]
    item: np.ndarray           # [tensor] index of its pipeline item among those placed
    home: np.ndarray           # [tensor]
    home_hi: np.ndarray        # [tensor]
    split: np.ndarray          # [tensor]
    pinned: np.ndarray         # [tensor] bool
    aliased: np.ndarray        # [tensor] bool
    tier_bytes: np.ndarray     # [tensor, tier]
    block_start: np.ndarray    # [1 + microbatch, item + 1]: first id of each item's weights
    #                            (row 0) and of each microbatch's KV caches (row 1 + micro)

    def __len__(self) -> int:
        return len(self.spec)

    def ids(self, item: int, micro: int) -> list[int]:
        """Ids of item ``item``'s weights (``micro=-1``) or of microbatch ``micro``'s caches."""
        row = self.block_start[micro + 1]
        return list(range(row[item], row[item + 1]))

    def id_matrix(self, items: np.ndarray, micro: int) -> np.ndarray:
        """[item, slot] the ids of each of ``items`` (items of one shape) as :meth:`ids` of its
        weights and then microbatch ``micro``'s caches lists them."""
        parts = []
        for row in (0, micro + 1):
            start = self.block_start[row, items]
            width = self.block_start[row, items[0] + 1] - start[0]
            parts.append(start[:, None] + np.arange(width))
        return np.concatenate(parts, axis=1)

    @functools.cached_property
    def next_layer(self) -> np.ndarray:
        """[tensor] the id of the same spec's tensor (the same microbatch's, for a cache) in the
        next layer, -1 when there is none; a tensor outside the layers is its own."""
        return _next_layer(self.spec, self.layer, self.block_start)

    def name(self, i: int) -> str:
        """Tensor ``i``'s name."""
        spec = self.specs[self.spec[i]]
        return spec.name if spec.layer == self.layer[i] else layer_name(spec.name, self.layer[i])

    def fmt(self, i: int) -> Format:
        """Tensor ``i``'s storage format."""
        return self.specs[self.spec[i]].fmt

    def has_role(self, role: str) -> np.ndarray:
        """[tensor] True where the tensor's role is ``role``."""
        return np.array([s.role == role for s in self.specs], dtype=bool)[self.spec]

    @functools.cached_property
    def is_weight(self) -> np.ndarray:
        """[tensor] True for a weight, False for a KV cache (read-only)."""
        return _read_only(np.array([s.kind == "weight" for s in self.specs], dtype=bool)[self.spec])

    def held(self, weights: bool) -> np.ndarray:
        """Bytes per tier of the weights (else the KV caches), an aliased tensor not counted."""
        return self._held_by_kind[0 if weights else 1].copy()

    def need(self) -> dict[int, int]:
        """Bytes each tier stores, an aliased tensor not counted."""
        weights, kv = self._held_by_kind
        return dict(enumerate((weights + kv).tolist()))

    @functools.cached_property
    def _held_by_kind(self) -> tuple[np.ndarray, np.ndarray]:
        """Bytes per tier of the weights and of the KV caches, an aliased tensor not counted
        (exact integer sums: their sum is every live tensor's)."""
        weights, kv = held_bytes(np.ascontiguousarray(self.tier_bytes),   # one Numba type
                                 np.ascontiguousarray(self.aliased), self.is_weight)
        return weights, kv

    def item_bytes(self, items: int) -> list[tuple[int, ...]]:
        """Bytes per tier of each of ``items`` pipeline items, aliasing ignored."""
        out = np.zeros((items, self.tier_bytes.shape[1]), dtype=np.int64)
        np.add.at(out, self.item, self.tier_bytes)
        return [tuple(int(b) for b in row) for row in out]

    def pinned_bytes(self) -> int:
        """Bytes of the pinned tensors, an aliased tensor not counted."""
        return int(self.tier_bytes[self.pinned & ~self.aliased].sum())

    def placed(self) -> np.ndarray:
        """[tensor, column]: TENSOR_COLUMNS of each tensor (home, home_hi, split, pinned)."""
        return np.stack([self.home, self.home_hi, self.split, self.pinned.astype(np.int64)],
                        axis=1)

    def tensors(self) -> tuple[Tensor, ...]:
        """The tensors as objects, in id order."""
        return tuple(self._tensor(i) for i in range(len(self)))

    def _tensor(self, i: int) -> Tensor:
        spec = self.specs[self.spec[i]].in_layer(int(self.layer[i]))
        home = int(self.home[i])
        tier_bytes = tuple((tier, int(b)) for tier, b in enumerate(self.tier_bytes[i]) if b)
        return Tensor(spec.name, spec.kind, spec.role, spec.layer, home, int(self.home_hi[i]),
                      int(self.split[i]), tier_bytes or ((home, 0),), bool(self.pinned[i]),
                      bool(self.aliased[i]), spec.fmt)

    def with_tensors(self, tensors: Sequence[Tensor]) -> "TensorTable":
        """The same rows placed as ``tensors`` say (after a pass over the objects)."""
        tier_bytes = np.zeros_like(self.tier_bytes)
        for i, tensor in enumerate(tensors):
            for tier, nbytes in tensor.tier_bytes:
                tier_bytes[i, tier] += nbytes
        columns = {name: np.array([getattr(t, name) for t in tensors],
                                  dtype=bool if name in ("pinned", "aliased") else np.int64)
                   for name in ("home", "home_hi", "split", "pinned", "aliased")}
        return dataclasses.replace(self, tier_bytes=tier_bytes, **columns)


def _next_layer(spec: np.ndarray, layer: np.ndarray, block_start: np.ndarray) -> np.ndarray:
    """:attr:`TensorTable.next_layer` of a table's rows (their specs, layers and blocks)."""
    n = len(spec)
    row = np.searchsorted(block_start[:, 0], np.arange(n), side="right")
    order = np.lexsort((layer, row, spec))
    nxt = np.full(n, -1, dtype=np.int64)
    a, b = order[:-1], order[1:]
    follows = (spec[a] == spec[b]) & (row[a] == row[b]) & (layer[b] == layer[a] + 1)
    nxt[a[follows]] = b[follows]
    outside = layer < 0
    nxt[outside] = np.flatnonzero(outside)
    return nxt


def _share_next_layer(table: TensorTable, next_layer: np.ndarray) -> None:
    """Give ``table`` a table's :attr:`TensorTable.next_layer` computed for the same rows
    (rows of one frame; a replace() of placement columns keeps them)."""
    table.__dict__["next_layer"] = next_layer


def place_items(placer: _Placer, items: Sequence[_Item], kv_heads: int,
                microbatch: int | None = None, microbatches: int = 1,
                shape_key: tuple | None = None, shape_hash: int | None = None,
                tied: bool = False) -> TensorTable:
    """Place the tensors of ``items``: every weight once, in item order, then each microbatch's
    KV caches (``microbatch`` sequences each, a prompt chunk's one; as the specs say when None);
    with ``tied``, a tied LM head stored as its embedding's table (:func:`_alias_head`).

    A tensor's placement is computed once per spec unless a placement rule names a layer range
    or experts, which place each layer's tensor on its own. ``shape_key`` names everything the
    items and the placer depend on besides the batch and the context (``shape_hash``: its hash,
    when the caller has it): with it and no placement
    rule, the table's frame and its weights' placement are kept per process
    (:class:`_TableFrame`) and only the KV caches are placed here."""
    if shape_key is None or placer.rules:
        return _TableFrame.of(placer, items, kv_heads, microbatch, microbatches).table(
            placer, items, kv_heads, microbatch, tied)
    key = _Keyed(shape_key, kv_heads, microbatches, microbatch is None,
                 shape_hash=shape_hash)
    key.build = lambda: _TableFrame.of(placer, items, kv_heads, microbatch, microbatches)
    return _table_frame(key).table(placer, items, kv_heads, microbatch, tied)


@dataclass(frozen=True)
class _TableFrame:
    """What a TensorTable's rows are, and the weights' placement: the same for every batch and
    context of one stage (read-only arrays). A KV cache's spec and placement depend on them:
    ``kv_source`` says where each KV spec comes from (item, spec in it, microbatch)."""

    specs: tuple[_Spec, ...]
    per_spec: np.ndarray        # [spec, 3 + tier] place() of each spec (a KV spec's as built)
    kv_source: tuple[tuple[int, int, int, int], ...]   # (spec id, item, spec in item, micro)
    spec: np.ndarray
    layer: np.ndarray
    item: np.ndarray
    block_start: np.ndarray

    @classmethod
    def of(cls, placer: _Placer, items: Sequence[_Item], kv_heads: int,
           microbatch: int | None, microbatches: int) -> "_TableFrame":
        position: dict[int, int] = {}    # each shape's position among the distinct shapes
        first: list[int] = []            # the first item of each distinct shape
        for i, one in enumerate(items):
            if one.shape not in position:
                position[one.shape] = len(first)
                first.append(i)
        of_item = np.array([position[one.shape] for one in items], dtype=np.int64)
        specs: list[_Spec] = []
        kv_source: list[tuple[int, int, int, int]] = []
        # per block row (the weights, then each microbatch) and distinct shape: its first spec
        # id and how many specs it has
        first_id = np.zeros((microbatches + 1, len(first)), dtype=np.int64)
        count = np.zeros_like(first_id)
        for row, micro in enumerate(range(-1, microbatches)):       # -1: the weights
            for j, f in enumerate(first):
                chosen = [(n, s) for n, s in enumerate(items[f].specs)
                          if (s.kind == "weight") == (micro < 0)]
                first_id[row, j], count[row, j] = len(specs), len(chosen)
                for n, s in chosen:
                    if s.kind == "kv":
                        kv_source.append((len(specs), f, n, micro))
                    specs.append(_kv_spec(s, micro, kv_heads, microbatch))
        sizes = count[:, of_item]                       # [block row, item]
        flat = sizes.ravel()
        ends = np.cumsum(flat)
        starts = ends - flat
        block_start = np.hstack([starts.reshape(sizes.shape),
                                 ends.reshape(sizes.shape)[:, -1:]])
        spec = (np.arange(int(ends[-1]) if len(ends) else 0, dtype=np.int64)
                + np.repeat(first_id[:, of_item].ravel() - starts, flat))
        layer = np.repeat(np.array([item.layer for item in items] * (microbatches + 1),
                                   dtype=np.int64), flat)
        item = np.repeat(np.arange((microbatches + 1) * len(items)) % max(len(items), 1), flat)
        width = 3 + len(placer.granularity)
        per_spec = np.array([placer.place(s) if s.kind == "weight" else (0,) * width
                             for s in specs], dtype=np.int64).reshape(-1, width)
        return cls(tuple(specs), _read_only(per_spec), tuple(kv_source), _read_only(spec),
                   _read_only(layer), _read_only(item), _read_only(block_start))

    def table(self, placer: _Placer, items: Sequence[_Item], kv_heads: int,
              microbatch: int | None, tied: bool = False) -> TensorTable:
        """The placed table of ``items`` (this frame's, with their KV caches' blocks and
        sequences); with ``tied``, its LM head aliased to its embedding (:func:`_alias_head`)."""
        specs = list(self.specs)
        per_spec = self.per_spec.copy()
        for at, f, n, micro in self.kv_source:
            specs[at] = _kv_spec(items[f].specs[n], micro, kv_heads, microbatch)
            per_spec[at] = placer.place(specs[at])
        home, home_hi, split, tier_bytes = placer.place_placed(specs, per_spec, self.spec,
                                                               self.layer)
        n = len(self.spec)
        aliased = np.zeros(n, dtype=bool)
        if tied and self.tied_head is not None:     # the columns are this table's own
            _alias_head(self.tied_head, placer.tile_n, home, home_hi, split, tier_bytes, aliased)
        table = TensorTable(tuple(specs), self.spec, self.layer, self.item, home, home_hi,
                            split, np.zeros(n, dtype=bool), aliased, tier_bytes,
                            self.block_start)
        _share_next_layer(table, self.next_layer.copy())   # the kernels take writable arrays
        table.__dict__["is_weight"] = self.is_weight        # what TensorTable.is_weight gives
        return table

    @functools.cached_property
    def next_layer(self) -> np.ndarray:
        """:attr:`TensorTable.next_layer` of every table of this frame (read-only)."""
        return _read_only(_next_layer(self.spec, self.layer, self.block_start))

    @functools.cached_property
    def is_weight(self) -> np.ndarray:
        """:attr:`TensorTable.is_weight` of every table of this frame (read-only: a KV spec
        set for a batch and context stays a KV spec)."""
        return _read_only(np.array([s.kind == "weight" for s in self.specs], dtype=bool)[self.spec])

    @functools.cached_property
    def tied_head(self) -> tuple[int, int] | None:
        """Ids of the first embedding and the first LM head tensor, None without both."""
        roles = np.array([s.role for s in self.specs])[self.spec]
        embedding = np.flatnonzero(roles == "embedding")
        head = np.flatnonzero(roles == "lm_head")
        if not len(embedding) or not len(head):
            return None
        return int(embedding[0]), int(head[0])


@functools.lru_cache(maxsize=128)
def _table_frame(key: "_Keyed") -> _TableFrame:
    return key.built()


def _alias_head(pair: tuple[int, int], tile_n: int, home: np.ndarray, home_hi: np.ndarray,
                split: np.ndarray, tier_bytes: np.ndarray, aliased: np.ndarray) -> None:
    """A tied LM head stored as its embedding's table (``pair``: their tensor ids), in a table's
    columns: the same tiers and bytes, split in whole column tiles, and not counted twice
    (``aliased``)."""
    e, h = pair
    home[h], home_hi[h], split[h] = home[e], home_hi[e], split[e] // tile_n
    tier_bytes[h], aliased[h] = tier_bytes[e], True


def _kv_spec(spec: _Spec, micro: int, kv_heads: int, microbatch: int | None) -> _Spec:
    """A KV spec as microbatch ``micro`` holds it (a weight's spec unchanged)."""
    if spec.kind != "kv":
        return spec
    if microbatch is not None:
        sequences = (1 if spec.chunk else microbatch) * kv_heads
        if spec.sequences != sequences:
            spec = dataclasses.replace(spec, sequences=sequences)
    if micro:
        spec = dataclasses.replace(spec, name=f"{spec.name}.mb{micro}")
    return spec


# A checkpoint's format of a tensor depends only on these arguments (WeightFormats is frozen):
# a warm process asks once per distinct tensor, not once per tensor of every plan.
_weight_formats = functools.lru_cache(maxsize=256)(weight_formats)


@functools.lru_cache(maxsize=65536)
def _format_for(formats: WeightFormats, role: str, layer: int, layers: int, n_experts: int,
                tied: bool, k: int) -> Format:
    return formats.for_tensor(role, layer, layers, n_experts=n_experts, tied=tied, k=k)


def _item_specs(model: Model, workload: Decode, sh: Shard, tile_n: int, final_tokens: int,
                sequences: int, experts: range | None = None,
                replicate: bool = True) -> list[_Item]:
    """The tensors of one chip, grouped into pipeline items: the embedding, each layer, the
    head (final norm and LM head). KV specs cover ``sequences`` sequences; an MoE layer holds
    the routed ``experts`` (all of them unless given) and the shared ones.

    A layer whose kind and formats match an earlier layer's shares its specs (``_Item.shape``);
    without ``replicate`` every layer is built on its own (the reference, test_plan_shapes).
    The items depend on the batch and context only through each layer's KV cache: they are
    built once per process for the rest (:func:`_shaped_items`) and the caches' blocks and
    sequences set here."""
    chunk_blocks = (-(-(workload.prefill_context + workload.steps * workload.prefill_chunk)
                      // workload.kv_block) if workload.prefill_chunk else 0)
    items = _shaped_items(model, workload.weights, workload.kv, workload.activations,
                          chunk_blocks, workload.draft_heads, sh, tile_n, experts, replicate)
    blocks = -(-final_tokens // workload.kv_block)
    return _with_kv_blocks(items, blocks, sequences * sh.kv_heads)


def _with_kv_blocks(items: tuple[_Item, ...], blocks: int, streams: int) -> list[_Item]:
    """``items`` with each layer's KV cache (not a prompt chunk's) of ``blocks`` blocks for
    ``streams`` sequences x KV heads; items of one shape keep sharing their specs."""
    groups, group_of = _kv_groups(_Identity(items))
    swapped = [specs if not kv_at else _with_specs(specs, kv_at, blocks, streams)
               for specs, kv_at in groups]
    new = tuple.__new__      # _Item's own constructor, without its per-call argument handling
    return [item if swapped[g] is item.specs else new(_Item, (swapped[g], item.layer, item.shape))
            for item, g in zip(items, group_of)]


@functools.lru_cache(maxsize=256)
def _kv_groups(key: _Identity) -> tuple[tuple[tuple[tuple[_Spec, ...], tuple[int, ...]], ...],
                                        tuple[int, ...]]:
    """Of the items ``key`` names (a cached :func:`_shaped_items` value): each distinct specs
    tuple with the positions of its layer KV caches (not a prompt chunk's), and each item's
    tuple among them."""
    index: dict[int, int] = {}
    groups = []
    for item in key.value:
        if id(item.specs) not in index:
            index[id(item.specs)] = len(groups)
            groups.append((item.specs, tuple(i for i, s in enumerate(item.specs)
                                             if s.kind == "kv" and not s.chunk)))
    return tuple(groups), tuple(index[id(item.specs)] for item in key.value)


def _with_specs(specs: tuple[_Spec, ...], kv_at: tuple[int, ...], blocks: int,
                streams: int) -> tuple[_Spec, ...]:
    """``specs`` with the KV caches at ``kv_at`` of ``blocks`` blocks for ``streams`` streams
    (each a copy of the frozen spec with those fields: what dataclasses.replace builds)."""
    out = list(specs)
    for i in kv_at:
        spec = object.__new__(_Spec)
        spec.__dict__.update(specs[i].__dict__, rows=blocks, units=blocks, sequences=streams)
        out[i] = spec
    return tuple(out)


@functools.lru_cache(maxsize=256)
def _shaped_items(model: Model, weights: object, kv: str, activations: str, chunk_blocks: int,
                  draft_heads: int, sh: Shard, tile_n: int, experts: range | None,
                  replicate: bool) -> tuple[_Item, ...]:
    """The items of :func:`_item_specs` with every layer's KV cache empty (no blocks, no
    sequences): what depends on the model, the formats and the shard, not on the batch or the
    context (immutable values, shared by every plan of a process)."""
    experts = range(model.experts) if experts is None else experts
    formats = _weight_formats(weights)
    n_experts = model.experts if model.is_moe else 0
    act = _stream_type(activations)
    kvfmt = get_format(kv)
    h, hd = model.hidden, model.head_dim
    row_bits = kv_row_bits(model, kvfmt)

    def fmt(stored_as: str, layer: int, full_k: int) -> Format:
        """The checkpoint's format of a tensor (``full_k``: its unsharded row length)."""
        return _format_for(formats, stored_as, layer, model.layers, n_experts,
                           model.tied_embeddings, full_k)

    def weight(role: str, layer: int, n: int, kk: int, name: str = "", stored_as: str = "",
               full_k: int = 0) -> _Spec:
        name = name or (f"{role}.{layer}" if layer >= 0 else role)
        stored_as, full_k = stored_as or role, full_k or h
        return _Spec(name, "weight", role, layer, fmt(stored_as, layer, full_k), n, kk,
                     -(-n // tile_n), stored_as=stored_as, full_k=full_k)

    def qkv(layer: int) -> list[_Spec]:
        if not _qkv_splits(formats, model.layers, n_experts, h)[layer]:
            return [weight("qkv", layer, (sh.heads + 2 * sh.kv_heads) * hd, h)]
        return [weight("qkv", layer, heads * hd, h, name=f"{part}.{layer}", stored_as=part)
                for part, heads in (("q", sh.heads), ("k", sh.kv_heads), ("v", sh.kv_heads))]

    def norm(role: str, layer: int, name: str = "", width: int = 0) -> _Spec:
        name = name or (f"{role}.{layer}" if layer >= 0 else role)
        return _Spec(name, "weight", role, layer, act, 1, width or h, 1)

    def mla(layer: int) -> list[_Spec]:
        """MLA's tensors before the cache, absorbed as engines run it at decode (``mla_in``
        in :func:`_plan_stage`): the query's projections, ``kv_a``, and kv_b's key half as
        ``w_uk`` (per head, nope x kv_lora_rank, applied to the query); kv_b's value half is
        ``w_uv``, after attention. ``q_a`` and ``kv_a`` are whole on every chip (vLLM's and
        SGLang's ``ReplicatedLinear``); the others are split by heads."""
        rank, nope = model.kv_lora_rank, model.qk_nope_head_dim
        q_out = sh.heads * (nope + model.qk_rope_head_dim)
        if model.q_lora_rank:
            q = [weight("qkv", layer, model.q_lora_rank, h, name=f"q_a.{layer}", stored_as="q"),
                 norm("attn_norm", layer, f"q_a_norm.{layer}", model.q_lora_rank),
                 weight("qkv", layer, q_out, model.q_lora_rank, name=f"q_b.{layer}",
                        stored_as="q", full_k=model.q_lora_rank)]
        else:
            q = [weight("qkv", layer, q_out, h, name=f"q_proj.{layer}", stored_as="q")]
        return [*q, weight("qkv", layer, rank + model.qk_rope_head_dim, h, name=f"kv_a.{layer}",
                           stored_as="k"),
                norm("attn_norm", layer, f"kv_a_norm.{layer}", rank),
                weight("qkv", layer, sh.heads * rank, nope, name=f"w_uk.{layer}", stored_as="k",
                       full_k=nope)]

    def layer_specs(layer: int) -> list[_Spec]:
        chunk_kv = [_Spec(f"chunk_kv.{layer}", "kv", "kv", layer, kvfmt, chunk_blocks,
                          row_bits, chunk_blocks, sh.kv_heads, chunk=True)
                    ] if chunk_blocks else []
        value = model.v_head_dim if model.is_mla else hd      # an output head's width
        item = [
            norm("attn_norm", layer),
            *(mla(layer) if model.is_mla else qkv(layer)),
            _Spec(f"kv.{layer}", "kv", "kv", layer, kvfmt, 0, row_bits, 0, 0),
            *chunk_kv,
            *([weight("qkv", layer, sh.heads * value, model.kv_lora_rank, name=f"w_uv.{layer}",
                      stored_as="v", full_k=model.kv_lora_rank)] if model.is_mla else []),
            weight("o_proj", layer, h, sh.heads * value, full_k=model.heads * value),
            norm("ffn_norm", layer),
        ]
        if model.is_moe_layer(layer):
            item.append(weight("router", layer, model.experts, h))
            for e in experts:
                for name, n, kk in (("gate", sh.ffn, h), ("up", sh.ffn, h), ("down", h, sh.ffn)):
                    spec = weight("experts", layer, n, kk, name=f"expert_{name}.{layer}.{e}",
                                  stored_as=f"expert_{name}",
                                  full_k=model.ffn if name == "down" else h)
                    item.append(dataclasses.replace(spec, expert=e))
            for i in range(model.shared_experts):
                for name, n, kk in (("gate", sh.ffn, h), ("up", sh.ffn, h), ("down", h, sh.ffn)):
                    item.append(weight("shared_experts", layer, n, kk,
                                       name=f"shared_{name}.{layer}.{i}",
                                       stored_as=f"shared_{name}",
                                       full_k=model.ffn if name == "down" else h))
        else:
            width = sh.dense_ffn if model.is_moe else sh.ffn
            full_width = (model.dense_ffn or model.ffn) if model.is_moe else model.ffn
            item += [weight("gate", layer, width, h), weight("up", layer, width, h),
                     weight("down", layer, h, width, full_k=full_width)]
        return item

    head = [norm("final_norm", -1), weight("lm_head", -1, sh.vocab_rows, h)]
    for i in range(draft_heads):
        head.append(weight("draft_head", -1, h, h, name=f"draft_head_res.{i}"))
        head.append(weight("draft_head", -1, sh.vocab_rows, h, name=f"draft_head_lm.{i}"))
    embedding = _Spec("embedding", "weight", "embedding", -1, fmt("embedding", -1, h),
                      sh.vocab_rows, h, sh.vocab_rows)
    layers = _layer_items(model, formats, layer_specs, replicate)
    return (_Item((embedding,), -1, 0), *layers, _Item(tuple(head), -1, model.layers + 1))


def _layer_items(model: Model, formats: WeightFormats, layer_specs, replicate: bool) -> list[_Item]:
    """Each layer's item: a layer of the same kind (dense or MoE; fused or split QKV) whose
    weights have the same formats as an earlier one's shares its specs (``layer_specs(layer)``
    builds a layer's own); without ``replicate`` each layer is built."""
    n_experts = model.experts if model.is_moe else 0
    splits = (_qkv_splits(formats, model.layers, n_experts, model.hidden) if not model.is_mla
              else (False,) * model.layers)
    kinds = [(model.is_moe_layer(layer), splits[layer]) if replicate else (layer,)
             for layer in range(model.layers)]
    classes: dict[tuple, dict[int, int]] = {}       # per kind: each layer's format class
    shapes: dict[tuple, _Item] = {}
    items = []
    for layer, kind in enumerate(kinds):
        if kind not in classes:      # a kind's first layer: its specs say what formats to ask
            specs = tuple(layer_specs(layer))
            lookups = tuple({(s.stored_as, s.full_k): None for s in specs
                             if s.kind == "weight" and s.stored_as})
            same_kind = tuple(i for i, other in enumerate(kinds) if other == kind)
            classes[kind] = _format_classes(formats, model.layers, n_experts,
                                            model.tied_embeddings, lookups, same_kind)
            shapes[kind, classes[kind][layer]] = _Item(specs, layer, layer + 1)
        key = (kind, classes[kind][layer])
        found = shapes.get(key)
        if found is None:
            found = shapes[key] = _Item(tuple(layer_specs(layer)), layer, layer + 1)
        items.append(_Item(found.specs, layer, found.shape))
    return items


@functools.lru_cache(maxsize=256)
def _format_classes(formats: WeightFormats, layers: int, n_experts: int, tied: bool,
                    lookups: tuple[tuple[str, int], ...],
                    of_layers: tuple[int, ...]) -> dict[int, int]:
    """Each of ``of_layers``' class: layers of one class have the same checkpoint format for
    every ``(stored_as, full_k)`` lookup (read-only: the dict is shared by every caller)."""
    seen: list[tuple[Format, ...]] = []
    out = {}
    for layer in of_layers:
        found = tuple(_format_for(formats, stored_as, layer, layers, n_experts, tied, full_k)
                      for stored_as, full_k in lookups)
        if found not in seen:
            seen.append(found)
        out[layer] = seen.index(found)
    return out


@functools.lru_cache(maxsize=256)
def _qkv_splits(formats: WeightFormats, layers: int, n_experts: int, k: int) -> tuple[bool, ...]:
    """[layer] True where q, k and v differ in format (three matmuls, not one fused QKV)."""
    return tuple(formats.qkv_split(layer, layers, n_experts=n_experts, k=k)
                 for layer in range(layers))


# The system plan ----------------------------------------------------------------------------

def make_plan(device: Device, model: Model, workload: Decode, stage: int = 0) -> Plan:
    """The plan of one pipeline stage (one chip of its tensor-parallel group)."""
    return plan_system(device, model, workload).stages[stage]


def plan_system(device: Device, model: Model, workload: Decode) -> SystemPlan:
    """Place, shard and lower one decode step; raises CapacityError when it does not fit.

    The ``auto`` policy takes the device's own; when that does not fit and the device has a
    slower tier to spill to, it takes ``tiered``.
    """
    check_sizes(device, model, workload)
    _check_window(model, workload)
    _check_mla_prompt(model, workload)
    if not model.is_moe and workload.routing != "uniform":
        raise ConfigError(f"routing {workload.routing!r} chooses experts, and {model.name} is "
                          "dense: it has none to route to", field="routing")
    if workload.policy != "auto":
        return _plan_policy(device, model, workload, workload.policy)
    try:
        return _plan_policy(device, model, workload, device.layout.policy)
    except CapacityError:
        if "tiered" not in policies(device):
            raise
        return _plan_policy(device, model, workload, "tiered")


def _check_window(model: Model, workload: Decode) -> None:
    """Sliding-window attention is not modelled: a sequence may not outgrow the window."""
    limit = model.whole_context_limit
    tokens = max(workload.context + workload.steps * workload.new_tokens,
                 workload.prefill_context + workload.steps * workload.prefill_chunk)
    if limit is not None and tokens > limit:
        raise ConfigError(f"{model.name} attends to a sliding window of {limit} tokens on "
                          f"{len(model.window_layers)} of {model.layers} layers; memsim does not "
                          f"model windows yet, so a sequence may hold at most {limit} tokens, "
                          f"got {tokens}", field="context")


def _check_mla_prompt(model: Model, workload: Decode) -> None:
    """MLA is lowered in its absorbed decode form; a prompt is not (engines decompress the
    latent into per-head K and V for prefill, a different kernel), so it is refused."""
    if model.is_mla and workload.carries_prompt:
        what = "a prefill" if workload.prefill else "a prompt chunk (prefill_chunk)"
        raise ConfigError(f"{model.name} uses multi-head latent attention, which memsim models "
                          "in its absorbed decode form only; serving engines run a prompt with "
                          "the latent decompressed into per-head K and V (a different kernel "
                          f"and FLOP count), so {what} is not modelled for it yet",
                          field="prefill" if workload.prefill else "prefill_chunk")


def _check_chips(device: Device, workload: Decode) -> None:
    if workload.chips == 1:
        return
    if device.link is None:
        raise ConfigError(f"{device.name} has no chip-to-chip link in its device file, so it "
                          f"runs on one chip; got tp={workload.tp}, pp={workload.pp}, "
                          f"ep={workload.ep}", file=device.file,
                          field="ep" if workload.ep > 1 else "tp")
    reach = device.link.max_chips if device.scale_out is None else device.scale_out.max_chips
    if workload.chips > reach:
        ranks = tp_ranks_per_chip(device)
        hint = (f"; tp counts chips, and each {device.name} chip runs {ranks} tensor-parallel "
                f"ranks (one per {device.core_name}): {workload.tp} ranks are "
                f"tp={workload.tp // ranks}" if ranks > 1 and workload.tp % ranks == 0 else "")
        where = ("one link domain connects (link.max_chips)" if device.scale_out is None
                 else "its scale-out network reaches (scale_out.max_chips)")
        raise ConfigError(f"tp x pp x ep = {workload.chips} chips exceeds the {reach} "
                          f"chips {device.name}'s {where}{hint}", file=device.file,
                          field="tp" if workload.tp > reach else "pp")


def tp_ranks_per_chip(device: Device) -> int:
    """Tensor-parallel ranks one chip runs: its engine shards over cores when the device file's
    link says so (``link.ranks_per_chip``; AWS Neuron runs one rank per NeuronCore, two per
    Inferentia2 chip), else one rank per chip. Head and FFN padding follow the ranks."""
    return 1 if device.link is None else device.link.ranks_per_chip


def _check_expert_parallel(model: Model, workload: Decode) -> None:
    """Expert parallel composes with tensor parallel (``ep`` groups of ``tp`` chips); a
    pipeline of expert-parallel groups is refused."""
    if workload.ep == 1:
        return
    if not model.is_moe:
        raise ConfigError(f"expert parallel needs an MoE model; {model.name} is dense",
                          field="ep")
    if workload.pp > 1 or workload.microbatches > 1:
        raise ConfigError("expert parallel combined with pipeline stages (or microbatches) is "
                          "not modelled yet: the step of side-by-side expert groups waits at "
                          "every layer, a pipeline only at its stages; use ep with tp",
                          field="ep")
    for what, count in (("experts", model.experts), ("batch", workload.batch)):
        if count % workload.ep:
            raise ConfigError(f"ep {workload.ep} must divide the {what} ({count})", field="ep")


def fold_pipeline(model: Model, workload: Decode, device: Device | None = None,
                  policy: str = "sram-resident") -> Decode:
    """The workload with a pipeline longer than the model folded into tensor parallel stages.

    A pipeline has at most one stage per item (the embedding, each layer, the head). A ``pp``
    above that states the chip count: ``tp x pp`` chips become ``tp * f`` chips per stage and
    ``pp / f`` stages. ``f`` is the smallest factor of ``pp`` that leaves at most one stage per
    item and, given a ``device``, whose stages hold their bytes (a balanced cut fits), taking a
    fold the model's query heads and FFN divide before one that pads them; with no such fold, the
    smallest (the capacity check then says what is short). GroqCloud's 576-chip Llama 2 70B
    is ``pp=576`` (8 chips per stage, 72 stages); Llama 3.1 70B's 128K-vocabulary BF16
    embedding (2.1 GB) needs 16 chips per stage to fit 230 MB each (36 stages). Cerebras'
    wafers, each larger than a layer, stay one wafer per stage. A ``microbatches`` left to its
    default is re-derived for the folded pipeline.
    """
    items = model.layers + 2
    pp = workload.pp
    if pp <= items:
        return workload
    folds = [f for f in range(2, pp + 1) if pp % f == 0 and pp // f <= items]
    default = dataclasses.replace(workload, microbatches=None).microbatches
    microbatches = None if workload.microbatches == default else workload.microbatches
    candidates = [dataclasses.replace(workload, tp=workload.tp * f, pp=pp // f,
                                      microbatches=microbatches) for f in folds]
    if device is None:
        return candidates[0]
    ranks = tp_ranks_per_chip(device)
    first_fit = None
    for folded in candidates:
        if _folded_stages_fit(device, model, folded, policy):
            if not _pads(shard(model, folded.tp, ranks)):
                return folded
            first_fit = first_fit or folded
    return first_fit or candidates[0]


def _pads(sh: Shard) -> bool:
    """Whether a shard pads query heads or FFN columns (replicated KV heads, as vLLM runs
    them, are not padding)."""
    return bool(sh.padded_heads or sh.padded_ffn or sh.padded_dense_ffn)


def _folded_stages_fit(device: Device, model: Model, workload: Decode, policy: str) -> bool:
    """Whether a balanced cut of ``workload.pp`` stages of ``workload.tp`` chips holds every
    stage's bytes in the device's tiers (what :func:`_stage_starts` looks for)."""
    placed = item_tier_bytes(device, model, workload, policy)
    return _balanced_cut(device, placed, workload.pp, policy) is not None


def _plan_policy(device: Device, model: Model, workload: Decode, policy: str) -> SystemPlan:
    _check_chips(device, workload)
    workload = with_resident_tile(device, model, fold_pipeline(model, workload, device, policy),
                                  policy)
    _check_expert_parallel(model, workload)
    sh = shard(model, workload.tp, tp_ranks_per_chip(device))
    rules = parse_placement(workload.placement, device, model.layers)
    tile_n = workload.tile_n or device.tile_n
    final_tokens = workload.context + workload.steps * workload.new_tokens
    placer = _Placer(device, model, workload, policy, rules, tile_n)
    if workload.prefill_chunk and model.is_moe:
        raise ConfigError("a prompt chunk in a decode step is modelled for dense models only "
                          "(the MoE router counts the decode tokens)", field="prefill_chunk")
    if workload.ep > 1:
        return _plan_expert_parallel(device, model, workload, policy, sh, placer, tile_n,
                                     final_tokens)
    items = _item_specs(model, workload, sh, tile_n, final_tokens, workload.batch)
    starts = [0]
    if workload.pp > 1:
        placed = place_items(placer, items, sh.kv_heads).item_bytes(len(items))
        starts = _stage_starts(device, placed, workload.pp, policy)
    ends = starts[1:] + [len(items)]
    stages = tuple(
        _plan_stage(device, model, workload, policy, sh, placer, items[a:b], a, s, len(starts))
        for s, (a, b) in enumerate(zip(starts, ends)))
    return SystemPlan(device=device, model=model, workload=workload, policy=policy, shard=sh,
                      stages=stages)


def item_tier_bytes(device: Device, model: Model, workload: Decode,
                    policy: str) -> list[tuple[int, ...]]:
    """Bytes per tier one chip of a ``workload.tp`` group holds of each pipeline item (the
    embedding, each layer with its KV cache of the whole batch, the head), before any tied head
    or spill; what the pipeline cuts balance."""
    check_sizes(device, model, workload)    # as plan_system does: the capacity search's door
    sh = shard(model, workload.tp, tp_ranks_per_chip(device))
    rules = parse_placement(workload.placement, device, model.layers)
    tile_n = workload.tile_n or device.tile_n
    final_tokens = workload.context + workload.steps * workload.new_tokens
    placer = _Placer(device, model, workload, policy, rules, tile_n)
    items = _item_specs(model, workload, sh, tile_n, final_tokens, workload.batch)
    return place_items(placer, items, sh.kv_heads).item_bytes(len(items))


def _plan_expert_parallel(device: Device, model: Model, workload: Decode, policy: str,
                          sh: Shard, placer: _Placer, tile_n: int,
                          final_tokens: int) -> SystemPlan:
    """One plan per expert group of ``tp`` identical chips: each group holds every layer's
    attention (tensor parallel over its chips) and its share of the batch (attention data
    parallel across groups), and an equal share of every MoE layer's routed experts, each
    expert's FFN split over the group's chips (expert tensor parallel).

    This is SGLang's hybrid EP and TP (``--ep-size`` below ``--tp-size``, MoE tensor parallel
    within each expert group; sgl-project/sglang PR #8590, v0.4.10) with DP attention
    (``--enable-dp-attention``), and AWS Neuron vLLM's ``ep_degree < TP`` ("MoE layers use EP
    for expert partitioning AND TP for intermediate sharding"). vLLM's default EP, whole
    experts spread over every rank, is not modelled. Rank ``r`` of a group exchanges its
    group's tokens with rank ``r`` of the others (the same all-to-all per rank as with one chip
    per group, so a token crosses the link ``tp`` times; a modelling choice, not a published
    schedule); the partial sums of the expert shards come back with the combine and are
    completed by the group's all-reduce after the FFN.
    """
    ep = workload.ep
    local = dataclasses.replace(workload, batch=workload.batch // ep)
    per_chip = model.experts // ep
    chips = []
    for chip in range(ep):
        experts = range(chip * per_chip, (chip + 1) * per_chip)
        items = _item_specs(model, local, sh, tile_n, final_tokens, local.batch, experts)
        chips.append(_plan_stage(device, model, local, policy, sh, placer, items, 0, chip, ep,
                                 expert_chip=chip,
                                 token_base=chip * local.batch * workload.new_tokens,
                                 step_tokens=workload.batch * workload.new_tokens))
    return SystemPlan(device=device, model=model, workload=workload, policy=policy, shard=sh,
                      stages=tuple(chips), parallel_stages=True)


def _stage_starts(device: Device, item_bytes: list[tuple[int, ...]], pp: int,
                  policy: str) -> list[int]:
    """First item of each stage: equal bytes per stage when a balanced cut fits, else an even
    split of the items (the capacity check then says what is short, or the tiered policy
    spills). ``pp`` is at most the items (:func:`fold_pipeline` folds a longer one)."""
    cut = _balanced_cut(device, item_bytes, pp, policy)
    if cut is not None:
        return cut
    return [round(s * len(item_bytes) / pp) for s in range(pp)]


def _balanced_cut(device: Device, item_bytes: list[tuple[int, ...]], pp: int,
                  policy: str) -> list[int] | None:
    """The balanced cut of the items into ``pp`` stages that fits, or None."""
    n_tiers = len(device.tiers)
    capacity = tuple(t.capacity for t in device.tiers)
    if policy != "sram-resident":
        capacity = (sum(capacity),) * n_tiers   # balance bytes, not the on-chip cache
        item_bytes = [(sum(b),) * n_tiers for b in item_bytes]
    return balanced_stages(item_bytes, capacity, pp)


def _plan_stage(device: Device, model: Model, workload: Decode, policy: str, sh: Shard,
                placer: _Placer, items: list[list[_Spec]], first_item: int, stage: int,
                stages: int, *, expert_chip: int = -1, token_base: int = 0,
                step_tokens: int = 0, replicate: bool = True) -> Plan:
    """One stage's (or, under expert parallel, one chip's) tensors and op table: the tensors
    placed for this point, the op rows lowered once per process for every batch and context
    (:class:`_StageRows`) and set for this one.

    With ``replicate`` (the default), each distinct layer shape is built row by row once and
    its other layers are copies (:class:`_LayerTemplate`); without it every layer is built row
    by row (the reference the copies are tested against, tests/test_plan_shapes.py).
    """
    stack = resolve_runtime(device, workload)
    tile_n = workload.tile_n or device.tile_n
    tiers = device.tiers
    names = tuple(t.name for t in tiers)
    mb = workload.microbatch
    m_rows = mb * workload.new_tokens + workload.prefill_chunk   # one microbatch with a chunk
    final_tokens = workload.context + workload.steps * workload.new_tokens

    # The stage's tensors: its weights once, each microbatch's KV cache of its layers.
    shape_key = (device, model, _shape_fields(workload), policy, sh, first_item, len(items),
                 stage, stages, expert_chip, replicate)
    shape_hash = hash((_hash_of(_Identity(device)),) + shape_key[1:])
    table = placed = place_items(placer, items, sh.kv_heads, mb, workload.microbatches,
                                 shape_key, shape_hash, tied=model.tied_embeddings)
    spilled: tuple[str, ...] = ()
    if policy == "tiered":
        spilled_tensors, spilled = _spill(device, list(table.tensors()))
        table = table.with_tensors(spilled_tensors)
    need = table.need()             # bytes per tier; pinning below moves none
    _check_capacity(device, model, workload, table, need, stage, stages)
    head_rows = (mb if workload.prefill
                 else mb * workload.new_tokens + 1 if workload.prefill_chunk else 0)
    key = _Keyed(shape_key, len(table), shape_hash=shape_hash)
    lowered_table = table       # read for its ids, names and formats (see _lower_stage)
    key.build = lambda: _lower_stage(device, model, workload, sh, items, first_item, stage,
                                     stages, lowered_table, expert_chip, token_base,
                                     step_tokens, replicate)
    lowered = _stage_rows(key)

    residency = workload.residency
    if residency == "auto":
        residency = "pinned" if policy == "hybrid" else "lru"
    m_by_role = np.array((0, m_rows, head_rows, mb), dtype=np.int64)
    table, pinned_bits = _pin(table, residency,
                              tiers[0].capacity - 2 * _strip_bytes(lowered, m_by_role))
    if "next_layer" in placed.__dict__ and all(
            getattr(table, name) is getattr(placed, name) for name in ("spec", "layer",
                                                                       "block_start")):
        _share_next_layer(table, placed.next_layer)
    op_int, op_float = lowered.with_batch(
        device, stack, sh.tp, stage, stages, mb=mb, m_rows=m_rows, head_rows=head_rows,
        context=workload.context, max_blocks=-(-final_tokens // workload.kv_block),
        step_tokens=step_tokens or workload.step_tokens, token_base=token_base, table=table)
    on_chip_resident = need.get(0, 0)
    lru_capacity_bits = max(0, 8 * (tiers[0].capacity - on_chip_resident) - pinned_bits)
    return Plan(
        device=device, model=model, workload=workload, policy=policy, stage=stage,
        stages=stages, layers=lowered.layers, tier_names=names,
        tier_capacity=np.array([t.capacity for t in tiers], dtype=np.int64),
        tier_bandwidth=np.array([t.sustained_bandwidth for t in tiers], dtype=np.float64),
        tier_latency_s=np.array([t.latency_s for t in tiers], dtype=np.float64),
        tier_granularity=np.array([t.granularity for t in tiers], dtype=np.int64),
        tier_energy_j_per_byte=np.array([t.energy_j_per_byte for t in tiers], dtype=np.float64),
        runtime=stack, launch_s=device.op_launch_s, kernel_fixed_s=device.kernel_fixed_s,
        host_launch_s=(0.0 if stack.graphed(1 if expert_chip >= 0 else stages)
                       else stack.launch_s),
        op_int=op_int, op_float=op_float, op_names=lowered.op_names,
        op_microbatch=lowered.op_micro, op_formats=lowered.op_formats,
        tensor_table=table, residency=residency, lru_capacity_bits=lru_capacity_bits,
        max_lru_entries=_max_lru_entries(op_int, lru_capacity_bits, workload, tiers),
        spilled=spilled,
    )


_GRID_COLUMNS = (k.C_K, k.C_N, k.C_ELEM_BITS, k.C_GROUP, k.C_META_BITS, k.C_PADDED, k.C_M_GRAIN,
                 k.C_TILE_M, k.C_GEMV)


def _one_grid(a: list[int], b: list[int], cores: int) -> bool:
    """True when two matmuls fused into one GEMM (gate and up) are timed as halves of one grid
    of CTAs: the kernel does not split K (without split-K the fused kernel's CTAs of both halves
    fill the cores together; with it each half fills them alone), the halves are alike and the
    cores are even (each half then has half the cores in every wave of the fused grid, exactly)."""
    return (a[k.C_SPLIT_K] == 0 and b[k.C_SPLIT_K] == 0 and cores % 2 == 0
            and all(a[c] == b[c] for c in _GRID_COLUMNS))


def _lower_stage(device: Device, model: Model, workload: Decode, sh: Shard,
                 items: list[list[_Spec]], first_item: int, stage: int, stages: int,
                 table: TensorTable, expert_chip: int, token_base: int, step_tokens: int,
                 replicate: bool) -> "_StageRows":
    """A stage's op rows as built for ``workload`` (its batch and context included; see
    :class:`_StageRows` for what another batch and context change). ``table`` is read for its
    tensor ids, names and formats only, which do not depend on the batch or context."""
    kvfmt = get_format(workload.kv)
    act = stream_format(workload)
    act_in = get_format(workload.activations)
    stack = resolve_runtime(device, workload)
    fusion = stack.fusion
    gemm_tiles = dict(stack.gemm)
    tile_k = workload.tile_k or device.tile_k
    tile_n = workload.tile_n or device.tile_n
    mb = workload.microbatch
    m_rows = mb * workload.new_tokens + workload.prefill_chunk   # one microbatch with a chunk
    tile_m = workload.tile_m or (tile_n if workload.carries_prompt else 0)
    q_tile = max(1, tile_m // sh.q_per_kv)      # query tokens of a prompt's attention tile
    chunk_blocks = -(-(workload.prefill_context + workload.steps * workload.prefill_chunk)
                     // workload.kv_block)
    final_tokens = workload.context + workload.steps * workload.new_tokens
    row_bits = kv_row_bits(model, kvfmt)
    act_peak = _stream_rate(device, act)
    kv_dequant = kv_dequant_ops(device, kvfmt, act)
    link = device.link
    steps_per_pass = collective_steps(group_link(device, sh.tp).topology, sh.tp) if link else 0
    index: dict[str, int] = {}      # tensor ids by name, of the items built row by row

    rows: list[list[int]] = []
    floats: list[tuple[float, ...]] = []
    op_names: list[str] = []
    op_formats: list[str] = []
    paths: dict[str, MatmulPath] = {}
    op_micro: list[int] = []
    m_roles: list[int] = []
    micro = 0

    template = [0] * k.N_INT_COLS
    for column, value in ((k.C_TILE_K, tile_k), (k.C_TILE_N, tile_n),
                          (k.C_M_GRAIN, device.matrix_unit[0]), (k.C_BATCH, mb),
                          (k.C_KV_HEADS, sh.kv_heads), (k.C_Q_PER_KV, sh.q_per_kv),
                          (k.C_HEAD_DIM, model.head_dim), (k.C_V_DIM, model.value_dim),
                          (k.C_KV_PARTS, model.kv_parts), (k.C_CONTEXT, workload.context),
                          (k.C_NEW_TOKENS, workload.new_tokens), (k.C_KV_BLOCK, workload.kv_block),
                          (k.C_KV_ROW_BITS, row_bits),
                          (k.C_KV_MAX_BLOCKS, -(-final_tokens // workload.kv_block)),
                          (k.C_ROWS_HERE, sh.vocab_rows), (k.C_LINK_STEPS, steps_per_pass),
                          (k.C_STEP_TOKENS, step_tokens or workload.step_tokens),
                          (k.C_TILE_M, tile_m),
                          (k.C_ROUTE, -1), (k.C_LAUNCHES, 1),
                          (k.C_GEMV, stack.gemv_max_rows if stack.small_batch_gemv else 0),
                          (k.C_SPLIT_K, 1),
                          (k.C_GRID_SHARE, 1),
                          (k.C_ACT_REUSE, act_reuse_tiles(device, tile_n))):
        template[column] = value
    format_params: dict[tuple[str, int], tuple[int, ...]] = {}

    def add_op(name: str, kind: int, layer: int, tensor: int, fmt: Format, *, m: int = _M_NONE,
               kk: int = 0, n: int = 0, peak: float = 0.0, dequant: float = 0.0,
               act_quant: float = 0.0, chips: int = 0, passes: int = 0,
               act_bits: int = act.element_bits,
               gemv_s: tuple[float, ...] = NO_GEMV) -> list[int]:
        row = template.copy()
        row[k.C_KIND] = kind
        row[k.C_LAYER] = layer
        row[k.C_M] = (0, m_rows, head_rows, mb)[m]
        row[k.C_K] = kk
        row[k.C_N] = n
        row[k.C_TENSOR] = tensor         # its TENSOR_COLUMNS are set once placed
        params = format_params.get((fmt.name, kk))
        if params is None:
            params = format_params[(fmt.name, kk)] = fmt.kernel_params(kk)
        (row[k.C_ELEM_BITS], row[k.C_GROUP], row[k.C_META_BITS], row[k.C_PADDED],
         row[k.C_TENSOR_META_BITS]) = params
        row[k.C_ACT_BITS] = act_bits
        row[k.C_CHIPS] = chips
        row[k.C_PASSES] = passes
        row[k.C_TOKEN_BASE] = token_base + micro * m_rows
        rows.append(row)
        floats.append((peak, dequant, act_quant, 0.0, 0.0) + gemv_s)
        op_names.append(name)
        op_formats.append(fmt.name)
        op_micro.append(micro)
        m_roles.append(m)
        return row

    def matmul(name: str, layer: int, kk: int, n: int, tensor: str = "",
               rows: int = _M_ROWS, launches: int = 1) -> list[int]:
        tensor_id = index[tensor or (f"{name}.{layer}" if layer >= 0 else name)]
        fmt = table.fmt(tensor_id)
        path = paths.get(fmt.name)
        if path is None:
            path = paths[fmt.name] = matmul_path(device, fmt, act_in, stack)
        gemm = gemm_tiles.get(fmt.name)
        row = add_op(name, k.OP_MATMUL, layer, tensor_id, fmt, m=rows, kk=kk, n=n,
                     peak=path.ops_per_s, dequant=path.dequant_ops_per_weight,
                     act_quant=path.act_quant_ops_per_element,
                     act_bits=activation_bits(path, act_in, act),
                     gemv_s=kernel_columns(device, path, gemm))
        row[k.C_LAUNCHES] = launches
        if gemm is not None:            # the runtime's tensor-core kernel for this format
            row[k.C_M_GRAIN] = row[k.C_TILE_M] = gemm.rows
            row[k.C_SPLIT_K] = int(gemm.split_k)
            row[k.C_GEMV] = 0
        return row

    def norm(name: str, layer: int, launches: int, width: int = 0) -> None:
        row = add_op(name, k.OP_NORM, layer, index[f"{name}.{layer}" if layer >= 0 else name],
                     act, m=_M_ROWS, kk=width or model.hidden)
        row[k.C_LAUNCHES] = launches

    def all_reduce(name: str, layer: int, width: int, passes: int = 2) -> None:
        if sh.tp > 1:       # its link times follow the batch: _StageRows.with_batch sets them
            add_op(name, k.OP_COLLECTIVE, layer, -1, act, m=_M_ROWS, kk=width, chips=sh.tp,
                   passes=passes)

    residual_adds = 0 if fusion.fused_norm_residual else 1
    h, hd = model.hidden, model.head_dim
    a2a_figures = (exchange_figures(device, sh.tp, workload.ep, expert_chip)[:2]
                   if link and expert_chip >= 0 else (0.0, 0.0))

    def moe(layer: int) -> None:
        """Router, then each routed expert of this chip on the tokens the step sends it (a fused
        kernel: two launches for all experts, paid by the router), then the shared experts."""
        route = (layer - model.dense_layers) * workload.microbatches + micro
        local = [s.in_layer(layer) for s in items[layer + 1 - first_item].specs
                 if s.role == "experts"]
        matmul("router", layer, h, model.experts,
               launches=1 + (2 if local and fusion.fused_moe else 0))
        if expert_chip >= 0:
            exchange("moe_dispatch", layer, route)
        for spec in local:
            part = spec.name.split(".")[0]
            kk, n = (sh.ffn, h) if part == "expert_down" else (h, sh.ffn)
            row = matmul(part, layer, kk, n, tensor=spec.name,
                         launches=0 if fusion.fused_moe else 1)
            row[k.C_ROUTE] = route
            row[k.C_ROUTE_COL] = spec.expert
        if expert_chip >= 0:
            exchange("moe_combine", layer, route)
        for i in range(model.shared_experts):
            matmul("shared_gate", layer, h, sh.ffn, tensor=f"shared_gate.{layer}.{i}")
            matmul("shared_up", layer, h, sh.ffn, tensor=f"shared_up.{layer}.{i}",
                   launches=0 if fusion.fused_gate_up else 1)
            matmul("shared_down", layer, sh.ffn, h, tensor=f"shared_down.{layer}.{i}")

    def exchange(name: str, layer: int, route: int) -> None:
        row = add_op(name, k.OP_ALL_TO_ALL, layer, -1, act, kk=h)
        row[k.C_ROUTE] = route
        row[k.C_ROUTE_COL] = model.experts + expert_chip
        row[k.C_CHIPS] = sh.tp * workload.ep        # the chips its groups span
        floats[-1] = floats[-1][:3] + a2a_figures + NO_GEMV

    def chunk_attention(layer: int) -> None:
        """The prompt chunk's sequence: its KV append and causal flash attention."""
        kv = index[f"chunk_kv.{layer}"]
        append = add_op("chunk_kv_append", k.OP_KV_APPEND, layer, kv, kvfmt, kk=hd)
        append[k.C_LAUNCHES] = 0 if fusion.fused_attention_prologue else 1
        attention = add_op("chunk_attention", k.OP_ATTENTION, layer, kv, kvfmt, kk=hd,
                           peak=act_peak, dequant=kv_dequant)
        for row in (append, attention):
            row[k.C_BATCH] = 1
            row[k.C_CONTEXT] = workload.prefill_context
            row[k.C_NEW_TOKENS] = workload.prefill_chunk
            row[k.C_KV_MAX_BLOCKS] = chunk_blocks
            row[k.C_Q_TILE] = q_tile

    # the LM head's rows: every new token of a decode step; only the last position of a
    # prompt (a prefill's sequences, a chunk's sequence)
    head_rows = (mb if workload.prefill
                 else mb * workload.new_tokens + 1 if workload.prefill_chunk else 0)
    head_role = _M_HEAD if head_rows else _M_ROWS

    def mla_in(layer: int) -> None:
        """MLA up to its cache, absorbed (DeepSeek-V2 report, arXiv 2405.04434, section 2.1;
        vLLM's and SGLang's MLA decode): the query's projections, the latent's down-projection
        ``kv_a`` with its norm (one launch with ``q_a`` when the stack fuses QKV, as
        ``fused_qkv_a_proj``), and ``w_uk``, each head's query times its slice of kv_b's keys
        (a grouped matmul: K = qk_nope_head_dim, N = heads x kv_lora_rank)."""
        rank = model.kv_lora_rank
        q_out = sh.heads * (model.qk_nope_head_dim + model.qk_rope_head_dim)
        if model.q_lora_rank:
            matmul("q_a", layer, h, model.q_lora_rank)
        matmul("kv_a", layer, h, rank + model.qk_rope_head_dim,
               launches=0 if model.q_lora_rank and fusion.fused_qkv else 1)
        if model.q_lora_rank:
            norm("q_a_norm", layer, 1, width=model.q_lora_rank)
            matmul("q_b", layer, model.q_lora_rank, q_out)
        else:
            matmul("q_proj", layer, h, q_out)
        norm("kv_a_norm", layer, 1, width=rank)
        matmul("w_uk", layer, model.qk_nope_head_dim, sh.heads * rank)

    def build_layer(layer: int, suffix: str) -> None:
        """One layer's op rows, row by row."""
        kv = index[f"kv.{layer}{suffix}"]
        norm("attn_norm", layer, 1 + residual_adds + fusion.extra_kernels_per_layer)
        if model.is_mla:
            mla_in(layer)
        elif f"qkv.{layer}" in index:
            matmul("qkv", layer, h, (sh.heads + 2 * sh.kv_heads) * hd,
                   launches=1 if fusion.fused_qkv else 3)
        else:           # q, k and v stored in different formats: three matmuls
            for part, heads in (("q", sh.heads), ("k", sh.kv_heads), ("v", sh.kv_heads)):
                matmul(part, layer, h, heads * hd, tensor=f"{part}.{layer}")
        append = add_op("kv_append", k.OP_KV_APPEND, layer, kv, kvfmt, kk=hd)
        append[k.C_LAUNCHES] = 0 if fusion.fused_attention_prologue else 1
        attention = add_op("attention", k.OP_ATTENTION, layer, kv, kvfmt, kk=hd,
                           peak=act_peak, dequant=kv_dequant)
        if workload.prefill:
            attention[k.C_Q_TILE] = q_tile
        if workload.prefill_chunk:
            chunk_attention(layer)
        if model.is_mla:     # each head's latent output times its slice of kv_b's values
            matmul("w_uv", layer, model.kv_lora_rank, sh.heads * model.v_head_dim)
            matmul("o_proj", layer, sh.heads * model.v_head_dim, h)
        else:
            matmul("o_proj", layer, sh.heads * hd, h)
        all_reduce("attn_allreduce", layer, h)
        norm("ffn_norm", layer, 1 + residual_adds)
        if model.is_moe_layer(layer):
            moe(layer)
        else:
            width = sh.dense_ffn if model.is_moe else sh.ffn
            gate = matmul("gate", layer, h, width)
            up = matmul("up", layer, h, width, launches=0 if fusion.fused_gate_up else 1)
            if fusion.fused_gate_up and _one_grid(gate, up, device.cores):
                gate[k.C_GRID_SHARE] = up[k.C_GRID_SHARE] = 2
            matmul("down", layer, width, h)
        all_reduce("ffn_allreduce", layer, h)

    def item_tensor_ids(item: int, micro: int) -> list[int]:
        """The tensor ids an item's ops may name (its weights, then its caches of ``micro``),
        in the order its specs list them; named in ``index``."""
        ids = table.ids(item, -1) + table.ids(item, micro)
        index.update((table.name(i), i) for i in ids)
        return ids

    # Layers of one shape (and microbatch) share their op rows but for the REPLICATED columns:
    # the first is built row by row, the others are copies (see _LayerTemplate).
    templates: dict[tuple, _LayerTemplate] = {}
    pieces: list[tuple] = []    # ("rows", first, end) or ("copies", template, layers, items, micro)
    built = 0
    layers: list[int] = []
    for micro in range(workload.microbatches):
        suffix = f".mb{micro}" if micro else ""
        item_no, end = first_item, first_item + len(items)
        while item_no < end:
            if item_no == 0:
                item_tensor_ids(0, micro)
                add_op("embed", k.OP_EMBED, -1, index["embedding"],
                       table.fmt(index["embedding"]), m=_M_ROWS, kk=h, n=model.vocab)
                all_reduce("embed_allreduce", -1, h)
                item_no += 1
                continue
            if item_no <= model.layers:        # a run of layers of one shape
                item = items[item_no - first_item]
                run_end = item_no + 1
                while (replicate and run_end < end and run_end <= model.layers
                       and items[run_end - first_item].shape == item.shape):
                    run_end += 1
                if micro == 0:
                    layers.extend(range(item_no - 1, run_end - 1))
                key = (micro, item.shape)
                shape = templates.get(key) if replicate else None
                if shape is None:
                    start = len(rows)
                    ids = item_tensor_ids(item_no - first_item, micro)
                    build_layer(item_no - 1, suffix)
                    if replicate:
                        shape = templates[key] = _LayerTemplate.of(
                            rows, start, ids, item_no - 1, workload.microbatches)
                    item_no += 1
                if item_no < run_end:           # the others: copies of the shape's rows
                    if len(rows) > built:
                        pieces.append(("rows", built, len(rows)))
                        built = len(rows)
                    last = pieces[-1] if pieces else None
                    copied = range(item_no - 1, run_end - 1)
                    if last is not None and last[0] == "copies" and last[1] is shape:
                        last[2].extend(copied)
                        last[3].extend(range(item_no - first_item, run_end - first_item))
                    else:
                        pieces.append(("copies", shape, list(copied),
                                       list(range(item_no - first_item, run_end - first_item)),
                                       micro))
                item_no = run_end
                continue
            item_tensor_ids(item_no - first_item, micro)
            norm("final_norm", -1, 1)
            matmul("lm_head", -1, h, sh.vocab_rows, rows=head_role)
            all_reduce("logits_allgather", -1, sh.vocab_rows * sh.tp, passes=1)
            for i in range(workload.draft_heads):     # on the last accepted position only
                matmul("draft_head_res", -1, h, h, f"draft_head_res.{i}", rows=_M_MB)
                matmul("draft_head_lm", -1, h, sh.vocab_rows, f"draft_head_lm.{i}", rows=_M_MB)
            item_no += 1
        if expert_chip >= 0:
            continue                    # expert-parallel chips are side by side, not a pipeline
        # a hand-off's link times follow the batch too (_StageRows.with_batch)
        if stage < stages - 1:
            add_op("send", k.OP_SEND, -1, -1, act, m=_M_ROWS, kk=h,
                   act_bits=stack.pipeline.handoff_bits or act.element_bits)
        elif stages > 1:
            add_op("send_tokens", k.OP_SEND, -1, -1, act, m=_M_ROWS, kk=1,
                   act_bits=TOKEN_ID_BITS)
    if len(rows) > built:
        pieces.append(("rows", built, len(rows)))

    op_int, op_float, op_names, op_formats, per_row = _assemble(
        pieces, table, rows, floats, op_names, op_formats,
        np.array([op_micro, m_roles], dtype=np.int64).T.reshape(-1, 2))
    return _StageRows.of(op_int, op_float, op_names, op_formats, per_row[:, 0], per_row[:, 1],
                         tuple(layers))


# Plan one layer per shape ---------------------------------------------------------------------

# The op-table columns that differ between two layers of one shape (and one microbatch): the
# layer, the tensor an op reads (its id; its placement columns are then read off the tensor)
# and an MoE op's row of the step's route table. Every other column, float, name and format is
# the same in each of them. The microbatch (C_TOKEN_BASE, the KV caches' ids) is part of the
# shape key, so a copy never changes it.
REPLICATED_COLUMNS = (k.C_LAYER, k.C_TENSOR, k.C_ROUTE)
TENSOR_COLUMNS = (k.C_HOME, k.C_HOME_HI, k.C_SPLIT, k.C_PINNED)   # read off the op's tensor


@dataclass(frozen=True)
class _LayerTemplate:
    """One layer's op rows, built row by row, and how to make another layer's from them."""

    op_int: np.ndarray          # [op, k.C_*] of the template layer
    first: int                  # its first row among the stage's rows built one by one
    slot: np.ndarray            # [op]: position of the op's tensor in the layer's ids, or -1
    routed: np.ndarray          # [op]: True where C_ROUTE names a route-table row
    layer: int
    microbatches: int

    @classmethod
    def of(cls, rows: list[list[int]], first: int, ids: list[int], layer: int,
           microbatches: int) -> "_LayerTemplate":
        """Record rows ``first ..`` of ``rows``, just built for ``layer``."""
        op_int = np.array(rows[first:], dtype=np.int64)
        position = {tensor: i for i, tensor in enumerate(ids)}
        slot = np.array([position[t] if t >= 0 else -1 for t in op_int[:, k.C_TENSOR]],
                        dtype=np.int64)
        return cls(op_int, first, slot, op_int[:, k.C_ROUTE] >= 0, layer, microbatches)

    def copies(self, layers: list[int], ids: np.ndarray) -> np.ndarray:
        """The op rows of ``layers`` (``ids``: [layer, slot] their tensor ids), one layer after
        another."""
        n, ops = len(layers), self.op_int.shape[0]
        block = np.repeat(self.op_int[None, :, :], n, axis=0)
        layer = np.asarray(layers, dtype=np.int64)
        block[:, :, k.C_LAYER] = layer[:, None]
        has = self.slot >= 0
        block[:, has, k.C_TENSOR] = ids[:, self.slot[has]]
        block[:, self.routed, k.C_ROUTE] += ((layer - self.layer) * self.microbatches)[:, None]
        return block.reshape(n * ops, k.N_INT_COLS)


def _assemble(pieces: list[tuple], table: TensorTable, rows: list[list[int]], floats: list,
              names: list[str], formats: list[str], per_row: np.ndarray) -> tuple:
    """The stage's op table from the rows built one by one and the copied layers, in order
    (a copied layer's tensor ids read off ``table``); ``per_row`` ([row, column], ints) is
    copied along with the rows."""
    built = np.array(rows, dtype=np.int64).reshape(-1, k.N_INT_COLS)
    built_floats = np.array(floats, dtype=np.float64).reshape(-1, k.N_FLOAT_COLS)
    columns = per_row.shape[1]
    ints, out_floats, out_per_row, out_names, out_formats = [], [], [], [], []
    for piece in pieces:
        if piece[0] == "rows":
            _, a, b = piece
            count = 1
            ints.append(built[a:b])
        else:
            _, template, layers, items, item_micro = piece
            a, b = template.first, template.first + template.op_int.shape[0]
            count = len(layers)
            ids = table.id_matrix(np.asarray(items, dtype=np.int64), item_micro)
            ints.append(template.copies(layers, ids))
        out_floats.append(built_floats[a:b] if count == 1
                          else np.repeat(built_floats[None, a:b], count, axis=0).reshape(
                              -1, k.N_FLOAT_COLS))
        out_per_row.append(per_row[a:b] if count == 1
                           else np.repeat(per_row[None, a:b], count, axis=0).reshape(
                               -1, columns))
        out_names += names[a:b] * count
        out_formats += formats[a:b] * count
    if not pieces:
        return built, built_floats, (), (), per_row
    return (np.concatenate(ints), np.concatenate(out_floats), tuple(out_names),
            tuple(out_formats), np.concatenate(out_per_row))


# Rows of a stage per process ------------------------------------------------------------------

# What an op row's M is, by role: none (0), the microbatch's rows (its sequences' new tokens and
# a prompt chunk), the LM head's rows (a prompt's last positions), the microbatch's sequences.
_M_NONE, _M_ROWS, _M_HEAD, _M_MB = range(4)
_CHUNK_OPS = ("chunk_kv_append", "chunk_attention")   # a prompt chunk's own batch and context


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


@dataclass(frozen=True)
class _StageRows:
    """A stage's op rows as lowered for one batch and context, kept per process (read-only
    arrays) for every batch and context of the same device, model, formats, parallelism,
    placement and runtime: :meth:`with_batch` rewrites what depends on them, the columns
    C_BATCH, C_CONTEXT and C_KV_MAX_BLOCKS (but a prompt chunk's own), C_M (by its role),
    C_STEP_TOKENS and C_TOKEN_BASE, and the collectives' and hand-offs' link times; and sets
    the TENSOR_COLUMNS of the point's placed tensors."""

    op_int: np.ndarray
    op_float: np.ndarray
    op_names: tuple[str, ...]
    op_formats: tuple[str, ...]
    op_micro: np.ndarray
    m_role: np.ndarray          # [op]: _M_NONE, _M_ROWS, _M_HEAD or _M_MB
    layers: tuple[int, ...]
    decode: np.ndarray          # [op]: not a prompt chunk's op
    collectives: np.ndarray     # rows of OP_COLLECTIVE
    collective_firsts: np.ndarray   # per kind of collective: its first in ``collectives``
    collective_kind: np.ndarray     # per collective: its kind (an index of the above)
    sends: np.ndarray           # rows of OP_SEND
    to_first: tuple[bool, ...]  # per send: the sampled tokens back to the first stage

    @classmethod
    def of(cls, op_int: np.ndarray, op_float: np.ndarray, op_names: tuple[str, ...],
           op_formats: tuple[str, ...], op_micro: np.ndarray, m_role: np.ndarray,
           layers: tuple[int, ...]) -> "_StageRows":
        kind = op_int[:, k.C_KIND]
        decode = np.array([name not in _CHUNK_OPS for name in op_names], dtype=bool)
        sends = np.flatnonzero(kind == k.OP_SEND)
        collectives = np.flatnonzero(kind == k.OP_COLLECTIVE)
        # a point sets no collective column but M, and M by the op's role: collectives alike in
        # the other columns and in role are alike at every batch and context
        firsts, collective_kind = distinct_rows(np.column_stack(
            (op_int[collectives][:, _STATIC_COLLECTIVE_COLUMNS], m_role[collectives])))
        return cls(_read_only(op_int), _read_only(op_float), op_names, op_formats,
                   _read_only(np.ascontiguousarray(op_micro)),
                   _read_only(np.ascontiguousarray(m_role)), layers, _read_only(decode),
                   _read_only(collectives), _read_only(firsts), _read_only(collective_kind),
                   _read_only(sends), tuple(op_names[i] == "send_tokens" for i in sends))

    def with_batch(self, device: Device, stack: Runtime, tp: int, stage: int, stages: int, *,
                   mb: int, m_rows: int, head_rows: int, context: int, max_blocks: int,
                   step_tokens: int, token_base: int,
                   table: TensorTable) -> tuple[np.ndarray, np.ndarray]:
        """New op_int and op_float tables for this batch and context (what _lower_stage would
        build for them), with the TENSOR_COLUMNS of ``table``'s placed tensors."""
        op_int = self.op_int.copy()
        set_point_columns(op_int, _POINT_COLUMNS, self.decode, self.m_role, self.op_micro,
                          np.array((0, m_rows, head_rows, mb), dtype=np.int64), mb, context,
                          max_blocks, step_tokens, token_base, m_rows, table.home,
                          table.home_hi, table.split, table.pinned)
        if not len(self.collectives) and not len(self.sends):
            return op_int, self.op_float.copy()
        op_float = self.op_float.copy()
        set_collective_times(stack, device, op_int, op_float, self.collectives,
                             self.collective_firsts, self.collective_kind)
        for row, to_first in zip(self.sends.tolist(), self.to_first):
            op_float[row, k.F_LINK_S:k.F_LINK_LATENCY_S + 1] = send_seconds(
                device, stack, op_int[row], to_first=to_first, stage=stage, stages=stages,
                tp=tp)
        return op_int, op_float


class _Keyed:
    """A per-process cache key (everything a value depends on besides the batch and the
    context) carrying the function that builds the value on a miss; equal by the key alone."""

    __slots__ = ("key", "hash", "build")

    def __init__(self, shape_key: tuple, *extra: object, shape_hash: int | None = None) -> None:
        self.key = (shape_key, extra)
        self.hash = hash((hash(shape_key) if shape_hash is None else shape_hash, extra))
        self.build = None

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Keyed) and self.key == other.key

    def built(self):
        """The value, built once; the cache keeps the key, not what built it."""
        build, self.build = self.build, None
        return build()


@functools.lru_cache(maxsize=128)
def _stage_rows(key: _Keyed) -> _StageRows:
    return key.built()


class _Identity:
    """A cache key equal only to a key of the very same object (the cache keeps it alive, so
    its id is not reused while the entry lasts)."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value

    def __hash__(self) -> int:
        return id(self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Identity) and other.value is self.value


@functools.lru_cache(maxsize=64)
def _hash_of(key: _Identity) -> int:
    """``hash(key.value)``, worked out once per object: a device's hash walks all its fields
    (~6 us), and equal objects hash alike, so a key hashed through it stays consistent."""
    return hash(key.value)


_BATCH_FIELDS = ("batch", "context")


@functools.lru_cache(maxsize=8)
def _other_fields(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.name not in _BATCH_FIELDS)


def _shape_fields(workload: Decode) -> tuple:
    """The workload's fields but its batch and context."""
    return (type(workload),) + tuple([getattr(workload, name)
                                      for name in _other_fields(type(workload))])


# The op-table columns memsim.kernels.columns.set_point_columns sets, in its order.
_POINT_COLUMNS = np.array([k.C_BATCH, k.C_CONTEXT, k.C_KV_MAX_BLOCKS, k.C_M, k.C_STEP_TOKENS,
                           k.C_TOKEN_BASE, k.C_TENSOR, k.C_HOME, k.C_HOME_HI, k.C_SPLIT,
                           k.C_PINNED], dtype=np.int64)
# the collective columns a point does not set (it sets M, by the op's role)
_STATIC_COLLECTIVE_COLUMNS = [c for c in COLLECTIVE_COLUMNS if c not in _POINT_COLUMNS]


def _need(tensors: list[Tensor]) -> dict[int, int]:
    need: dict[int, int] = {}
    for tensor in tensors:
        if not tensor.aliased:
            for tier, nbytes in tensor.tier_bytes:
                need[tier] = need.get(tier, 0) + nbytes
    return need


def _spill(device: Device, tensors: list[Tensor]) -> tuple[list[Tensor], tuple[str, ...]]:
    """Tiered policy: move whole layers' weights, the last layer first, from an overfull tier to
    the spill tier until the rest fits; then, if still short, the KV caches, the last layer
    first. A tensor with any bytes on the overfull tier moves whole."""
    spill = device.tier_index(spill_tier(device))
    out = list(tensors)
    notes = []
    for kind in ("weight", "kv"):
        need = _need(out)
        over = [t for t, b in need.items() if t != spill and b > device.tiers[t].capacity]
        if not over:
            break
        tier = over[0]
        by_layer: dict[int, list[int]] = {}
        for i, tensor in enumerate(out):
            if tensor.kind == kind and tensor.bytes_on(tier) > 0 and not tensor.aliased:
                by_layer.setdefault(tensor.layer, []).append(i)
        moved_layers: list[int] = []
        moved_bytes = 0
        for layer in sorted(by_layer, reverse=True):
            if need.get(tier, 0) <= device.tiers[tier].capacity:
                break
            for i in by_layer[layer]:
                tensor = out[i]
                moved_bytes += tensor.bytes_on(tier)
                for home, nbytes in tensor.tier_bytes:     # keep `need` equal to _need(out)
                    need[home] -= nbytes
                need[spill] = need.get(spill, 0) + tensor.bytes
                out[i] = dataclasses.replace(tensor, home=spill, home_hi=spill, split=0,
                                             tier_bytes=((spill, tensor.bytes),))
            moved_layers.append(layer)
        if not moved_layers:
            continue
        in_layers = sorted(x for x in moved_layers if x >= 0)
        where = f"layers {in_layers[0]}-{in_layers[-1]}" if in_layers else ""
        if -1 in moved_layers:
            where += (" and " if where else "") + "the embedding and head"
        what = "weights" if kind == "weight" else "KV caches"
        notes.append(f"{what} of {where} moved from {device.tiers[tier].name} to "
                     f"{device.tiers[spill].name} ({format_quantity(moved_bytes, 'capacity')})")
    embedding = next((t for t in out if t.role == "embedding"), None)
    if embedding is not None and embedding.home == embedding.home_hi == spill:
        out = [dataclasses.replace(t, home=spill, home_hi=spill, split=0,
                                   tier_bytes=embedding.tier_bytes) if t.aliased else t
               for t in out]
    return out, tuple(notes)


def _check_capacity(device: Device, model: Model, workload: Decode, table: TensorTable,
                    need: dict[int, int], stage: int, stages: int) -> None:
    """Weights plus the KV cache at the last step's context (``need``: bytes per tier) must
    fit their tiers."""
    for home, nbytes in sorted(need.items()):
        tier = device.tiers[home]
        if nbytes <= tier.capacity:
            continue
        weights = int(table.held(weights=True)[home])
        short = nbytes - tier.capacity
        where = (f"stage {stage} of {stages} (tp {workload.tp})" if stages > 1
                 else f"each of {workload.tp} chips" if workload.tp > 1 else "one chip")
        raise CapacityError(
            f"{model.name} at batch {workload.batch} and context {workload.context} needs "
            f"{nbytes:,} B in tier {tier.name!r} on {where} (weights {weights:,} B + KV cache "
            f"{nbytes - weights:,} B) but it holds {tier.capacity:,} B: short by {short:,} B "
            f"({format_quantity(short, 'capacity')}). `memsim plan {device.name} {model.name}` "
            f"gives the fewest chips that hold it; or add a slower tier to spill to "
            f"(--add-tier), raise the capacity (--set tiers.{tier.name}.capacity=...), or use a "
            f"smaller format.",
            shortfall_bytes=short, file=device.file, field=f"tiers.{tier.name}.capacity")


def _strip_bytes(rows: _StageRows, m_by_role: np.ndarray) -> int:
    """Bytes of the widest weight strip (K x one N tile) a matmul of these rows reads once per
    M tile (``m_by_role``: each role's M): what the LRU must hold for the re-reads to hit, and
    so what pinning leaves it (0 when no matmul's M is tiled). An expert's M is taken as its
    role's, an upper bound on the tokens the step routes to it."""
    op = rows.op_int
    m = m_by_role[rows.m_role]
    tile_m = op[:, k.C_TILE_M]
    tiled = (op[:, k.C_KIND] == k.OP_MATMUL) & (tile_m > 0) & (m > tile_m)
    if not tiled.any():
        return 0
    kk, group = op[tiled, k.C_K], op[tiled, k.C_GROUP]
    starts = np.where(group > 0, -(-kk // np.maximum(group, 1)), 0)
    payload = np.where((group > 0) & (op[tiled, k.C_PADDED] != 0), starts * group, kk)
    bits = ((payload * op[tiled, k.C_ELEM_BITS] + starts * op[tiled, k.C_META_BITS])
            * op[tiled, k.C_TILE_N])
    return -(-int(bits.max()) // 8)


def _pin(table: TensorTable, residency: str, on_chip_bytes: int) -> tuple[TensorTable, int]:
    """Under the pinned policy, pin off-chip weights in order while they fit in
    ``on_chip_bytes`` (the on-chip tier less what the LRU must keep for streamed strips).

    An untied embedding table comes last: a step reads only a few of its rows, so it is worth
    pinning only with room to spare. An aliased LM head shares the embedding's pin.
    """
    if residency != "pinned":
        return table, 0
    live = ~table.aliased
    free = on_chip_bytes - int(table.tier_bytes[live, 0].sum())
    tied = bool(table.aliased.any())
    candidates = np.flatnonzero(table.is_weight & live & (table.tier_bytes[:, 0] == 0))
    embedding = table.has_role("embedding")
    last = embedding[candidates] & (not tied)
    candidates = np.concatenate([candidates[~last], candidates[last]])
    sizes = table.tier_bytes.sum(axis=1)
    pinned = np.zeros(len(table), dtype=bool)
    pinned_bytes = 0
    for i in candidates.tolist():
        if pinned_bytes + int(sizes[i]) <= free:
            pinned[i] = True
            pinned_bytes += int(sizes[i])
    if (embedding & pinned).any():
        pinned |= table.aliased
    return dataclasses.replace(table, pinned=pinned), 8 * pinned_bytes


def _max_lru_entries(op_int: np.ndarray, capacity_bits: int, workload: Decode,
                     tiers: tuple) -> int:
    """An upper bound on tiles the LRU can hold at once: the distinct tiles of the ops' tensors
    that are neither on chip nor pinned, and at most the on-chip capacity over the smallest
    (``op_int``: with its TENSOR_COLUMNS set, :meth:`_StageRows.with_batch`;
    :func:`memsim.kernels.bounds.lru_tiles`)."""
    if capacity_bits == 0:
        return 1
    granularity = np.array([t.granularity for t in tiers], dtype=np.int64)
    distinct, smallest = lru_tiles(op_int, _LRU_COLUMNS, _LRU_KINDS, workload.steps,
                                   workload.kv_block, granularity)
    if smallest < 0:
        return 1
    return int(max(1, min(distinct, capacity_bits // max(smallest, 1) + 1)))


# The op-table columns and op kinds memsim.kernels.bounds.lru_tiles reads, in its order.
_LRU_COLUMNS = np.array([k.C_KIND, k.C_TENSOR, k.C_PINNED, k.C_HOME, k.C_HOME_HI, k.C_TILE_K,
                         k.C_TILE_N, k.C_K, k.C_N, k.C_M, k.C_ELEM_BITS, k.C_KV_ROW_BITS,
                         k.C_KV_PARTS, k.C_BATCH, k.C_KV_HEADS, k.C_KV_MAX_BLOCKS],
                        dtype=np.int64)
_LRU_KINDS = np.array([k.OP_EMBED, k.OP_MATMUL, k.OP_ATTENTION, k.OP_KV_APPEND], dtype=np.int64)


# Device figures that change no count, only time and energy: a plan made for one value serves
# every other (the op tables stay; the per-tier figures and the peaks are swapped).
TIMING_FIELDS = ("bandwidth", "sustained_bandwidth", "latency", "energy")
TIMING_PATHS = ("clock", "overheads.op_launch", "overheads.kernel_fixed", "energy.per_flop",
                "link.bandwidth", "link.latency", "link.energy", "link.collective_latency",
                "cost.usd_per_chip_hour")


def is_timing_path(path: str) -> bool:
    """True for a device field that moves time and energy but no byte (see :func:`retarget`)."""
    parts = path.split(".")
    if parts[0] == "tiers":
        return len(parts) == 3 and parts[2] in TIMING_FIELDS
    return path in TIMING_PATHS or parts[0] in ("compute", "sustained_compute")


def retarget(system: SystemPlan, device: Device) -> SystemPlan | None:
    """The same plan on ``device``, which differs from the plan's device only in timing figures
    (:func:`is_timing_path`): every figure the lowering takes from the device is worked out
    again for it (the matmuls' rates, dequantization and quantization work and GEMV or GEMM
    kernel columns, attention's rate and KV conversion, the collectives' and hand-offs' link
    times, the tiers' and links' figures). None where a compute what-if changes a count after
    all: a class made native or taken away changes which activations a matmul quantizes, so
    their bits, and the plan, differ (plan afresh)."""
    workload = system.workload
    act_in, stream = get_format(workload.activations), stream_format(workload)
    act_peak = _stream_rate(device, stream)
    kv_dequant = kv_dequant_ops(device, get_format(workload.kv), stream)
    tiers = device.tiers
    stages = []
    for plan in system.stages:
        op_float = plan.op_float.copy()
        kinds = plan.op_int[:, k.C_KIND]
        matmuls = kinds == k.OP_MATMUL
        formats = np.array(plan.op_formats)
        gemm_tiles = dict(plan.runtime.gemm)
        for name in set(formats[matmuls].tolist()):
            path = matmul_path(device, get_format(name), act_in, plan.runtime)
            rows = matmuls & (formats == name)
            if (plan.op_int[rows, k.C_ACT_BITS] != activation_bits(path, act_in, stream)).any():
                return None
            op_float[rows, k.F_PEAK] = path.ops_per_s
            op_float[rows, k.F_DEQUANT_OPS] = path.dequant_ops_per_weight
            op_float[rows, k.F_ACT_QUANT_OPS] = path.act_quant_ops_per_element
            op_float[rows, k.F_GEMV:] = kernel_columns(device, path, gemm_tiles.get(name))
        collectives = np.flatnonzero(kinds == k.OP_COLLECTIVE)
        set_collective_times(plan.runtime, device, plan.op_int, op_float, collectives,
                             *distinct_rows(plan.op_int[collectives][:, COLLECTIVE_COLUMNS]))
        if system.parallel_stages:                        # expert groups' exchanges
            op_float[kinds == k.OP_ALL_TO_ALL, k.F_A2A_BANDWIDTH:k.F_A2A_LATENCY_S + 1] = (
                exchange_figures(device, system.shard.tp, workload.ep, plan.stage)[:2])
        for op in np.flatnonzero(kinds == k.OP_SEND):     # the link each hand-off crosses
            op_float[op, k.F_LINK_S:k.F_GEMV] = send_seconds(
                device, plan.runtime, plan.op_int[op],
                to_first=plan.op_names[op] == "send_tokens", stage=plan.stage,
                stages=plan.stages, tp=system.shard.tp)
        attention = kinds == k.OP_ATTENTION
        op_float[attention, k.F_PEAK] = act_peak
        op_float[attention, k.F_DEQUANT_OPS] = kv_dequant
        stages.append(dataclasses.replace(
            plan, device=device, op_float=op_float,
            tier_bandwidth=np.array([t.sustained_bandwidth for t in tiers], dtype=np.float64),
            tier_latency_s=np.array([t.latency_s for t in tiers], dtype=np.float64),
            tier_energy_j_per_byte=np.array([t.energy_j_per_byte for t in tiers],
                                            dtype=np.float64),
            launch_s=device.op_launch_s, kernel_fixed_s=device.kernel_fixed_s))
    return dataclasses.replace(system, device=device, stages=tuple(stages))
