"""Speed of the walker, as ratios against floors measured in the same run.

The floor that matters is an exact LRU: :func:`replay_lru`, a tight per-tile LRU (a doubly
linked list over tile ids in preallocated arrays, nothing else) replaying the very tiles a decode
step looks up (:func:`tile_stream`), with the same byte capacity. The walker does that and every
other thing a step needs (tiling, exact bits, counters, waves, times), so on a step where every
tile goes through the LRU its time per tile event is compared with the replay's. A tensor the
on-chip tier holds none of misses every tile: the walker sums a matmul wave's units in closed
form (a streamed attention wave once per split index) and sets the LRU's state run by run, so
there it beats the per-tile replay by far. Likewise a matmul unit's, or a KV stream's,
consecutive hits on one held run of tiles are one relink in the walker (the state those single
hits leave, tile for tile), so on the every-tile-a-hit case the ratio falls below 1.

The second floor, kept for comparison, is a bare loop that sums tile sizes (SIMD, no per-tile
state): no exact walk can approach it, so it bounds nothing but the loop overhead.

The cases: an H100 (50 MB of L2 against gigabytes of weights: streamed) and an H100 whose
on-chip tier is grown to hold all of Llama 3 8B (every tile an LRU hit). Timings are the best of
a few repetitions after a warm-up, so compile time and a busy neighbour weigh as little as
possible.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from memsim.device import device
from memsim.emulate import Residency, run_step
from memsim.kernels import step as k
from memsim.kernels.jit import jit
from memsim.model import model
from memsim.plan import Plan, make_plan
from memsim.workload import Decode

NIL = -1
# Columns of a replay node (one row per tile id; four columns keep a row in one cache line).
P_OLDER = 0
P_NEWER = 1
P_BITS = 2          # bits the LRU holds for the tile; NIL when it is not held


def _best_of(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def floor_ns_per_tile(n_tiles: int = 20_000_000, repeats: int = 5) -> float:
    """Nanoseconds per tile of the bare loop that only sums tile sizes (128 x 128 tiles)."""
    side = int(n_tiles ** 0.5) * 128 + 64          # ragged last tiles, as in a real matrix
    k.sum_tile_bits(1000, 1000, 128, 128, 16)
    tiles = (-(-side // 128)) ** 2
    return _best_of(lambda: k.sum_tile_bits(side, side, 128, 128, 16), repeats) / tiles * 1e9


@jit
def replay_lru(ids, bits, capacity_bits, nodes, state):
    """Look tiles ``ids`` (of ``bits`` each) up in an exact LRU with a byte capacity.

    ``nodes`` is ``[tile id, 4]`` (``P_*`` columns), ``state`` is ``[newest, oldest, used bits]``;
    both carry over between calls. A miss evicts the oldest tiles until the tile fits; a tile
    larger than the capacity displaces everything and is not kept (as in memsim's walker).
    Returns ``(hits, misses)``.
    """
    newest = state[0]
    oldest = state[1]
    used = state[2]
    hits = 0
    for i in range(ids.shape[0]):
        t = ids[i]
        if nodes[t, P_BITS] != NIL:
            hits += 1
            if t != newest:
                older = nodes[t, P_OLDER]
                newer = nodes[t, P_NEWER]
                nodes[newer, P_OLDER] = older
                if older == NIL:
                    oldest = newer
                else:
                    nodes[older, P_NEWER] = newer
                nodes[t, P_OLDER] = newest
                nodes[t, P_NEWER] = NIL
                nodes[newest, P_NEWER] = t
                newest = t
            continue
        b = bits[i]
        while oldest != NIL and (used + b > capacity_bits or b > capacity_bits):
            used -= nodes[oldest, P_BITS]
            nodes[oldest, P_BITS] = NIL
            oldest = nodes[oldest, P_NEWER]
            if oldest == NIL:
                newest = NIL
            else:
                nodes[oldest, P_OLDER] = NIL
        if b > capacity_bits:
            continue
        used += b
        nodes[t, P_BITS] = b
        nodes[t, P_OLDER] = newest
        nodes[t, P_NEWER] = NIL
        if newest == NIL:
            oldest = t
        else:
            nodes[newest, P_NEWER] = t
        newest = t
    state[0] = newest
    state[1] = oldest
    state[2] = used
    return hits, ids.shape[0] - hits


def new_replay(n_ids: int) -> tuple[np.ndarray, np.ndarray]:
    """An empty LRU for :func:`replay_lru` over tile ids ``0 .. n_ids - 1``."""
    return np.full((n_ids, 4), NIL, dtype=np.int64), np.array([NIL, NIL, 0], dtype=np.int64)


def _tile_bits(k0, kk, nn, elem_bits: int, group: int, meta_bits: int, padded: int):
    """Bits of ``nn`` rows of ``kk`` elements from ``k0`` (arrays or ints); a group belongs to
    the tile it starts in (the walker's convention; :func:`tile_stream` checks the totals)."""
    if group == 0:
        return kk * nn * elem_bits
    starts = (k0 + kk + group - 1) // group - (k0 + group - 1) // group
    payload = starts * group if padded else kk
    return (payload * elem_bits + starts * meta_bits) * nn


def _op_tiles(plan: Plan, op: int, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The tiles op ``op`` looks up at ``step``, in the walker's order: index, bits, home tier."""
    row = plan.op_int[op]
    kind = int(row[k.C_KIND])
    fmt = (int(row[k.C_ELEM_BITS]), int(row[k.C_GROUP]), int(row[k.C_META_BITS]),
           int(row[k.C_PADDED]))
    if kind == k.OP_MATMUL:
        kd, n, tk, tn = (int(row[c]) for c in (k.C_K, k.C_N, k.C_TILE_K, k.C_TILE_N))
        k_tiles = -(-kd // tk)
        t = np.arange(-(-n // tn) * k_tiles, dtype=np.int64)
        nt, k0 = t // k_tiles, t % k_tiles * tk
        bits = _tile_bits(k0, np.minimum(tk, kd - k0), np.minimum(tn, n - nt * tn), *fmt)
        bits[0] += row[k.C_TENSOR_META_BITS]
        unit = nt
    elif kind == k.OP_ATTENTION:
        tokens = int(row[k.C_CONTEXT]) + (step + 1) * int(row[k.C_NEW_TOKENS])
        blocks = -(-tokens // int(row[k.C_KV_BLOCK]))
        streams = int(row[k.C_BATCH]) * int(row[k.C_KV_HEADS])
        stream, j, kv = np.meshgrid(np.arange(streams), np.arange(blocks), np.arange(2),
                                    indexing="ij")
        t = ((stream * int(row[k.C_KV_MAX_BLOCKS]) + j) * 2 + kv).ravel()
        unit = j.ravel()
        block_bytes = (int(row[k.C_KV_BLOCK]) * int(row[k.C_KV_ROW_BITS]) + 7) // 8
        grain = plan.tier_granularity
        home_bits = 8 * (-(-block_bytes // grain) * grain)
        homes = np.where(unit < row[k.C_SPLIT], row[k.C_HOME], row[k.C_HOME_HI])
        return t, home_bits[homes], homes
    elif kind == k.OP_EMBED:
        base = step * int(row[k.C_STEP_TOKENS]) + int(row[k.C_TOKEN_BASE])
        t = np.sort([int(k.token_id(plan.workload.seed, base + r, int(row[k.C_N])))
                     for r in range(int(row[k.C_M]))]).astype(np.int64)
        t = t[t < row[k.C_ROWS_HERE]]
        bits = np.full(t.shape, _tile_bits(0, int(row[k.C_K]), 1, *fmt), dtype=np.int64)
        unit = t
    elif kind == k.OP_NORM:
        t = np.zeros(1, dtype=np.int64)
        bits = t + _tile_bits(0, int(row[k.C_K]), 1, *fmt) + int(row[k.C_TENSOR_META_BITS])
        unit = t
    else:
        return (np.zeros(0, dtype=np.int64),) * 3
    homes = np.where(unit < row[k.C_SPLIT], row[k.C_HOME], row[k.C_HOME_HI])
    return t, bits, homes


@dataclass(frozen=True)
class TileStream:
    """The tiles a decode step looks up in the on-chip LRU, in order.

    Attributes
    ----------
    ids : int64 tile ids, dense over the plan's tensors (tensor base + tile index).
    bits : int64 bits of each lookup.
    n_ids : tile ids the plan can name (the size of a replay's node table).
    """

    ids: np.ndarray
    bits: np.ndarray
    n_ids: int


def tile_stream(plan: Plan, step: int) -> TileStream:
    """The LRU lookups of the walker's step ``step`` of a dense model's plan, in its order.

    Tiles whose home is the on-chip tier and pinned tensors never reach the LRU and are left
    out; so are MoE expert matmuls, whose tokens depend on the step's routes.
    """
    if (plan.op_int[:, k.C_ROUTE] >= 0).any():
        raise ValueError("tile_stream covers dense models only")
    per_op = [_op_tiles(plan, op, step) for op in range(plan.n_ops)]
    tensors = plan.op_int[:, k.C_TENSOR]
    base = np.concatenate(([0], np.cumsum(_tile_ids(plan))))
    ids, bits = [], []
    for op, (t, b, homes) in enumerate(per_op):
        lookups = (homes != 0) & (plan.op_int[op, k.C_PINNED] == 0)
        ids.append(base[tensors[op]] + t[lookups])
        bits.append(b[lookups])
    return TileStream(np.concatenate(ids), np.concatenate(bits), int(base[-1]))


def _tile_ids(plan: Plan) -> np.ndarray:
    """Tile indices each tensor can use at any step (a KV cache's at its last step)."""
    sizes = np.zeros(len(plan.tensors), dtype=np.int64)
    for row in plan.op_int:
        kind = row[k.C_KIND]
        if kind == k.OP_MATMUL:
            tiles = -(-row[k.C_N] // row[k.C_TILE_N]) * -(-row[k.C_K] // row[k.C_TILE_K])
        elif kind == k.OP_ATTENTION:
            tiles = row[k.C_BATCH] * row[k.C_KV_HEADS] * row[k.C_KV_MAX_BLOCKS] * 2
        elif kind == k.OP_EMBED:
            tiles = row[k.C_ROWS_HERE]
        elif kind == k.OP_NORM:
            tiles = 1
        else:
            continue
        sizes[row[k.C_TENSOR]] = max(sizes[row[k.C_TENSOR]], int(tiles))
    return sizes


@dataclass(frozen=True)
class StepSpeed:
    """One warm decode step through memsim's walker and through the exact-LRU replay.

    Attributes
    ----------
    walk_s : seconds of the walker's step (best of the repeats).
    events : tile events of the walker's step (LRU hits and misses, on-chip hits included).
    replay_s : seconds of :func:`replay_lru` over the step's :func:`tile_stream`.
    lookups : LRU lookups of the replay; ``replay_hits`` of them hit.
    walker_hits, replay_hits : hits counted by each (equal when the stream is the walker's).
    """

    walk_s: float
    events: int
    replay_s: float
    lookups: int
    walker_hits: int
    replay_hits: int


def step_speed(plan: Plan, repeats: int) -> StepSpeed:
    """Time warm step 1 of ``plan`` through the walker and through the exact-LRU replay."""
    residency = Residency(plan)
    run_step(plan, residency, 0)
    counts = run_step(plan, residency, 1)
    steps = iter(range(2, 10_000))
    walk_s = _best_of(lambda: run_step(plan, residency, next(steps)), repeats)
    cold, warm = tile_stream(plan, 0), tile_stream(plan, 1)
    nodes, state = new_replay(warm.n_ids)
    replay_lru(cold.ids, cold.bits, plan.lru_capacity_bits, nodes, state)
    replay_hits, _ = replay_lru(warm.ids, warm.bits, plan.lru_capacity_bits, nodes, state)
    replay_s = _best_of(lambda: replay_lru(warm.ids, warm.bits, plan.lru_capacity_bits, nodes,
                                           state), repeats)
    results = counts.results
    return StepSpeed(walk_s=walk_s, events=int(results[:, k.R_HITS].sum()
                                               + results[:, k.R_MISSES].sum()),
                     replay_s=replay_s, lookups=len(warm.ids),
                     walker_hits=int(results[:, k.R_HITS].sum()), replay_hits=int(replay_hits))


def bench_plan(model_name: str, context: int, on_chip: str | None = None) -> Plan:
    """Batch 1 on an H100 with room for the model (and ``on_chip`` of on-chip tier), LRU
    residency, 128 x 128 tiles."""
    overrides = {"tiers.hbm.capacity": "1 TB"}
    if on_chip:
        overrides["tiers.sram.capacity"] = on_chip
    dev = device("h100-sxm").with_overrides(overrides)
    return make_plan(dev, model(model_name), Decode(batch=1, context=context, tile_k=128,
                                                    tile_n=128, residency="lru"))


def run_benchmarks(quick: bool = False) -> str:
    """Measure and format the benchmark figures."""
    simd = floor_ns_per_tile(n_tiles=2_000_000 if quick else 20_000_000)
    cases = [("llama-3-8b", 4096, None), ("llama-3-8b", 4096, "32 GiB")]
    if not quick:
        cases.append(("llama-3-70b", 8192, None))
    lines = ["per tile event, walker against floors measured in this run:",
             f"  SIMD floor: a bare loop summing tile sizes, no per-tile state  {simd:7.3f} ns"]
    for name, context, on_chip in cases:
        speed = step_speed(bench_plan(name, context, on_chip), repeats=3)
        walk_ns = speed.walk_s / speed.events * 1e9
        replay_ns = speed.replay_s / max(1, speed.lookups) * 1e9
        tier = f"{on_chip} on chip, every tile an LRU hit" if on_chip else "50 MB L2"
        lines += [
            f"{name} warm step, batch 1, context {context}, 128x128 tiles, {tier}:",
            f"  memsim walker   {speed.walk_s * 1e3:9.2f} ms  {speed.events:>11,} tile events "
            f"{walk_ns:7.2f} ns each",
            f"  exact-LRU floor {speed.replay_s * 1e3:9.2f} ms  {speed.lookups:>11,} LRU lookups "
            f"{replay_ns:7.2f} ns each ({speed.replay_hits:,} hits)",
            f"  walker / exact-LRU floor {speed.walk_s / speed.replay_s:6.2f} x per step, "
            f"{walk_ns / replay_ns:6.2f} x per event; walker / SIMD floor "
            f"{walk_ns / simd:6.1f} x per event",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(run_benchmarks())
