"""What a decode step must read when nothing is reused, in closed form, and the check against it.

Every op of a step reads each of its tiles once, so the bytes the compute reads on chip are known
without walking a tile: every weight tensor's storage (:func:`memsim.bytes_for`), one embedding
row per token, and every sequence's KV blocks, each rounded up to its home tier's access
granularity. On a device where nothing is found on chip twice (:func:`no_reuse`) the same bytes
come from the tensors' homes. The walker bills groups, scales and ragged tiles tile by tile, so a
mistake in any of them shows up here as a difference of a few bytes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from memsim.checkpoints import weight_formats
from memsim.device import Device
from memsim.formats import Format, bytes_for, get_format
from memsim.model import Model
from memsim.plan import plan_system, stream_format
from memsim.report import Report
from memsim.testing.invariants import fail
from memsim.workload import Decode


@dataclass(frozen=True)
class StreamedBytes:
    """Bytes one decode step moves, per op name (summed over layers and microbatches).

    ``read``: what each op reads, every tile once (on chip in any case; from the tensors' homes
    when nothing is reused). ``written``: what each KV append writes to its KV's home.
    """

    read: dict[str, int] = field(default_factory=dict)
    written: dict[str, int] = field(default_factory=dict)

    @property
    def total_read(self) -> int:
        """Bytes read by every op of the step."""
        return sum(self.read.values())


def _row_bits(fmt: Format, k: int) -> int:
    """One row of ``k`` elements with its group metadata, without the per-tensor scale."""
    return fmt.tensor_bits((1, k)) - fmt.tensor_meta_bits


def _round_up(n: int, grain: int) -> int:
    return -(-n // grain) * grain


def streamed_bytes(device: Device, model: Model, workload: Decode, *,
                   step: int = -1) -> StreamedBytes:
    """The bytes decode step ``step`` (0-based; -1: the last) reads and writes, in closed form.

    For a dense model without tensor or expert parallelism (pipeline stages and microbatches
    allowed: each microbatch reads the weights again); the device and the workload's layout
    decide only where the KV blocks live, whose tier's access granularity rounds them.
    """
    if model.is_moe:
        raise ValueError("the closed form covers dense models; an MoE step reads the experts "
                         "its tokens chose")
    if model.is_mla:
        raise ValueError("the closed form covers grouped-query attention; an MLA layer's absorbed "
                         "ops are checked by tests/test_mla.py")
    if workload.tp != 1 or workload.ep != 1:
        raise ValueError(f"the closed form covers one chip per stage, got tp={workload.tp}, "
                         f"ep={workload.ep}")
    step = workload.steps - 1 if step < 0 else step
    formats, kvfmt = weight_formats(workload.weights), get_format(workload.kv)
    act = stream_format(workload)     # norms are stored in the residual stream's type
    h, hd, micro = model.hidden, model.head_dim, workload.microbatches
    rows = workload.microbatch * workload.new_tokens
    read: Counter[str] = Counter()

    def stored(role: str, layer: int, shape: tuple[int, int]) -> int:
        """Bytes of a weight of ``shape`` (N x K) in the checkpoint's format for its role."""
        fmt = formats.for_tensor(role, layer, model.layers, tied=model.tied_embeddings,
                                 k=shape[1])
        return bytes_for(shape, fmt)

    for layer in range(model.layers):
        read["attn_norm"] += micro * bytes_for((1, h), act)
        read["ffn_norm"] += micro * bytes_for((1, h), act)
        if formats.qkv_split(layer, model.layers, k=h):
            for part, heads in (("q", model.heads), ("k", model.kv_heads), ("v", model.kv_heads)):
                read[part] += micro * stored(part, layer, (heads * hd, h))
        else:
            read["qkv"] += micro * stored("qkv", layer, ((model.heads + 2 * model.kv_heads) * hd,
                                                          h))
        read["o_proj"] += micro * stored("o_proj", layer, (h, model.heads * hd))
        for role, shape in (("gate", (model.ffn, h)), ("up", (model.ffn, h)),
                            ("down", (h, model.ffn))):
            read[role] += micro * stored(role, layer, shape)
    embedding = formats.for_tensor("embedding", -1, model.layers, tied=model.tied_embeddings, k=h)
    read["embed"] += micro * -(-rows * _row_bits(embedding, h) // 8)
    read["final_norm"] += micro * bytes_for((1, h), act)
    read["lm_head"] += micro * stored("lm_head", -1, (model.vocab, h))
    if workload.draft_heads:
        read["draft_head_res"] += micro * workload.draft_heads * stored("draft_head", -1, (h, h))
        read["draft_head_lm"] += micro * workload.draft_heads * stored("draft_head", -1,
                                                                       (model.vocab, h))

    kv_row = _row_bits(kvfmt, hd)
    block = workload.kv_block
    tokens = workload.context + (step + 1) * workload.new_tokens
    first_new = workload.context + step * workload.new_tokens
    streams = workload.microbatch * model.kv_heads * 2           # K and V of every head
    written: Counter[str] = Counter()
    for plan in plan_system(device, model, workload).stages:
        for tensor in plan.tensors:
            if tensor.kind != "kv":
                continue
            grain = [device.tiers[tier].granularity for tier in (tensor.home, tensor.home_hi)]
            block_bytes = [_round_up(-(-block * kv_row // 8), g) for g in grain]
            blocks = -(-tokens // block)
            near = min(tensor.split, blocks)            # blocks below the split live on home
            read["attention"] += streams * (near * block_bytes[0]
                                            + (blocks - near) * block_bytes[1])
            below = min(workload.new_tokens, max(0, tensor.split * block - first_new))
            for part, count in enumerate((below, workload.new_tokens - below)):
                if count:
                    written["kv_append"] += streams * _round_up(-(-count * kv_row // 8),
                                                                grain[part])
    return StreamedBytes(read=dict(read), written=dict(written))


def no_reuse(device: Device) -> Device:
    """The device with a one-byte on-chip tier: nothing it reads is found on chip twice, so every
    byte comes from its home (for layouts that home weights and KV off chip)."""
    on_chip = device.tiers[0].name
    return device.with_overrides({f"tiers.{on_chip}.granularity": "1 B",
                                  f"tiers.{on_chip}.capacity": "1 B"})


def assert_matches_closed_form(report: Report, device: Device, model: Model,
                               workload: Decode) -> None:
    """The cold and warm steps read and write what :func:`streamed_bytes` says, op by op name.

    Always: the bytes each op read on chip (everything the compute consumed) and the bytes each
    KV append wrote. Where an op found nothing on chip (no hits, as on :func:`no_reuse`
    devices), also the bytes it read from the tiers further out.
    """
    on_chip = report.tier_names[0]
    for which, counts, summary in (("cold", report.cold_counts, report.cold),
                                   ("warm", report.warm_counts, report.warm)):
        expected = streamed_bytes(device, model, workload, step=summary.step)
        rows = report.op_rows(which)
        read: Counter[str] = Counter()
        outside: Counter[str] = Counter()
        written: Counter[str] = Counter()
        hits: Counter[str] = Counter()
        for row in rows:
            read[row.name] += row.bytes_read[on_chip]
            outside[row.name] += -(-int(counts.read_bits[row.index, 1:].sum()) // 8)
            written[row.name] += sum(row.bytes_written.values()) if row.name == "kv_append" else 0
            hits[row.name] += row.hits
        for name in sorted(set(read) | set(expected.read)):
            want = expected.read.get(name, 0)
            if read[name] != want:
                fail(f"{which} step (step {summary.step}), {name}: bytes read on chip", want,
                     read[name], f"{read[name] - want:+} B")
            if hits[name] == 0 and want and outside[name] != want:
                fail(f"{which} step (step {summary.step}), {name}: bytes read from further out "
                     f"(no hits)", want, outside[name], f"{outside[name] - want:+} B")
        for name, want in expected.written.items():
            if written[name] != want:
                fail(f"{which} step (step {summary.step}), {name}: bytes written", want,
                     written[name], f"{written[name] - want:+} B")
