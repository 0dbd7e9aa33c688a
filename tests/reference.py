"""Pure-Python reference twin of the decode-step walker (kernels/step.py), for the tests only.

It re-does, slowly and obviously, what the Numba kernel does: the same walk over tiles, an LRU
kept as an OrderedDict of (tensor, tile) -> bits, the same counters and the same cycle model.
Tests compare the two count for count on small random shapes.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from memsim.kernels import step as k
from memsim.plan import Plan

OP_COLUMNS = ("hits", "misses", "hit_bits", "flops", "vector_ops", "waves", "act_read_bits",
              "act_written_bits", "link_bits")


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def work_units(streams: int, chunks: int, cores: int) -> tuple[int, int, int, int]:
    """Split each stream into equal runs of chunks until the cores are busy (split-K,
    flash-decoding); returns splits per stream, chunks per unit, units and waves."""
    split = min(chunks, cores // streams) if streams < cores else 1
    per_unit = _ceil(chunks, split)
    split = _ceil(chunks, per_unit)
    units = streams * split
    return split, per_unit, units, _ceil(units, cores)


def split_reduction(counters: dict, outputs: int, partial_width: int, out_width: int,
                    split: int, act_bits: int) -> int:
    """Read every split's FP32 partial results, write the outputs once; the on-chip bits."""
    read = split * outputs * partial_width * k.PARTIAL_SUM_BITS
    written = outputs * out_width * act_bits
    counters["act_read_bits"] += read
    counters["act_written_bits"] += written
    return read + written


def tile_bits(k0: int, kk: int, nn: int, elem_bits: int, group: int, meta_bits: int,
              padded: bool) -> int:
    """Bits of an nn-column tile covering inputs [k0, k0 + kk): each group is billed to the tile
    holding its first element, with its metadata, and padded whole for block formats."""
    if group == 0:
        return kk * nn * elem_bits
    starts = [g for g in range(k0, k0 + kk) if g % group == 0]
    payload = len(starts) * group if padded else kk
    return nn * (payload * elem_bits + len(starts) * meta_bits)


@dataclass
class ReferenceLRU:
    """Byte-capacity LRU over tiles: evict the least recent until the new tile fits."""

    capacity_bits: int
    tiles: OrderedDict = field(default_factory=OrderedDict)

    def touch(self, key: tuple, bits: int) -> bool:
        if key in self.tiles:
            self.tiles.move_to_end(key)
            return True
        if bits > self.capacity_bits:
            self.tiles.clear()
            return False
        while sum(self.tiles.values()) + bits > self.capacity_bits:
            self.tiles.popitem(last=False)
        self.tiles[key] = bits
        return False


@dataclass
class ReferenceState:
    lru: ReferenceLRU
    pinned_loaded: set = field(default_factory=set)


def new_state(plan: Plan) -> ReferenceState:
    return ReferenceState(ReferenceLRU(plan.lru_capacity_bits))


def run_step(plan: Plan, state: ReferenceState, step: int, routes=None) -> dict:
    """One decode step: per-op counters as lists, same layout as the kernel's outputs;
    ``routes`` is the step's MoE route table."""
    dev = plan.device
    n_ops, n_tiers = plan.n_ops, len(plan.tier_names)
    out = {
        "read": [[0] * n_tiers for _ in range(n_ops)],
        "written": [[0] * n_tiers for _ in range(n_ops)],
        "ops": [dict.fromkeys(OP_COLUMNS, 0) for _ in range(n_ops)],
        "times": [[0.0] * (n_tiers + 4) for _ in range(n_ops)],
    }
    loaded_now = set(state.pinned_loaded)
    cores = dev.cores
    bw = [float(x) for x in plan.tier_bandwidth]
    lat = [float(x) for x in plan.tier_latency_s]
    gran = [int(x) for x in plan.tier_granularity]

    for op in range(n_ops):
        row = [int(x) for x in plan.op_int[op]]
        peak, dequant, act_quant, link_s, link_latency_s = (
            float(x) for x in plan.op_float[op, :k.F_GEMV])
        gemv_fixed = [float(x) for x in plan.op_float[op, k.F_GEMV:k.F_GEMV + k.N_GEMV_PIPES]]
        gemv_row = [float(x) for x in plan.op_float[op, k.F_GEMV + k.N_GEMV_PIPES:k.F_MLP]]
        mlp = [float(x) for x in plan.op_float[op, k.F_MLP:k.F_MLP + k.N_MLP_COLS]]
        kind, tensor, pinned = row[k.C_KIND], row[k.C_TENSOR], row[k.C_PINNED]
        act_bits = row[k.C_ACT_BITS]
        counters = out["ops"][op]
        wave = [0] * n_tiers

        def home_of(unit: int) -> int:
            """Units below the split live on C_HOME, the others on C_HOME_HI."""
            return row[k.C_HOME] if unit < row[k.C_SPLIT] else row[k.C_HOME_HI]

        def fetch(index: int, bits: int, home: int) -> None:
            if home == 0:
                hit = True
            elif pinned:
                hit = tensor in state.pinned_loaded
                loaded_now.add(tensor)
            else:
                hit = state.lru.touch((tensor, index), bits)
            out["read"][op][0] += bits
            wave[0] += bits
            if hit:
                counters["hits"] += 1
                counters["hit_bits"] += bits
            else:
                counters["misses"] += 1
                out["read"][op][home] += bits
                out["written"][op][0] += bits
                wave[home] += bits

        def close_wave(compute_s: float, in_flight: float = 0.0, share: int = 1) -> None:
            best, col, farthest = compute_s / share, n_tiers + 1, 0
            for t in range(n_tiers):
                if wave[t] > 0:
                    farthest = t
                    seconds = wave[t] / 8.0 / bw[t]
                    if t > 0 and in_flight > 0.0:      # Little's law: bytes in flight / latency
                        seconds = max(seconds, wave[t] / 8.0 * lat[t] / in_flight)
                    if seconds > best:
                        best, col = seconds, t
                wave[t] = 0
            out["times"][op][col] += best
            out["times"][op][n_tiers + 2] += lat[farthest] / share

        def padded_rows(rows: int) -> int:
            grain = row[k.C_M_GRAIN]
            return _ceil(rows, grain) * grain if grain > 1 else rows

        routed = row[k.C_ROUTE] >= 0
        if kind == k.OP_MATMUL and routed and routes[row[k.C_ROUTE]][row[k.C_ROUTE_COL]] == 0:
            pass                                     # an expert no token chose: not touched
        elif kind == k.OP_ALL_TO_ALL:
            sent = int(routes[row[k.C_ROUTE]][row[k.C_ROUTE_COL]]) * row[k.C_K] * act_bits
            counters["link_bits"] += sent
            counters["act_read_bits"] += sent
            counters["waves"] += 1
            out["times"][op][n_tiers] += sent / 8.0 / plan.op_float[op, k.F_A2A_BANDWIDTH]
            out["times"][op][n_tiers + 2] += plan.op_float[op, k.F_A2A_LATENCY_S]
        elif kind == k.OP_MATMUL:
            m, kdim, n = row[k.C_M], row[k.C_K], row[k.C_N]
            if routed:
                m = int(routes[row[k.C_ROUTE]][row[k.C_ROUTE_COL]])
            tk, tn = row[k.C_TILE_K], row[k.C_TILE_N]
            n_tiles, k_tiles = _ceil(n, tn), _ceil(kdim, tk)
            # M tiles (a prompt's GEMM): units are (N tile, M tile) pairs, N tile outer
            tm = row[k.C_TILE_M] if 0 < row[k.C_TILE_M] < m else m
            m_tiles = _ceil(m, tm) if m else 1
            share = row[k.C_GRID_SHARE]     # matmuls of one grid: each has its share of cores
            grid = cores // share
            if row[k.C_SPLIT_K]:
                split, per_unit, units, waves = work_units(n_tiles * m_tiles, k_tiles, grid)
            else:       # a kernel without split-K: one unit per output tile
                split, per_unit, units = 1, k_tiles, n_tiles * m_tiles
                waves = _ceil(units, grid)
            out_bits = k.PARTIAL_SUM_BITS if split > 1 else act_bits
            quant_ops = act_quant * m * kdim
            counters["vector_ops"] += int(quant_ops)
            gemv = m <= row[k.C_GEMV]     # the runtime's GEMV takes at most C_GEMV rows
            in_flight = 0.0       # resident blocks (a GEMV's, or CTAs without split-K) x bytes
            if (gemv or not row[k.C_SPLIT_K]) and mlp[0] > 0 and m <= mlp[3]:
                in_flight = min(_ceil(n, int(mlp[2])), grid * mlp[1]) * mlp[0]
            for w in range(waves):
                slowest = quant_ops / dev.vector_ops_per_s if w == 0 else 0.0
                for u in range(w * grid, min(units, (w + 1) * grid)):
                    nt, mt, kt0 = u // split // m_tiles, u // split % m_tiles, (u % split) * per_unit
                    rows = min(tm, m - mt * tm)
                    kt1 = min(k_tiles, kt0 + per_unit)
                    nn = min(tn, n - nt * tn)
                    elements = 0
                    for kt in range(kt0, kt1):
                        kk = min(tk, kdim - kt * tk)
                        bits = tile_bits(kt * tk, kk, nn, row[k.C_ELEM_BITS], row[k.C_GROUP],
                                         row[k.C_META_BITS], bool(row[k.C_PADDED]))
                        if kt == 0 and nt == 0:
                            bits += row[k.C_TENSOR_META_BITS]
                        fetch(nt * k_tiles + kt, bits, home_of(nt))
                        elements += kk * nn
                    covered = min(kdim, kt1 * tk) - kt0 * tk
                    if nt % row[k.C_ACT_REUSE] == 0:      # the activation chunk is staged
                        counters["act_read_bits"] += rows * covered * act_bits
                        wave[0] += rows * covered * act_bits
                    counters["act_written_bits"] += rows * nn * out_bits
                    wave[0] += rows * nn * out_bits
                    counters["flops"] += 2 * rows * elements
                    vector_ops = dequant * elements
                    counters["vector_ops"] += int(vector_ops)
                    core_vector = dev.vector_ops_per_s / cores
                    unit_s = max(2.0 * padded_rows(rows) * elements / (peak / cores),
                                 vector_ops / core_vector)
                    if gemv:                # a counted GEMV is the kernel the runtime runs
                        per_weight = max(f + rows * r for f, r in zip(gemv_fixed, gemv_row))
                        unit_s = (per_weight * elements if per_weight > 0 else
                                  min(unit_s, (2.0 * rows * elements + vector_ops)
                                      / core_vector))
                    slowest = max(slowest, unit_s)
                if w == waves - 1 and split > 1:
                    wave[0] += split_reduction(counters, m, n, n, split, act_bits)
                close_wave(slowest, in_flight, share)
            counters["waves"] += waves

        elif kind == k.OP_ATTENTION:
            heads, per_kv, hd = row[k.C_KV_HEADS], row[k.C_Q_PER_KV], row[k.C_HEAD_DIM]
            v_dim, parts = row[k.C_V_DIM], row[k.C_KV_PARTS]     # (values' width, rows cached)
            new, block = row[k.C_NEW_TOKENS], row[k.C_KV_BLOCK]
            tokens = row[k.C_CONTEXT] + (step + 1) * new
            blocks = _ceil(tokens, block)

            def block_bits(j: int) -> int:
                grain = gran[home_of(j)]
                return 8 * _ceil(_ceil(block * row[k.C_KV_ROW_BITS], 8), grain) * grain
            rows = per_kv * new
            streams = row[k.C_BATCH] * heads
            # flash attention over a prompt: one unit per (stream, query tile), never split
            q_tile = row[k.C_Q_TILE] if 0 < row[k.C_Q_TILE] < new else new
            q_tiles = _ceil(new, q_tile)
            if q_tiles == 1:
                split, per_unit, units, waves = work_units(streams, blocks, cores)
            else:
                split, per_unit, units = 1, blocks, streams * q_tiles
                waves = _ceil(units, cores)
            out_bits = k.PARTIAL_SUM_BITS if split > 1 else act_bits
            for w in range(waves):
                slowest = 0.0
                for u in range(w * cores, min(units, (w + 1) * cores)):
                    stream, j0 = u // split // q_tiles, (u % split) * per_unit
                    j1 = min(blocks, j0 + per_unit)
                    q0 = (u % q_tiles) * q_tile
                    q1 = min(new, q0 + q_tile)
                    if q_tiles > 1:     # causal: up to the block of the tile's last query
                        j1 = min(j1, _ceil(tokens - new + q1, block))
                    for j in range(j0, j1):
                        for kv in range(parts):
                            fetch((stream * row[k.C_KV_MAX_BLOCKS] + j) * parts + kv,
                                  block_bits(j), home_of(j))
                    tok0, tok1 = j0 * block, min(tokens, j1 * block)
                    visible = sum(max(0, min(tok1, tokens - new + i + 1) - tok0)
                                  for i in range(q0, q1))
                    counters["flops"] += 2 * (hd + v_dim) * per_kv * visible
                    vector_ops = (k.SOFTMAX_OPS * per_kv * visible
                                  + dequant * parts * hd * (tok1 - tok0))
                    counters["vector_ops"] += int(vector_ops)
                    unit_rows = per_kv * (q1 - q0)
                    counters["act_read_bits"] += unit_rows * hd * act_bits
                    counters["act_written_bits"] += unit_rows * v_dim * out_bits
                    wave[0] += unit_rows * (hd * act_bits + v_dim * out_bits)
                    slowest = max(slowest, 2.0 * (hd + v_dim) * padded_rows(unit_rows)
                                  * (tok1 - tok0) / (peak / cores)
                                  + vector_ops / (dev.vector_ops_per_s / cores))
                if w == waves - 1 and split > 1:
                    wave[0] += split_reduction(counters, streams * rows, v_dim + 2, v_dim, split,
                                               act_bits)
                close_wave(slowest)
            counters["waves"] += waves

        elif kind == k.OP_KV_APPEND:
            streams = row[k.C_BATCH] * row[k.C_KV_HEADS]
            parts = row[k.C_KV_PARTS]
            new = row[k.C_NEW_TOKENS]
            first = row[k.C_CONTEXT] + step * new
            by_tier: dict[int, int] = {}
            for position in range(first, first + new):     # each new token, in its block's tier
                tier = home_of(position // row[k.C_KV_BLOCK])
                by_tier[tier] = by_tier.get(tier, 0) + 1
            for tier, count in by_tier.items():
                write_bytes = _ceil(_ceil(count * row[k.C_KV_ROW_BITS], 8), gran[tier]) * gran[tier]
                out["written"][op][tier] += streams * parts * 8 * write_bytes
                wave[tier] += streams * parts * 8 * write_bytes
            act = streams * parts * new * row[k.C_HEAD_DIM] * act_bits
            counters["act_read_bits"] += act
            wave[0] += act
            counters["waves"] += _ceil(streams, cores)
            close_wave(0.0)

        elif kind == k.OP_COLLECTIVE:
            chips, passes = row[k.C_CHIPS], row[k.C_PASSES]
            chunk = _ceil(row[k.C_M] * row[k.C_K], chips)
            sent = passes * (chips - 1) * chunk * act_bits
            adds = (chips - 1) * chunk if passes == 2 else 0
            for name in ("link_bits", "act_read_bits", "act_written_bits"):
                counters[name] += sent
            counters["vector_ops"] += adds
            counters["waves"] += passes * row[k.C_LINK_STEPS]
            out["times"][op][n_tiers] += link_s            # the library's time for the call
            out["times"][op][n_tiers + 2] += link_latency_s

        elif kind == k.OP_SEND:
            sent = row[k.C_M] * row[k.C_K] * act_bits
            counters["link_bits"] += sent
            counters["act_read_bits"] += sent
            counters["waves"] += 1
            out["times"][op][n_tiers] += link_s            # priced by the plan on its link
            out["times"][op][n_tiers + 2] += link_latency_s

        else:
            m, kdim = row[k.C_M], row[k.C_K]
            bits = tile_bits(0, kdim, 1, row[k.C_ELEM_BITS], row[k.C_GROUP], row[k.C_META_BITS],
                             bool(row[k.C_PADDED]))
            if kind == k.OP_EMBED:
                vocab = row[k.C_N]
                base = step * row[k.C_STEP_TOKENS] + row[k.C_TOKEN_BASE]
                tokens = sorted(int(k.token_id(plan.workload.seed, base + r, vocab))
                                for r in range(m))
                for token in tokens:
                    if token < row[k.C_ROWS_HERE]:      # this chip's vocabulary shard
                        fetch(token, bits, home_of(token))
                vector_ops = 0
            else:
                fetch(0, bits + row[k.C_TENSOR_META_BITS], home_of(0))
                vector_ops = k.NORM_OPS * m * kdim
                counters["act_read_bits"] += m * kdim * act_bits
                wave[0] += m * kdim * act_bits
            counters["vector_ops"] += vector_ops
            counters["act_written_bits"] += m * kdim * act_bits
            wave[0] += m * kdim * act_bits
            counters["waves"] += 1
            close_wave(vector_ops / dev.vector_ops_per_s)
        if kind == k.OP_MATMUL and routed and routes[row[k.C_ROUTE]][row[k.C_ROUTE_COL]] == 0:
            continue                                 # no work, no launch
        if kind < k.OP_COLLECTIVE:
            out["times"][op][n_tiers + 2] += plan.kernel_fixed_s * row[k.C_LAUNCHES]
        out["times"][op][n_tiers + 3] += plan.launch_s * row[k.C_LAUNCHES]
        host_bound = plan.host_launch_s * row[k.C_LAUNCHES] - sum(out["times"][op])
        if host_bound > 0:
            out["times"][op][n_tiers + 3] += host_bound
    state.pinned_loaded = loaded_now
    return out


def assert_counts_equal(counts, expected: dict) -> None:
    """A kernel step's counts (``memsim.emulate.StepCounts``) are the twin's ``run_step``
    result: bits per tier, every op column and the times."""
    np.testing.assert_array_equal(counts.read_bits, np.array(expected["read"]))
    np.testing.assert_array_equal(counts.written_bits, np.array(expected["written"]))
    for column, name in enumerate(OP_COLUMNS):
        np.testing.assert_array_equal(counts.results[:, column],
                                      [o[name] for o in expected["ops"]], err_msg=name)
    np.testing.assert_allclose(counts.times, np.array(expected["times"]), rtol=1e-12, atol=0)
