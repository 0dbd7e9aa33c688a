"""Lowering (device, model, workload) into the flat tables the kernels walk.

The plan places every tensor on a tier (the device's layout), checks capacity, decides which
tensors the on-chip tier pins, and writes one row per op of one decode step: per layer the input
RMSNorm, the fused QKV projection, the KV append, attention over the cache, the output projection,
the FFN RMSNorm, gate, up and down; before the layers the embedding lookup, after them the final
norm and the LM head.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from memsim.device import Device
from memsim.errors import CapacityError, ConfigError
from memsim.formats import Format, bytes_for, get_format
from memsim.kernels import step as k
from memsim.model import Model
from memsim.units import format_quantity
from memsim.workload import Decode


@dataclass(frozen=True)
class Tensor:
    """A weight tensor or one layer's KV cache, where it lives and what it costs to store."""

    name: str
    kind: str          # "weight" or "kv"
    home: int          # tier index
    bytes: int
    pinned: bool
    aliased: bool = False    # its storage is another tensor's (a tied LM head)


@dataclass(frozen=True)
class Plan:
    """The kernels' input: a tier table, an op table and the residency set-up."""

    device: Device
    model: Model
    workload: Decode
    tier_names: tuple[str, ...]
    tier_capacity: np.ndarray
    tier_bandwidth: np.ndarray        # sustained, bytes/s
    tier_latency_s: np.ndarray
    tier_granularity: np.ndarray
    tier_energy_j_per_byte: np.ndarray
    op_int: np.ndarray                # [op, k.C_*]
    op_float: np.ndarray              # [op, k.F_*]
    op_names: tuple[str, ...]
    tensors: tuple[Tensor, ...]
    residency: str                    # "lru" or "pinned", resolved
    lru_capacity_bits: int
    max_lru_entries: int              # tiles the on-chip LRU can hold at once, at most

    @property
    def n_ops(self) -> int:
        """Ops in one decode step."""
        return self.op_int.shape[0]

    def bytes_by_tier(self, kind: str) -> dict[str, int]:
        """Bytes of weights (``kind="weight"``) or KV cache (``"kv"``) each tier holds."""
        held = dict.fromkeys(self.tier_names, 0)
        for tensor in self.tensors:
            if tensor.kind == kind and not tensor.aliased:
                held[self.tier_names[tensor.home]] += tensor.bytes
        return held


def kv_row_bits(model: Model, fmt: Format) -> int:
    """Bits of one token's K (or V) for one KV head, scales included."""
    return fmt.tensor_bits((1, model.head_dim)) - fmt.tensor_meta_bits


def kv_block_bytes(row_bits: int, kv_block: int, granularity: int) -> int:
    """Bytes of one paged-KV block of K (or V) for one head, rounded up to the tier's access."""
    block_bytes = -(-(kv_block * row_bits) // 8)
    return -(-block_bytes // granularity) * granularity


def kv_cache_bytes(model: Model, workload: Decode, tokens: int, granularity: int) -> int:
    """Bytes of every sequence's paged KV cache for one layer holding ``tokens`` tokens."""
    row_bits = kv_row_bits(model, get_format(workload.kv))
    blocks = -(-tokens // workload.kv_block)
    return (workload.batch * model.kv_heads * 2 * blocks
            * kv_block_bytes(row_bits, workload.kv_block, granularity))


def _resolve_residency(device: Device, workload: Decode) -> str:
    if workload.residency != "auto":
        return workload.residency
    return "pinned" if device.layout.policy in ("hybrid", "sram-resident") else "lru"


def _matmul_compute(device: Device, fmt: Format, act: Format) -> tuple[float, float]:
    """Peak the matmul runs at and the vector ops per weight to dequantize (0 when native)."""
    native = device.peak(fmt.compute)
    if native is not None:
        return native, 0.0
    return device.peak(act.compute) or device.matrix_peak, float(max(fmt.dequant_ops, 1))


def make_plan(device: Device, model: Model, workload: Decode) -> Plan:
    """Lower one decode step; raises CapacityError when the tensors do not fit their tiers."""
    wfmt = get_format(workload.weights)
    kvfmt = get_format(workload.kv)
    act = get_format(workload.activations)
    norm_fmt = act
    tile_k = workload.tile_k or device.tile_k
    tile_n = workload.tile_n or device.tile_n
    tiers = device.tiers
    names = tuple(t.name for t in tiers)
    w_home = names.index(device.layout.weights)
    kv_home = names.index(device.layout.kv)
    m_rows = workload.batch * workload.new_tokens
    m_grain = device.matrix_unit[0]
    residency = _resolve_residency(device, workload)
    final_tokens = workload.context + workload.steps * workload.new_tokens
    row_bits = kv_row_bits(model, kvfmt)
    if model.is_moe:
        raise ConfigError("mixture-of-experts models are not emulated yet (routing comes with the "
                          "MoE issue); choose a dense model", field="model")

    weight_peak, weight_dequant = _matmul_compute(device, wfmt, act)
    act_peak = device.peak(act.compute) or device.matrix_peak
    kv_dequant = 0.0 if kvfmt.compute == act.compute else float(max(kvfmt.dequant_ops, 1))

    tensors: list[Tensor] = []
    rows: list[np.ndarray] = []
    floats: list[tuple[float, float]] = []
    op_names: list[str] = []

    def add_tensor(name: str, kind: str, home: int, nbytes: int, aliased: bool = False) -> int:
        tensors.append(Tensor(name, kind, home, nbytes, False, aliased))
        return len(tensors) - 1

    def add_op(name: str, kind: int, layer: int, tensor: int, fmt: Format, *, m: int = 0,
               kk: int = 0, n: int = 0, peak: float = 0.0, dequant: float = 0.0) -> None:
        row = np.zeros(k.N_INT_COLS, dtype=np.int64)
        row[k.C_KIND] = kind
        row[k.C_LAYER] = layer
        row[k.C_M] = m
        row[k.C_K] = kk
        row[k.C_N] = n
        row[k.C_TENSOR] = tensor
        row[k.C_HOME] = tensors[tensor].home
        (row[k.C_ELEM_BITS], row[k.C_GROUP], row[k.C_META_BITS], row[k.C_PADDED],
         row[k.C_TENSOR_META_BITS]) = fmt.kernel_params(kk)
        row[k.C_TILE_K] = tile_k
        row[k.C_TILE_N] = tile_n
        row[k.C_M_GRAIN] = m_grain
        row[k.C_BATCH] = workload.batch
        row[k.C_KV_HEADS] = model.kv_heads
        row[k.C_Q_PER_KV] = model.heads // model.kv_heads
        row[k.C_HEAD_DIM] = model.head_dim
        row[k.C_CONTEXT] = workload.context
        row[k.C_NEW_TOKENS] = workload.new_tokens
        row[k.C_KV_BLOCK] = workload.kv_block
        row[k.C_KV_ROW_BITS] = row_bits
        row[k.C_ACT_BITS] = act.element_bits
        row[k.C_KV_MAX_BLOCKS] = -(-final_tokens // workload.kv_block)
        rows.append(row)
        floats.append((peak, dequant))
        op_names.append(name)

    def matmul(name: str, layer: int, kk: int, n: int) -> None:
        tensor = add_tensor(f"{name}.{layer}" if layer >= 0 else name, "weight", w_home,
                            bytes_for((n, kk), wfmt))
        add_op(name, k.OP_MATMUL, layer, tensor, wfmt, m=m_rows, kk=kk, n=n, peak=weight_peak,
               dequant=weight_dequant)

    def norm(name: str, layer: int) -> None:
        tensor = add_tensor(f"{name}.{layer}" if layer >= 0 else name, "weight", w_home,
                            bytes_for((1, model.hidden), norm_fmt))
        add_op(name, k.OP_NORM, layer, tensor, norm_fmt, m=m_rows, kk=model.hidden)

    h, hd = model.hidden, model.head_dim
    embed = add_tensor("embedding", "weight", w_home, bytes_for((model.vocab, h), wfmt))
    add_op("embed", k.OP_EMBED, -1, embed, wfmt, m=m_rows, kk=h, n=model.vocab)
    for layer in range(model.layers):
        norm("attn_norm", layer)
        matmul("qkv", layer, h, (model.heads + 2 * model.kv_heads) * hd)
        kv = add_tensor(f"kv.{layer}", "kv", kv_home,
                        kv_cache_bytes(model, workload, final_tokens, tiers[kv_home].granularity))
        add_op("kv_append", k.OP_KV_APPEND, layer, kv, kvfmt, kk=hd)
        add_op("attention", k.OP_ATTENTION, layer, kv, kvfmt, kk=hd, peak=act_peak,
               dequant=kv_dequant)
        matmul("o_proj", layer, model.heads * hd, h)
        norm("ffn_norm", layer)
        matmul("gate", layer, h, model.ffn)
        matmul("up", layer, h, model.ffn)
        matmul("down", layer, model.ffn, h)
    norm("final_norm", -1)
    if model.tied_embeddings:
        lm_head = add_tensor("lm_head", "weight", w_home, tensors[embed].bytes, aliased=True)
        add_op("lm_head", k.OP_MATMUL, -1, lm_head, wfmt, m=m_rows, kk=h, n=model.vocab,
               peak=weight_peak, dequant=weight_dequant)
    else:
        matmul("lm_head", -1, h, model.vocab)

    _check_capacity(device, model, workload, tensors)
    tensors, pinned_bits = _pin(tensors, residency, tiers[0].capacity)
    op_int = np.stack(rows)
    for op in range(op_int.shape[0]):
        op_int[op, k.C_PINNED] = int(tensors[op_int[op, k.C_TENSOR]].pinned)
    on_chip_resident = sum(t.bytes for t in tensors if t.home == 0 and not t.aliased)
    lru_capacity_bits = max(0, 8 * (tiers[0].capacity - on_chip_resident) - pinned_bits)
    return Plan(
        device=device, model=model, workload=workload, tier_names=names,
        tier_capacity=np.array([t.capacity for t in tiers], dtype=np.int64),
        tier_bandwidth=np.array([t.sustained_bandwidth for t in tiers], dtype=np.float64),
        tier_latency_s=np.array([t.latency_s for t in tiers], dtype=np.float64),
        tier_granularity=np.array([t.granularity for t in tiers], dtype=np.int64),
        tier_energy_j_per_byte=np.array([t.energy_j_per_byte for t in tiers], dtype=np.float64),
        op_int=op_int, op_float=np.array(floats, dtype=np.float64).reshape(-1, k.N_FLOAT_COLS),
        op_names=tuple(op_names), tensors=tuple(tensors), residency=residency,
        lru_capacity_bits=lru_capacity_bits,
        max_lru_entries=_max_lru_entries(op_int, tensors, lru_capacity_bits, workload, tiers),
    )


def _check_capacity(device: Device, model: Model, workload: Decode,
                    tensors: list[Tensor]) -> None:
    """Weights plus the KV cache at the last step's context must fit their home tiers."""
    need: dict[int, int] = {}
    for tensor in tensors:
        if not tensor.aliased:
            need[tensor.home] = need.get(tensor.home, 0) + tensor.bytes
    for home, nbytes in sorted(need.items()):
        tier = device.tiers[home]
        if nbytes > tier.capacity:
            weights = sum(t.bytes for t in tensors
                          if t.home == home and t.kind == "weight" and not t.aliased)
            short = nbytes - tier.capacity
            raise CapacityError(
                f"{model.name} at batch {workload.batch} and context {workload.context} needs "
                f"{nbytes:,} B in tier {tier.name!r} (weights {weights:,} B + KV cache "
                f"{nbytes - weights:,} B) but it holds {tier.capacity:,} B: short by {short:,} B "
                f"({format_quantity(short, 'capacity')}). Raise the tier's capacity with --set "
                f"tiers.{tier.name}.capacity=..., or use a smaller format; spilling to another "
                "tier and splitting across chips are not modelled yet.",
                shortfall_bytes=short, file=device.file, field=f"tiers.{tier.name}.capacity")


def _pin(tensors: list[Tensor], residency: str, on_chip_bytes: int) -> tuple[list[Tensor], int]:
    """Under the pinned policy, pin off-chip weights in order while they fit on chip."""
    if residency != "pinned":
        return tensors, 0
    free = on_chip_bytes - sum(t.bytes for t in tensors if t.home == 0 and not t.aliased)
    pinned_bytes = 0
    out = []
    for tensor in tensors:
        pin = tensor.kind == "weight" and tensor.home != 0 and pinned_bytes + tensor.bytes <= free
        if pin:
            pinned_bytes += tensor.bytes
        out.append(dataclasses.replace(tensor, pinned=pin))
    return out, 8 * pinned_bytes


def _max_lru_entries(op_int: np.ndarray, tensors: list[Tensor], capacity_bits: int,
                     workload: Decode, tiers: tuple) -> int:
    """An upper bound on tiles the LRU can hold at once: bounded by the on-chip capacity."""
    smallest = None
    distinct = 0
    for row in op_int:
        tensor = tensors[row[k.C_TENSOR]]
        if tensor.home == 0 or tensor.pinned or row[k.C_KIND] == k.OP_KV_APPEND:
            continue
        kind = row[k.C_KIND]
        if kind == k.OP_MATMUL:
            tk, tn, kk, n = row[k.C_TILE_K], row[k.C_TILE_N], row[k.C_K], row[k.C_N]
            min_k = min(tk, kk % tk or tk)
            min_n = min(tn, n % tn or tn)
            bits = min_k * min_n * row[k.C_ELEM_BITS]
            distinct += -(-kk // tk) * -(-n // tn)
        elif kind == k.OP_ATTENTION:
            bits = 8 * kv_block_bytes(row[k.C_KV_ROW_BITS], workload.kv_block,
                                      tiers[tensor.home].granularity)
            distinct += 2 * workload.batch * row[k.C_KV_HEADS] * row[k.C_KV_MAX_BLOCKS]
        elif kind == k.OP_EMBED:
            bits = row[k.C_K] * row[k.C_ELEM_BITS]
            distinct += row[k.C_M] * workload.steps
        else:
            bits = row[k.C_K] * row[k.C_ELEM_BITS]
            distinct += 1
        smallest = bits if smallest is None else min(smallest, bits)
    if smallest is None or capacity_bits == 0:
        return 1
    return int(max(1, min(distinct, capacity_bits // max(int(smallest), 1) + 1)))
