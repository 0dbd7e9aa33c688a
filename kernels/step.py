"""The decode-step walker: every op of one decode step, tile by tile, through the memory tiers.

One module holds the walker and every helper it calls, because Numba's on-disk cache does not
notice an edit to a helper in another file. Inputs are the plan's flat tables (an int64 op table
with the columns named below, a float64 one, per-tier arrays) and the residency state; outputs are
counter arrays the caller allocates. Counts are in *bits* so that 4-bit payloads and 20-bit group
metadata add up exactly; the caller turns them into bytes.

Cycle model, per wave of work units spread over the cores: the wave takes the longest of its bytes
through each tier over that tier's sustained bandwidth and its slowest unit's operations over one
core's share of the peak (so a partial last wave costs a full unit's compute time), plus the load
latency of the farthest tier it touches (the first tile of each unit cannot be double buffered).
A matmul unit's operations run on the matrix units with M padded to their row grain (or to the
CTA tile rows of a runtime's GEMM kernel, ``C_M_GRAIN``; with ``C_SPLIT_K`` 0 its K is never
split, so only as many units run as there are output tiles), weight
dequantization overlapped on the vector units (separate pipes: Marlin, Frantar et al. 2024), or,
where ``C_GEMV`` allows it, as a GEMV on the vector units with no padding (TRT-LLM's fpA_intB
GEMV, llama.cpp's mmvq): the faster of the two. A GEMV whose runtime counts its instructions
(``F_GEMV``) takes its slowest instruction pipe, weights x instructions / (rate x clock). A GEMV
whose runtime says how many weight bytes its blocks keep in flight (``F_MLP``), at no more
activation rows than the kernel runs at, reads an off-chip tier no faster than Little's law lets
it: bytes in flight on the chip over the tier's latency, so a wave's bits from that tier take
at least bits / 8 x latency / bytes in flight. A GEMM kernel without split-K (``C_SPLIT_K`` 0)
whose runtime gives its CTAs' bytes in flight in the same columns is bounded the same way.
``C_ACT_REUSE`` adjacent N tiles share one read of the activation chunk, which their core keeps
staged in its own memory.

A prompt (prefill, or a prefill chunk riding in a decode step) tiles M too: with ``C_TILE_M`` set
a matmul's work units are (N tile, M tile) pairs, N tile outer, so each M tile looks the weight
tiles of its column strip up again and finds them on chip when the strip fits there (the LRU
decides; a real GEMM's rasterization keeps a strip hot in L2 the same way). Its attention
(``C_Q_TILE``) is flash attention: one unit per (sequence, KV head, query tile) reading, causally,
the K/V blocks up to its last query position, so the blocks are re-read per query tile through
the on-chip tier; the FLOPs are the exact causal count (each query position sees itself and
every earlier token). A cache holds ``C_KV_PARTS`` rows per token and KV head: K and V, or
multi-head latent attention's one latent, which the scores read ``C_HEAD_DIM`` wide and the
weighted sum ``C_V_DIM`` wide (every head of a sequence is one unit's rows, as FlashMLA runs it).
Each op also pays the device's launch and synchronisation overhead. Time is split into the column
of whatever bound it, so an op's ``bound by`` is the largest column.

A tensor may live on two tiers: its units (column tiles of a weight, blocks of a KV cache, rows
of an embedding) below ``C_SPLIT`` on ``C_HOME``, the rest on ``C_HOME_HI``. Collectives and
pipeline hand-offs move activations over the chip-to-chip link: their bits and time are counted
for the one chip the plan describes.
"""

from __future__ import annotations

import numpy as np

from memsim.kernels.jit import jit, jit_inline

# Op kinds.
OP_EMBED = 0
OP_NORM = 1
OP_MATMUL = 2
OP_ATTENTION = 3
OP_KV_APPEND = 4
OP_COLLECTIVE = 5   # all-reduce (2 passes) or all-gather (1 pass) of activations over the link
OP_SEND = 6         # a pipeline stage hands its activations to the next stage
OP_ALL_TO_ALL = 7   # expert parallel: token rows sent to the chips holding their experts

# Columns of the int64 op table.
C_KIND = 0
C_LAYER = 1
C_M = 2             # activation rows: batch x new tokens per sequence
C_K = 3             # contraction length (hidden for embed and norm rows)
C_N = 4             # output columns (vocab rows of an embedding table)
C_TENSOR = 5        # tensor id: residency keys and the pinned flag use it
C_HOME = 6          # home tier of the tensor's units below C_SPLIT
C_PINNED = 7        # 1: once loaded on chip, never evicted
C_ELEM_BITS = 8     # storage format of the weight or KV rows
C_GROUP = 9
C_META_BITS = 10
C_PADDED = 11
C_TENSOR_META_BITS = 12
C_TILE_K = 13
C_TILE_N = 14
C_M_GRAIN = 15      # matrix unit's row granularity: M is padded to a multiple of it
C_BATCH = 16        # attention and KV append
C_KV_HEADS = 17
C_Q_PER_KV = 18
C_HEAD_DIM = 19
C_CONTEXT = 20      # tokens in each sequence's cache before the first emulated step
C_NEW_TOKENS = 21
C_KV_BLOCK = 22
C_KV_ROW_BITS = 23  # one token's cached row (K, V or latent) of one head, metadata included
C_ACT_BITS = 24     # activation element bits
C_KV_MAX_BLOCKS = 25  # KV blocks per sequence at the last emulated step (spaces tile indices)
C_HOME_HI = 26      # home tier of the units at and above C_SPLIT
C_SPLIT = 27        # first unit on C_HOME_HI: column tile, KV block or embedding row
C_ROWS_HERE = 28    # embedding rows this chip holds (a vocabulary-parallel shard: ids below it)
C_CHIPS = 29        # chips taking part in a collective
C_PASSES = 30       # 2: all-reduce (reduce-scatter then all-gather); 1: all-gather
C_LINK_STEPS = 31   # link hops one pass of the collective waits for, in sequence
C_TOKEN_BASE = 32   # embedding: index of this microbatch's first token among the step's tokens
C_STEP_TOKENS = 33  # embedding: tokens the whole batch looks up per step
C_ROUTE = 34        # MoE: row of the step's route table this op reads (-1: not routed)
C_ROUTE_COL = 35    # MoE: its column: the expert (its tokens are M), or a chip's sent rows
C_LAUNCHES = 36     # launches the op pays (0 for an expert inside a fused MoE kernel)
C_GEMV = 37         # rows up to which a matmul may run as a GEMV on the vector units (no M
                    # padding; 0: never): the runtime's GEMV kernels' most activation rows
C_ACT_REUSE = 38    # N tiles of a matmul that read one staged activation chunk (a CTA's width)
C_TILE_M = 39       # matmul rows per M tile (a CTA's output rows); 0: M is one tile (decode)
C_Q_TILE = 40       # attention: new tokens per query tile (flash attention); 0: one tile
C_KV_PARTS = 41     # attention, KV append: cached rows per token and KV head (2: K and V;
                    # 1: multi-head latent attention's one latent row, keys and values both)
C_V_DIM = 42        # attention: width of a head's values (C_HEAD_DIM is the keys' width)
C_SPLIT_K = 43      # matmul: 1 may split K over idle cores (split-K); 0 never (one unit per
                    # output tile, as a kernel without split-K runs: memsim.gemmtile)
C_GRID_SHARE = 44   # matmul: identical matmuls whose units run as one kernel's grid (a fused
                    # gate/up GEMM without split-K: 2), each timed as its share; 1: alone
N_INT_COLS = 45

# Columns of the float64 op table.
F_PEAK = 0          # matrix operations/s the op runs at (whole chip)
F_DEQUANT_OPS = 1   # vector operations per stored element to dequantize (0 when native)
F_ACT_QUANT_OPS = 2  # vector operations per activation element to quantize it (0: 16-bit)
F_LINK_S = 3        # collectives: the library's bandwidth time for the call (memsim.runtime)
F_LINK_LATENCY_S = 4  # collectives: its latency (start-up and steps)
F_A2A_BANDWIDTH = F_LINK_S  # all-to-all: bytes/s its rows move at (memsim.plan.exchange_figures)
F_A2A_LATENCY_S = F_LINK_LATENCY_S  # all-to-all: its hops' latency and the call's start-up
F_GEMV = 5          # matmul: N_GEMV_PIPES fixed then N_GEMV_PIPES per-row seconds per weight on
                    # one core of the runtime's GEMV kernel, per pipe (all 0: no count)
N_GEMV_PIPES = 8    # memsim.instructions.MAX_PIPES
F_MLP = F_GEMV + 2 * N_GEMV_PIPES   # matmul: the GEMV's bytes in flight per block, resident
                    # blocks per core, output rows per block, most activation rows (0: no bound)
N_MLP_COLS = 4      # memsim.instructions.MLP_COLUMNS
N_FLOAT_COLS = F_MLP + N_MLP_COLS

# Columns of the per-op integer results.
R_HITS = 0
R_MISSES = 1
R_HIT_BITS = 2
R_FLOPS = 3
R_VECTOR_OPS = 4
R_WAVES = 5
R_ACT_READ_BITS = 6
R_ACT_WRITTEN_BITS = 7
R_LINK_BITS = 8     # bits this chip sent over the chip-to-chip link
N_RESULT_COLS = 9

# The residency state lives in one int64 "arena" of rows of ten columns, so that the per-tile
# helpers take a single array (every array argument of a call costs reference counting):
#   row 0                     the LRU's scalars (S_* columns);
#   rows 1 .. n_tensors       per tensor: its first and last run, and the pinned flags (T_*);
#   the rows after those      run nodes (N_* columns); a node's id is its row.
ARENA_COLS = 10
S_HEAD = 0          # most recently used run
S_TAIL = 1          # least recently used run
S_USED_BITS = 2
S_CAPACITY_BITS = 3
S_FREE = 4          # free list of run nodes freed, linked by N_NEXT (NIL: none)
S_CURSOR = 5        # where the current op's next lookup starts in its tensor's run list
S_RUNS = 6          # live runs
S_TENSORS = 7       # tensors in the plan
S_UNTAKEN = 8       # the first node row no run has taken yet: the rows from it on are never read
                    # (so they need no initial value), and a node is taken from them when the free
                    # list is empty
T_FIRST = 0         # first run of the tensor, by tile index
T_LAST = 1
T_PINNED_LOADED = 2  # 1 once a pinned tensor is on chip (after the step that loaded it)
T_LOADED_NOW = 3     # 1 when the current step touched the pinned tensor

# Columns of a run node: tiles [lo, hi) of one tensor whose recency rises with the index, all
# of one size but, in a run of whole weight columns, the first tile of each column (the index a
# multiple of N_PERIOD, the tiles of a column), which carries the column's per-channel scales;
# runs are linked by recency and, per tensor, in index order.
N_TENSOR = 0
N_LO = 1
N_HI = 2
N_BITS = 3
N_NEWER = 4
N_OLDER = 5
N_PREV = 6          # previous run of the same tensor, by index
N_NEXT = 7          # next run of the same tensor, by index
N_PERIOD = 8        # 0: every tile has N_BITS; else a tile whose index is a multiple of it ...
N_HEAD_BITS = 9     # ... has these bits

NIL = -1
PARTIAL_SUM_BITS = 32   # split-K and split-context partial results are FP32
SOFTMAX_OPS = 4         # vector operations per attention score (max, exp, sum, scale)
NORM_OPS = 4            # vector operations per element of an RMSNorm (square, sum, scale, weight)


def new_arena(n_tensors: int, max_tiles: int, capacity_bits: int) -> np.ndarray:
    """An empty on-chip tier: room for ``max_tiles + 2`` runs (a run holds at least one tile;
    :func:`grow_arena` makes room for more). The node rows are left as allocated: none is read
    before a run takes it and writes every column (see ``S_UNTAKEN``), so no time goes to
    zeroing rows a walk may never reach."""
    first_node = 1 + n_tensors
    arena = np.empty((first_node + max_tiles + 2, ARENA_COLS), dtype=np.int64)
    arena[:first_node] = 0
    arena[1:first_node, T_FIRST] = NIL
    arena[1:first_node, T_LAST] = NIL
    arena[0, :S_UNTAKEN + 1] = (NIL, NIL, 0, capacity_bits, NIL, NIL, 0, n_tensors, first_node)
    return arena


def arena_runs(arena: np.ndarray) -> int:
    """Run nodes the arena has room for, live and free."""
    return int(arena.shape[0] - 1 - arena[0, S_TENSORS])


def grow_arena(arena: np.ndarray, runs: int) -> np.ndarray:
    """The same state in an arena with room for ``runs`` run nodes: the live runs keep their
    rows (node ids), and the new rows, as allocated, follow the ones never taken."""
    old_rows = arena.shape[0]
    rows = 1 + int(arena[0, S_TENSORS]) + runs
    if rows <= old_rows:
        return arena
    grown = np.empty((rows, ARENA_COLS), dtype=np.int64)
    taken = int(arena[0, S_UNTAKEN])
    grown[:taken] = arena[:taken]
    return grown


# The on-chip tier is an exact LRU over tiles, keyed by (tensor, tile index), with a byte
# capacity. Each op looks its tensor's tiles up in rising index order, so the cache is kept as
# runs of consecutive tiles: a lookup advances a cursor along the tensor's runs, a fill extends
# the newest run, an eviction trims the oldest run's oldest tile. Every operation is O(1)
# amortised and touches a few cache lines, where a hash table would touch many.

@jit_inline
def _unlink(x, a):
    """Remove an emptied run from both lists and return it to the free list."""
    newer = a[x, N_NEWER]
    older = a[x, N_OLDER]
    if newer == NIL:
        a[0, S_HEAD] = older
    else:
        a[newer, N_OLDER] = older
    if older == NIL:
        a[0, S_TAIL] = newer
    else:
        a[older, N_NEWER] = newer
    row = 1 + a[x, N_TENSOR]
    prev = a[x, N_PREV]
    nxt = a[x, N_NEXT]
    if prev == NIL:
        a[row, T_FIRST] = nxt
    else:
        a[prev, N_NEXT] = nxt
    if nxt == NIL:
        a[row, T_LAST] = prev
    else:
        a[nxt, N_PREV] = prev
    if a[0, S_CURSOR] == x:
        a[0, S_CURSOR] = nxt
    a[x, N_NEXT] = a[0, S_FREE]
    a[0, S_FREE] = x
    a[0, S_RUNS] -= 1


@jit_inline
def _span_bits(lo, hi, bits, head_bits, period):
    """Bits of tiles [lo, hi) of a run of ``bits`` per tile, ``head_bits`` for the tiles whose
    index is a multiple of ``period`` (none when it is 0)."""
    if period == 0 or hi <= lo:
        return (hi - lo) * bits
    heads = (hi - 1) // period - (lo - 1) // period
    return (hi - lo) * bits + heads * (head_bits - bits)


@jit_inline
def _run_bits(x, lo, hi, a):
    """Bits of tiles [lo, hi) of run ``x``."""
    return _span_bits(lo, hi, a[x, N_BITS], a[x, N_HEAD_BITS], a[x, N_PERIOD])


@jit_inline
def _new_run(tensor, lo, hi, bits, head_bits, period, a):
    x = a[0, S_FREE]
    if x == NIL:
        x = a[0, S_UNTAKEN]
        a[0, S_UNTAKEN] = x + 1
    else:
        a[0, S_FREE] = a[x, N_NEXT]
    a[x, N_TENSOR] = tensor
    a[x, N_LO] = lo
    a[x, N_HI] = hi
    a[x, N_BITS] = bits
    a[x, N_HEAD_BITS] = head_bits
    a[x, N_PERIOD] = period
    a[0, S_RUNS] += 1
    return x


@jit_inline
def _link_tensor_before(x, before, tensor, a):
    """Insert run ``x`` into its tensor's index-ordered list before ``before`` (NIL: at the end)."""
    row = 1 + tensor
    if before == NIL:
        prev = a[row, T_LAST]
        a[row, T_LAST] = x
    else:
        prev = a[before, N_PREV]
        a[before, N_PREV] = x
    a[x, N_PREV] = prev
    a[x, N_NEXT] = before
    if prev == NIL:
        a[row, T_FIRST] = x
    else:
        a[prev, N_NEXT] = x


@jit_inline
def _make_newest(tensor, t, bits, a):
    """Put tile ``t`` at the most recently used end, extending the newest run when it continues it."""
    a[0, S_USED_BITS] += bits
    _newest_run(tensor, t, t + 1, bits, bits, 0, a)


@jit_inline
def _continues(head, tensor, lo, bits, head_bits, period, a):
    """True when tiles from ``lo`` sized so extend run ``head`` (NIL: no run)."""
    return (head != NIL and a[head, N_TENSOR] == tensor and a[head, N_HI] == lo
            and a[head, N_BITS] == bits and a[head, N_HEAD_BITS] == head_bits
            and a[head, N_PERIOD] == period)


@jit_inline
def _newest_run(tensor, lo, hi, bits, head_bits, period, a):
    """Put tiles [lo, hi) sized as a run of ``bits``, ``head_bits`` and ``period`` says (held
    nowhere else) at the most recently used end, in rising order, extending the newest run when
    they continue it; the cursor moves to their run. The caller counts their bits."""
    head = a[0, S_HEAD]
    if _continues(head, tensor, lo, bits, head_bits, period, a):
        a[head, N_HI] = hi
        a[0, S_CURSOR] = head
        return
    x = _new_run(tensor, lo, hi, bits, head_bits, period, a)
    a[x, N_NEWER] = NIL
    a[x, N_OLDER] = head
    if head == NIL:
        a[0, S_TAIL] = x
    else:
        a[head, N_NEWER] = x
    a[0, S_HEAD] = x
    after = a[0, S_CURSOR]
    while after != NIL and a[after, N_HI] <= lo:
        after = a[after, N_NEXT]
    _link_tensor_before(x, after, tensor, a)
    a[0, S_CURSOR] = x


@jit_inline
def _evict_oldest(a):
    """Drop the least recently used tile: the first tile of the oldest run."""
    x = a[0, S_TAIL]
    lo = a[x, N_LO]
    a[0, S_USED_BITS] -= _run_bits(x, lo, lo + 1, a)
    a[x, N_LO] = lo + 1
    if a[x, N_LO] == a[x, N_HI]:
        _unlink(x, a)


@jit_inline
def _held_run(t, a):
    """The run holding tile ``t`` of the tensor the cursor walks, or NIL; the cursor moves on to
    the first of its runs that ends after ``t`` (an op's lookups rise)."""
    c = a[0, S_CURSOR]
    while c != NIL and a[c, N_HI] <= t:
        c = a[c, N_NEXT]
    a[0, S_CURSOR] = c
    if c != NIL and a[c, N_LO] <= t:
        return c
    return NIL


@jit_inline
def _touch_run(tensor, c, lo, hi, a):
    """Hits on tiles [lo, hi) of run ``c``, one after the other: they become the most recent
    tiles, in rising order, as one relink (the state those single hits leave, tile for tile).
    The tiles keep their bits, so the LRU's total does not change."""
    c_lo = a[c, N_LO]
    c_hi = a[c, N_HI]
    bits = a[c, N_BITS]
    head_bits = a[c, N_HEAD_BITS]
    period = a[c, N_PERIOD]
    if lo == c_lo:
        if hi == c_hi:
            _unlink(c, a)
        else:
            a[c, N_LO] = hi
    elif hi == c_hi:
        a[c, N_HI] = lo
    else:       # the tiles above the range stay, just newer than the tiles below it
        r = _new_run(tensor, hi, c_hi, bits, head_bits, period, a)
        a[c, N_HI] = lo
        newer = a[c, N_NEWER]
        a[r, N_OLDER] = c
        a[r, N_NEWER] = newer
        a[c, N_NEWER] = r
        if newer == NIL:
            a[0, S_HEAD] = r
        else:
            a[newer, N_OLDER] = r
        _link_tensor_before(r, a[c, N_NEXT], tensor, a)
    _newest_run(tensor, lo, hi, bits, head_bits, period, a)


@jit_inline
def _fill(tensor, t, bits, a):
    """A miss on tile ``t``: evict least recently used tiles until it fits, then hold it as the
    newest; a tile larger than the whole LRU capacity streams through it, displacing
    everything, and is not kept (so the cache always holds the longest run of most recent tiles
    that fits, and a bigger cache never holds less)."""
    if bits > a[0, S_CAPACITY_BITS]:
        while a[0, S_TAIL] != NIL:
            _evict_oldest(a)
        return
    while a[0, S_USED_BITS] + bits > a[0, S_CAPACITY_BITS]:
        _evict_oldest(a)
    _make_newest(tensor, t, bits, a)


@jit_inline
def _lookup(tensor, t, bits, a):
    """Touch tile ``t`` of ``tensor`` (indices rise within an op); True on a hit, else
    :func:`_fill`."""
    c = _held_run(t, a)
    if c != NIL:
        _touch_run(tensor, c, t, t + 1, a)
        return True
    _fill(tensor, t, bits, a)
    return False


@jit_inline
def _flush(a):
    """Empty the LRU, run by run."""
    while a[0, S_TAIL] != NIL:
        x = a[0, S_TAIL]
        a[0, S_USED_BITS] -= _run_bits(x, a[x, N_LO], a[x, N_HI], a)
        _unlink(x, a)


@jit_inline
def _evict_for(need, a):
    """Evict the least recently used tiles until ``need`` more bits fit."""
    while a[0, S_USED_BITS] + need > a[0, S_CAPACITY_BITS]:
        x = a[0, S_TAIL]
        excess = a[0, S_USED_BITS] + need - a[0, S_CAPACITY_BITS]
        lo = a[x, N_LO]
        drop = _tiles_to_free(x, excess, a)
        a[0, S_USED_BITS] -= _run_bits(x, lo, lo + drop, a)
        a[x, N_LO] = lo + drop
        if a[x, N_LO] == a[x, N_HI]:
            _unlink(x, a)


@jit_inline
def _tiles_to_free(x, excess, a):
    """How many of run ``x``'s oldest tiles evicting one by one frees ``excess`` bits: the
    fewest whose bits reach it, or all of them (tiles of zero bits, no group starts, all go)."""
    lo = a[x, N_LO]
    hi = a[x, N_HI]
    bits = a[x, N_BITS]
    period = a[x, N_PERIOD]
    if period == 0:
        return hi - lo if bits == 0 else min(hi - lo, (excess + bits - 1) // bits)
    if _run_bits(x, lo, hi, a) < excess:
        return hi - lo
    whole = (excess - 1) // _span_bits(0, period, bits, a[x, N_HEAD_BITS], period)
    t = lo + whole * period             # whole columns free less than the excess
    freed = _run_bits(x, lo, t, a)
    while freed < excess:
        freed += _run_bits(x, t, t + 1, a)
        t += 1
    return t - lo


@jit_inline
def _begin_op(tensor, a):
    """Point the cursor at the first run of the tensor an op is about to walk."""
    a[0, S_CURSOR] = a[1 + tensor, T_FIRST]


@jit_inline
def _tile_bits(k0, kk, nn, elem_bits, group, meta_bits, padded):
    """Bits of ``nn`` rows of ``kk`` elements starting at ``k0``; groups belong to the tile they start in."""
    if group == 0:
        return kk * nn * elem_bits
    starts = (k0 + kk + group - 1) // group - (k0 + group - 1) // group
    payload = starts * group if padded else kk
    return (payload * elem_bits + starts * meta_bits) * nn


@jit_inline
def _round_up(n, grain):
    return (n + grain - 1) // grain * grain


@jit_inline
def _padded_rows(rows, grain):
    return _round_up(rows, grain) if grain > 1 else rows


@jit_inline
def _work_units(streams, chunks, n_cores):
    """Spread ``streams`` independent outputs of ``chunks`` sequential pieces over the cores.

    When there are fewer streams than cores each is split into equal runs of chunks (split-K
    for a matmul, flash-decoding for attention) until the cores are busy. Returns the splits per
    stream, chunks per unit, units and waves.
    """
    split = 1
    if streams < n_cores:
        split = min(chunks, n_cores // streams)
    per_unit = (chunks + split - 1) // split
    split = (chunks + per_unit - 1) // per_unit
    units = streams * split
    return split, per_unit, units, (units + n_cores - 1) // n_cores


@jit_inline
def _split_reduction(op, outputs, partial_width, out_width, split, act_bits, results):
    """Combine split partial results on chip: every split's FP32 partials are read and the
    outputs written once. Returns the on-chip bits it moved."""
    read = split * outputs * partial_width * PARTIAL_SUM_BITS
    written = outputs * out_width * act_bits
    results[op, R_ACT_READ_BITS] += read
    results[op, R_ACT_WRITTEN_BITS] += written
    return read + written


@jit_inline
def _mix(x):
    """splitmix64 finaliser: a deterministic pseudo-random stream from a counter."""
    z = np.uint64(x) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@jit_inline
def token_id(seed, index, vocab):
    """The ``index``-th token id a run with ``seed`` looks up (deterministic, uniform)."""
    return np.int64(_mix(np.uint64(seed) * np.uint64(1000003) + np.uint64(index))
                    % np.uint64(vocab))


@jit_inline
def _fetch(tensor, t, bits, home, pinned, a):
    """Bring tile ``t`` of ``tensor`` to the compute; True when the on-chip tier already held it."""
    if home == 0:
        return True
    if pinned == 1:
        a[1 + tensor, T_LOADED_NOW] = 1
        return a[1 + tensor, T_PINNED_LOADED] == 1
    return _lookup(tensor, t, bits, a)


@jit_inline
def _record_tiles(op, hits, misses, hit_bits, miss_bits, read_bits, written_bits, results):
    """Store an op's tile counts: everything is read on chip, and every miss fills it."""
    results[op, R_HITS] += hits
    results[op, R_MISSES] += misses
    results[op, R_HIT_BITS] += hit_bits
    read_bits[op, 0] += hit_bits + miss_bits
    written_bits[op, 0] += miss_bits


@jit_inline
def _charge_misses(op, wave_bits, read_bits):
    """A wave's off-chip bits are its misses: charge them to the tiers they came from."""
    for t in range(1, wave_bits.shape[0]):
        read_bits[op, t] += wave_bits[t]


@jit
def _close_wave(op, wave_bits, unit_compute_s, tier_bandwidth, tier_latency_s, times,
                in_flight_bytes, share):
    """Charge one wave's time to the column of what bound it, plus its exposed latency.

    ``in_flight_bytes`` > 0 (a GEMV's bytes in flight on the chip) bounds each off-chip tier's
    rate by Little's law: its bits take at least bits / 8 x latency / in_flight_bytes.
    ``share`` ops whose units fill one wave together (``C_GRID_SHARE``) each pay 1 / share of
    the wave's latency (the caller passes each its share of the compute time)."""
    n_tiers = tier_bandwidth.shape[0]
    best = unit_compute_s
    best_col = n_tiers + 1
    farthest = 0
    for t in range(n_tiers):
        if wave_bits[t] > 0:
            farthest = t
            seconds = wave_bits[t] / 8.0 / tier_bandwidth[t]
            if t > 0 and in_flight_bytes > 0.0:
                seconds = max(seconds, wave_bits[t] / 8.0 * tier_latency_s[t] / in_flight_bytes)
            if seconds > best:
                best = seconds
                best_col = t
        wave_bits[t] = 0
    times[op, best_col] += best
    times[op, n_tiers + 2] += tier_latency_s[farthest] / share


@jit_inline
def _matmul_tile_bits(t, k, n, tk, tn, k_tiles, aligned, full_bits, elem_bits, group, meta_bits,
                      padded, tensor_meta_bits):
    """Bits of matmul tile ``t`` (tiles are numbered column by column: t = nt k_tiles + kt)."""
    nt = t // k_tiles
    kt = t - nt * k_tiles
    k0 = kt * tk
    kk = min(tk, k - k0)
    nn = min(tn, n - nt * tn)
    if aligned and kk == tk and nn == tn:
        bits = full_bits
    else:
        bits = _tile_bits(k0, kk, nn, elem_bits, group, meta_bits, padded)
    if t == 0:
        bits += tensor_meta_bits
    return bits


@jit_inline
def _append_run(tensor, lo, hi, bits, head_bits, period, a):
    """Make tiles [lo, hi) of ``tensor``, sized as a run of ``bits``, ``head_bits`` and
    ``period`` says, the most recent, as one run (the tensor holds no tile at or above ``lo``)."""
    a[0, S_USED_BITS] += _span_bits(lo, hi, bits, head_bits, period)
    head = a[0, S_HEAD]
    if _continues(head, tensor, lo, bits, head_bits, period, a):
        a[head, N_HI] = hi
        return
    x = _new_run(tensor, lo, hi, bits, head_bits, period, a)
    a[x, N_NEWER] = NIL
    a[x, N_OLDER] = head
    if head == NIL:
        a[0, S_TAIL] = x
    else:
        a[head, N_NEWER] = x
    a[0, S_HEAD] = x
    _link_tensor_before(x, NIL, tensor, a)


@jit_inline
def _segment_row_bits(k, tk, elem_bits, group, meta_bits, padded):
    """Bits per output column (one of a tile's ``nn``) of the three tile kinds of
    :func:`_column_segment`: first tile, other full-K tiles, ragged last tile. Tile bits are
    linear in ``nn``, so these are computed once per op."""
    full = k // tk
    return (_tile_bits(0, min(tk, k), 1, elem_bits, group, meta_bits, padded),
            _tile_bits(tk, tk, 1, elem_bits, group, meta_bits, padded),
            _tile_bits(full * tk, k - full * tk, 1, elem_bits, group, meta_bits, padded))


@jit_inline
def _column_segment(nt, part, k, n, tk, tn, k_tiles, row_bits, tensor_meta_bits):
    """Tiles of weight column ``nt`` that share a size, ``(lo, hi, bits)``: part 0 its first
    tile (which may carry the tensor's scale or, per channel, the row's), part 1 the other
    full-K tiles, part 2 a ragged last one. Valid when groups align with tiles or span a row.
    ``row_bits`` is :func:`_segment_row_bits`."""
    nn = min(tn, n - nt * tn)
    base = nt * k_tiles
    full = k // tk
    if part == 0:
        return base, base + 1, row_bits[0] * nn + (tensor_meta_bits if nt == 0 else 0)
    if part == 1:
        return base + 1, max(base + 1, base + full), row_bits[1] * nn
    return max(base + 1, base + full), base + k_tiles, row_bits[2] * nn


@jit_inline
def _keep_tail(lo, hi, bits, kept, cap):
    """Walking a fill's segments from the newest, keep what of tiles [lo, hi) still fits:
    returns the bits kept, the first tile kept and whether the capacity ran out here."""
    if bits == 0 or kept + (hi - lo) * bits <= cap:
        return kept + (hi - lo) * bits, lo, False
    return kept, hi - (cap - kept) // bits, True


@jit
def _fill_streamed(tensor, n_tiles, total_bits, k, n, tk, tn, k_tiles, aligned, full_bits,
                   elem_bits, group, meta_bits, padded, tensor_meta_bits, a):
    """The LRU after an op missed every tile of a tensor it held none of: what tile-by-tile
    fills would leave, the longest run of most recent tiles that fits (the old contents' newest
    part too when the whole tensor fits), set run by run instead of one eviction per tile."""
    cap = a[0, S_CAPACITY_BITS]
    start = 0
    if total_bits <= cap:
        _evict_for(total_bits, a)
    else:
        _flush(a)
    a[0, S_CURSOR] = NIL
    if not (aligned or group >= k):
        if total_bits > cap:
            kept = 0
            start = n_tiles
            while start > 0:
                bits = _matmul_tile_bits(start - 1, k, n, tk, tn, k_tiles, aligned, full_bits,
                                         elem_bits, group, meta_bits, padded, tensor_meta_bits)
                if kept + bits > cap:
                    break
                kept += bits
                start -= 1
        for t in range(start, n_tiles):
            _make_newest(tensor, t, _matmul_tile_bits(t, k, n, tk, tn, k_tiles, aligned,
                                                      full_bits, elem_bits, group, meta_bits,
                                                      padded, tensor_meta_bits), a)
        return
    n_cols = (n + tn - 1) // tn
    row_bits = _segment_row_bits(k, tk, elem_bits, group, meta_bits, padded)
    # Columns 1 .. n_cols - 2 are alike (full width, no tensor metadata): whole ones are kept,
    # and appended, at once: as one run when the tiles after a column's first are alike.
    full = k // tk
    mid_tiles = max(0, full - 1)
    last_tiles = k_tiles - max(1, full)
    col_bits = (row_bits[0] + mid_tiles * row_bits[1] + last_tiles * row_bits[2]) * tn
    body_bits = row_bits[1] if mid_tiles > 0 else row_bits[2]
    columns = mid_tiles == 0 or last_tiles == 0 or row_bits[2] == row_bits[1]
    one_size = columns and (mid_tiles + last_tiles == 0 or body_bits == row_bits[0])
    if total_bits > cap:
        kept = 0
        start = n_tiles
        done = False
        nt = n_cols - 1
        while nt >= 0:
            if 0 < nt < n_cols - 1:
                whole = nt if col_bits == 0 else min(nt, (cap - kept) // col_bits)
                if whole > 0:
                    kept += whole * col_bits
                    nt -= whole
                    continue
            for part in range(2, -1, -1):
                lo, hi, bits = _column_segment(nt, part, k, n, tk, tn, k_tiles, row_bits,
                                               tensor_meta_bits)
                if lo >= hi:
                    continue
                kept, start, done = _keep_tail(lo, hi, bits, kept, cap)
                if done:
                    break
            if done:
                break
            nt -= 1
    nt = start // k_tiles
    while nt < n_cols:
        if columns and 0 < nt < n_cols - 1 and start <= nt * k_tiles:
            head_bits = row_bits[0] * tn
            _append_run(tensor, nt * k_tiles, (n_cols - 1) * k_tiles,
                        head_bits if one_size else body_bits * tn, head_bits,
                        0 if one_size else k_tiles, a)
            nt = n_cols - 1
            continue
        for part in range(3):
            lo, hi, bits = _column_segment(nt, part, k, n, tk, tn, k_tiles, row_bits,
                                           tensor_meta_bits)
            lo = max(lo, start)
            if lo < hi:
                _append_run(tensor, lo, hi, bits, bits, 0, a)
        nt += 1


@jit
def _fill_streamed_kv(tensor, streams, parts, blocks, max_blocks, split_at, bits_lo, bits_hi,
                      total_bits, a):
    """``_fill_streamed`` for a KV cache: its visited tiles are the ``parts`` rows (K and V, or
    one latent) of blocks 0 .. blocks-1 of every stream, numbered
    (stream max_blocks + block) parts + part."""
    cap = a[0, S_CAPACITY_BITS]
    low = min(split_at, blocks)
    start_stream = 0
    start = 0
    if total_bits <= cap:
        _evict_for(total_bits, a)
    else:
        _flush(a)
        kept = 0
        done = False
        start_stream = streams
        for stream in range(streams - 1, -1, -1):
            base = stream * max_blocks * parts
            for part in range(1, -1, -1):
                lo = base + (0 if part == 0 else parts * low)
                hi = base + (parts * low if part == 0 else parts * blocks)
                bits = bits_lo if part == 0 else bits_hi
                if lo >= hi:
                    continue
                start_stream = stream
                kept, start, done = _keep_tail(lo, hi, bits, kept, cap)
                if done:
                    break
            if done:
                break
    a[0, S_CURSOR] = NIL
    for stream in range(start_stream, streams):
        base = stream * max_blocks * parts
        for part in range(2):
            lo = max(start, base + (0 if part == 0 else parts * low))
            hi = base + (parts * low if part == 0 else parts * blocks)
            if lo < hi:
                bits = bits_lo if part == 0 else bits_hi
                _append_run(tensor, lo, hi, bits, bits, 0, a)


@jit_inline
def _cycled_sum(x, split, prefix):
    """Sum over units 0 .. x-1 of a per-split-index value whose prefix sums are ``prefix``."""
    return (x // split) * prefix[split] + prefix[x % split]


@jit_inline
def _staged_k(x, split, act_reuse, k, prefix_k):
    """Contraction elements of activations units 0 .. x-1 read: those of every
    ``act_reuse``-th column's units (each column's units span ``k``)."""
    q = x // split
    staged = ((q + act_reuse - 1) // act_reuse) * k
    if q % act_reuse == 0:
        staged += prefix_k[x % split]
    return staged


@jit_inline
def _unit_seconds(rows, unit_elements, m_grain, core_peak, core_vector, dequant_ops, gemv,
                  gemv_s):
    """One matmul unit's compute time (matrix units, or a GEMV on the vector units).

    ``gemv_s`` holds the GEMV kernel's seconds per weight on one core, per pipe (fixed parts,
    then per-row parts): a runtime that counts its GEMV kernel runs that kernel, which takes its
    slowest pipe, ``weights * max(fixed + rows * row)``. All zero: the runtime counts no
    instructions and runs the faster of the matrix units and a GEMV costing ``2 * rows`` FMA
    operations plus the format's dequantization operations per weight at the vector rate."""
    vector_ops = dequant_ops * unit_elements
    if gemv:
        per_weight = 0.0
        for p in range(N_GEMV_PIPES):
            per_weight = max(per_weight, gemv_s[p] + rows * gemv_s[N_GEMV_PIPES + p])
        if per_weight > 0.0:
            return per_weight * unit_elements
    unit_s = max(2.0 * _padded_rows(rows, m_grain) * unit_elements / core_peak,
                 vector_ops / core_vector)
    if gemv:
        unit_s = min(unit_s, (2.0 * rows * unit_elements + vector_ops) / core_vector)
    return unit_s


@jit_inline
def _in_flight_bytes(mlp, rows, n, n_cores, bounded):
    """A kernel's weight bytes in flight on the chip (``F_MLP`` columns): its resident blocks,
    as many as its ``n`` output rows make and at most ``mlp[1]`` per core, times ``mlp[0]``
    bytes each; 0 (no bound) without the columns, for a kernel the bound does not describe
    (``bounded`` false: neither a GEMV nor a GEMM without split-K) or above ``mlp[3]`` rows."""
    if not bounded or mlp[0] <= 0.0 or rows > mlp[3]:
        return 0.0
    rows_per_block = np.int64(mlp[2])
    blocks = (n + rows_per_block - 1) // rows_per_block
    return min(float(blocks), n_cores * mlp[1]) * mlp[0]


@jit
def _uniform_units(op, u0, u1, nt0, split, rows, k, n, tn, k_tiles, k_tiles_per_unit, unit_k,
                   prefix_row_bits, prefix_k, tensor_meta_bits, act_reuse, act_bits, out_bits,
                   m_grain, core_peak, core_vector, dequant_ops, gemv, gemv_s, results):
    """Matmul units [u0, u1) of one M tile, one home and one column width (that of column
    ``nt0``), summed as the per-unit loop sums them: returns their tiles, tile bits, on-chip
    bits and slowest unit's seconds, and adds their activations, FLOPs and vector operations
    to ``results``. A unit's k range is the full ``unit_k[0]`` but for the last split index."""
    nn = min(tn, n - nt0 * tn)
    count = u1 - u0
    lasts = u1 // split - u0 // split          # units whose split index is split - 1
    fulls = count - lasts
    tiles = fulls * k_tiles_per_unit + lasts * (k_tiles - (split - 1) * k_tiles_per_unit)
    bits = (_cycled_sum(u1, split, prefix_row_bits) - _cycled_sum(u0, split, prefix_row_bits)) * nn
    if u0 == 0:
        bits += tensor_meta_bits
    k_sum = _cycled_sum(u1, split, prefix_k) - _cycled_sum(u0, split, prefix_k)
    # activations: read by the units of every act_reuse-th column
    act_k = _staged_k(u1, split, act_reuse, k, prefix_k) - _staged_k(u0, split, act_reuse, k,
                                                                      prefix_k)
    act = rows * act_k * act_bits
    out = count * rows * nn * out_bits
    results[op, R_ACT_READ_BITS] += act
    results[op, R_ACT_WRITTEN_BITS] += out
    results[op, R_FLOPS] += 2 * rows * nn * k_sum
    unit_s = 0.0
    if fulls > 0:
        ue = unit_k[0] * nn
        results[op, R_VECTOR_OPS] += fulls * np.int64(dequant_ops * ue)
        unit_s = max(unit_s, _unit_seconds(rows, ue, m_grain, core_peak, core_vector,
                                           dequant_ops, gemv, gemv_s))
    if lasts > 0:
        ue = unit_k[split - 1] * nn
        results[op, R_VECTOR_OPS] += lasts * np.int64(dequant_ops * ue)
        unit_s = max(unit_s, _unit_seconds(rows, ue, m_grain, core_peak, core_vector,
                                           dequant_ops, gemv, gemv_s))
    return tiles, bits, bits + act + out, unit_s


@jit
def _matmul(op, m, op_int, op_float, n_cores, vector_rate, tier_bandwidth, tier_latency_s,
            arena, read_bits, written_bits, results, times, wave_bits):
    k = op_int[op, C_K]
    n = op_int[op, C_N]
    tk = op_int[op, C_TILE_K]
    tn = op_int[op, C_TILE_N]
    tensor = op_int[op, C_TENSOR]
    home_lo = op_int[op, C_HOME]
    home_hi = op_int[op, C_HOME_HI]
    split_at = op_int[op, C_SPLIT]
    pinned = op_int[op, C_PINNED]
    elem_bits = op_int[op, C_ELEM_BITS]
    group = op_int[op, C_GROUP]
    meta_bits = op_int[op, C_META_BITS]
    padded = op_int[op, C_PADDED]
    act_bits = op_int[op, C_ACT_BITS]
    m_grain = op_int[op, C_M_GRAIN]
    core_peak = op_float[op, F_PEAK] / n_cores
    core_vector = vector_rate / n_cores
    dequant_ops = op_float[op, F_DEQUANT_OPS]
    gemv = m <= op_int[op, C_GEMV]
    gemv_s = op_float[op, F_GEMV:F_GEMV + 2 * N_GEMV_PIPES]
    share = op_int[op, C_GRID_SHARE]
    grid = n_cores // share             # the cores this op's units have in a shared grid
    # a GEMV's blocks, or the CTAs of a GEMM kernel that does not split K, keep a runtime's
    # bytes in flight (the columns are zero where the runtime gives none)
    in_flight = _in_flight_bytes(op_float[op, F_MLP:F_MLP + N_MLP_COLS], m, n, grid,
                                 gemv or op_int[op, C_SPLIT_K] == 0)
    act_reuse = op_int[op, C_ACT_REUSE]
    quant_ops = op_float[op, F_ACT_QUANT_OPS] * m * k

    n_tiles = (n + tn - 1) // tn
    k_tiles = (k + tk - 1) // tk
    tm = op_int[op, C_TILE_M]
    if tm == 0 or tm >= m:
        tm = m
    m_tiles = (m + tm - 1) // tm if m > 0 else 1
    if op_int[op, C_SPLIT_K] == 1:
        split, k_tiles_per_unit, units, waves = _work_units(n_tiles * m_tiles, k_tiles, grid)
    else:                           # one unit per output tile, its whole K
        split, k_tiles_per_unit, units = 1, k_tiles, n_tiles * m_tiles
        waves = (units + grid - 1) // grid
    out_bits = PARTIAL_SUM_BITS if split > 1 else act_bits
    aligned = group == 0 or tk % group == 0
    full_bits = _tile_bits(0, tk, tn, elem_bits, group, meta_bits, padded)

    tensor_meta_bits = op_int[op, C_TENSOR_META_BITS]
    # A unit's k range, and so its bits per output column, depends only on its split index.
    unit_k = np.empty(split, dtype=np.int64)
    unit_row_bits = np.empty(split, dtype=np.int64)
    for s in range(split):
        kt0 = s * k_tiles_per_unit
        unit_k[s] = min(k, min(k_tiles, kt0 + k_tiles_per_unit) * tk) - kt0 * tk
        unit_row_bits[s] = _tile_bits(kt0 * tk, unit_k[s], 1, elem_bits, group, meta_bits,
                                      padded)
    # A tensor the LRU holds none of, with every tile smaller than the LRU, misses every tile:
    # count them without the LRU and set its state once at the end (same state, same counts).
    streamed = (pinned == 0 and home_lo != 0 and home_hi != 0 and m_tiles == 1
                and arena[1 + tensor, T_FIRST] == NIL
                and full_bits + tensor_meta_bits <= arena[0, S_CAPACITY_BITS])
    # Every unit's tiles fare alike (all miss, all on chip, or a pinned tensor's): a wave's
    # units are summed in closed form, piece by piece (see _uniform_units).
    uniform = m_tiles == 1 and (streamed or pinned == 1 or (home_lo == 0 and home_hi == 0))
    prefix_row_bits = np.zeros(split + 1, dtype=np.int64)
    prefix_k = np.zeros(split + 1, dtype=np.int64)
    for s in range(split):
        prefix_row_bits[s + 1] = prefix_row_bits[s] + unit_row_bits[s]
        prefix_k[s + 1] = prefix_k[s] + unit_k[s]
    _begin_op(tensor, arena)
    hits = 0
    misses = 0
    hit_bits = 0
    miss_bits = 0
    results[op, R_VECTOR_OPS] += np.int64(quant_ops)
    for w in range(waves):
        slowest = quant_ops / vector_rate if w == 0 else 0.0
        wave_on_chip = 0
        if uniform:
            u0 = w * grid
            u1 = min(units, u0 + grid)
            while u0 < u1:
                nt0 = u0 // split
                p1 = u1             # a piece: units of one home and one column width
                if nt0 < split_at:
                    p1 = min(p1, split_at * split)
                if nt0 < n_tiles - 1:
                    p1 = min(p1, (n_tiles - 1) * split)
                home = home_lo if nt0 < split_at else home_hi
                hit = not streamed and _fetch(tensor, 0, 0, home, pinned, arena)
                (tiles, bits, on_chip,
                 unit_s) = _uniform_units(op, u0, p1, nt0, split, m, k, n, tn, k_tiles,
                                          k_tiles_per_unit, unit_k, prefix_row_bits, prefix_k,
                                          tensor_meta_bits, act_reuse, act_bits, out_bits,
                                          m_grain, core_peak, core_vector, dequant_ops, gemv,
                                          gemv_s, results)
                if hit:
                    hits += tiles
                    hit_bits += bits
                else:
                    misses += tiles
                    miss_bits += bits
                    wave_bits[home] += bits
                wave_on_chip += on_chip
                slowest = max(slowest, unit_s)
                u0 = p1
        for u in range(w * grid, min(units, (w + 1) * grid) if not uniform else 0):
            nt = u // split // m_tiles
            rows = min(tm, m - (u // split % m_tiles) * tm)
            kt0 = (u % split) * k_tiles_per_unit
            kt1 = min(k_tiles, kt0 + k_tiles_per_unit)
            nn = min(tn, n - nt * tn)
            t = nt * k_tiles + kt0
            if m_tiles > 1:
                _begin_op(tensor, arena)     # each M tile looks its strip up again
            home = home_lo if nt < split_at else home_hi
            # tile bits add up over a k range (a group is billed to the tile it starts in)
            unit_elements = unit_k[u % split] * nn
            kt = kt0
            if kt1 > kt0 and (streamed or home == 0 or pinned == 1):
                # the unit's tiles all miss (streamed), or all fare alike: one call for them
                bits = unit_row_bits[u % split] * nn
                if kt0 == 0 and nt == 0:
                    bits += tensor_meta_bits
                if not streamed and _fetch(tensor, t, bits, home, pinned, arena):
                    hits += kt1 - kt0
                    hit_bits += bits
                else:
                    misses += kt1 - kt0
                    miss_bits += bits
                    wave_bits[home] += bits
                wave_on_chip += bits
                kt = kt1
            while kt < kt1:
                k0 = kt * tk
                c = _held_run(t, arena)
                if c != NIL:
                    # hits on the held run's tiles in a row: one relink for all of them
                    end = min(arena[c, N_HI], t + kt1 - kt)
                    covered = min(k, (kt + end - t) * tk) - k0
                    bits = _tile_bits(k0, covered, nn, elem_bits, group, meta_bits, padded)
                    if t == 0:
                        bits += tensor_meta_bits
                    if bits != _run_bits(c, t, end, arena):     # sized otherwise: one tile
                        end = t + 1
                        bits = _matmul_tile_bits(t, k, n, tk, tn, k_tiles, aligned, full_bits,
                                                 elem_bits, group, meta_bits, padded,
                                                 tensor_meta_bits)
                    _touch_run(tensor, c, t, end, arena)
                    hits += end - t
                    hit_bits += bits
                else:
                    end = t + 1
                    kk = min(tk, k - k0)
                    if aligned and kk == tk and nn == tn:
                        bits = full_bits
                    else:
                        bits = _tile_bits(k0, kk, nn, elem_bits, group, meta_bits, padded)
                    if t == 0:
                        bits += tensor_meta_bits
                    _fill(tensor, t, bits, arena)
                    misses += 1
                    miss_bits += bits
                    wave_bits[home] += bits
                wave_on_chip += bits
                kt += end - t
                t = end
            if nt % act_reuse == 0:
                act = rows * (min(k, kt1 * tk) - kt0 * tk)
                results[op, R_ACT_READ_BITS] += act * act_bits
                wave_on_chip += act * act_bits
            out = rows * nn * out_bits
            results[op, R_ACT_WRITTEN_BITS] += out
            wave_on_chip += out
            results[op, R_FLOPS] += 2 * rows * unit_elements
            results[op, R_VECTOR_OPS] += np.int64(dequant_ops * unit_elements)
            slowest = max(slowest, _unit_seconds(rows, unit_elements, m_grain, core_peak,
                                                 core_vector, dequant_ops, gemv, gemv_s))
        if w == waves - 1 and split > 1:
            wave_on_chip += _split_reduction(op, m, n, n, split, act_bits, results)
        wave_bits[0] += wave_on_chip
        _charge_misses(op, wave_bits, read_bits)
        _close_wave(op, wave_bits, slowest / share, tier_bandwidth, tier_latency_s, times,
                    in_flight, share)
    if streamed:
        _fill_streamed(tensor, n_tiles * k_tiles, miss_bits, k, n, tk, tn, k_tiles, aligned, full_bits,
                       elem_bits, group, meta_bits, padded, tensor_meta_bits, arena)
    results[op, R_WAVES] += waves
    _record_tiles(op, hits, misses, hit_bits, miss_bits, read_bits, written_bits, results)


@jit
def _attention(op, op_int, op_float, step, n_cores, vector_rate, tier_bandwidth,
               tier_latency_s, tier_granularity, arena, read_bits, written_bits, results, times,
               wave_bits):
    batch = op_int[op, C_BATCH]
    kv_heads = op_int[op, C_KV_HEADS]
    q_per_kv = op_int[op, C_Q_PER_KV]
    head_dim = op_int[op, C_HEAD_DIM]
    v_dim = op_int[op, C_V_DIM]
    parts = op_int[op, C_KV_PARTS]
    new_tokens = op_int[op, C_NEW_TOKENS]
    block = op_int[op, C_KV_BLOCK]
    max_blocks = op_int[op, C_KV_MAX_BLOCKS]
    tensor = op_int[op, C_TENSOR]
    home_lo = op_int[op, C_HOME]
    home_hi = op_int[op, C_HOME_HI]
    split_at = op_int[op, C_SPLIT]
    pinned = op_int[op, C_PINNED]
    act_bits = op_int[op, C_ACT_BITS]
    tokens = op_int[op, C_CONTEXT] + (step + 1) * new_tokens
    blocks = (tokens + block - 1) // block
    block_bytes = (block * op_int[op, C_KV_ROW_BITS] + 7) // 8
    bits_lo = 8 * _round_up(block_bytes, tier_granularity[home_lo])
    bits_hi = 8 * _round_up(block_bytes, tier_granularity[home_hi])
    rows = q_per_kv * new_tokens
    rows_charged = _padded_rows(rows, op_int[op, C_M_GRAIN])
    core_peak = op_float[op, F_PEAK] / n_cores
    core_vector = vector_rate / n_cores
    dequant_ops = op_float[op, F_DEQUANT_OPS]

    q_tile = op_int[op, C_Q_TILE]
    if q_tile == 0 or q_tile >= new_tokens:
        q_tile = new_tokens
    q_tiles = (new_tokens + q_tile - 1) // q_tile
    streams = batch * kv_heads
    if q_tiles == 1:
        split, blocks_per_unit, units, waves = _work_units(streams, blocks, n_cores)
    else:       # flash attention: a unit per query tile, never split along the keys
        split, blocks_per_unit, units = 1, blocks, streams * q_tiles
        waves = (units + n_cores - 1) // n_cores
    out_bits = PARTIAL_SUM_BITS if split > 1 else act_bits

    streamed = (pinned == 0 and home_lo != 0 and home_hi != 0 and q_tiles == 1
                and arena[1 + tensor, T_FIRST] == NIL
                and max(bits_lo, bits_hi) <= arena[0, S_CAPACITY_BITS])
    _begin_op(tensor, arena)
    hits = 0
    misses = 0
    hit_bits = 0
    miss_bits = 0
    for w in range(waves):
        slowest = 0.0
        wave_on_chip = 0
        u_first = w * n_cores
        u_last = min(units, u_first + n_cores)
        # Streamed, a wave's units of one split index differ only in their stream: each split
        # index is walked once and counted ``same`` times (exact: its counts are integers).
        groups = min(split, u_last - u_first) if streamed else u_last - u_first
        for u in range(u_first, u_first + groups):
            same = (u_last - u + split - 1) // split if streamed else 1
            stream = u // split // q_tiles
            j0 = (u % split) * blocks_per_unit
            j1 = min(blocks, j0 + blocks_per_unit)
            q0 = (u % q_tiles) * q_tile if q_tiles > 1 else 0       # the unit's new tokens
            q1 = min(new_tokens, q0 + q_tile)
            if q_tiles > 1:      # causal: the blocks up to the tile's last query position
                j1 = min(j1, (tokens - new_tokens + q1 + block - 1) // block)
                _begin_op(tensor, arena)     # each query tile looks its blocks up again
            if streamed:
                # every block misses: the unit's blocks below and above the split at once
                low = max(0, min(j1, split_at) - j0)
                high = (j1 - j0) - low
                misses += same * parts * (j1 - j0)
                miss_bits += same * parts * (low * bits_lo + high * bits_hi)
                wave_bits[home_lo] += same * parts * low * bits_lo
                wave_bits[home_hi] += same * parts * high * bits_hi
                wave_on_chip += same * parts * (low * bits_lo + high * bits_hi)
            base = stream * max_blocks * parts     # row kv of block j: tile base + parts j + kv
            t = base + parts * j0
            t_end = base + parts * (j1 if not streamed else j0)
            while t < t_end:
                low = t - base < parts * split_at
                home = home_lo if low else home_hi
                block_bits = bits_lo if low else bits_hi
                end = t + 1
                same_home_end = min(t_end, base + parts * split_at) if low else t_end
                if home == 0 or pinned == 1:
                    # on chip, or a pinned tensor's: the tiles up to the split fare alike
                    end = same_home_end
                    held = _fetch(tensor, t, block_bits, home, pinned, arena)
                else:
                    c = _held_run(t, arena)
                    held = c != NIL
                    if held:
                        # hits on the held run's tiles in a row (up to the split): one relink
                        if arena[c, N_BITS] == block_bits and arena[c, N_PERIOD] == 0:
                            end = min(arena[c, N_HI], same_home_end)
                        _touch_run(tensor, c, t, end, arena)
                    else:
                        _fill(tensor, t, block_bits, arena)
                if held:
                    hits += end - t
                    hit_bits += (end - t) * block_bits
                else:
                    misses += end - t
                    miss_bits += (end - t) * block_bits
                    wave_bits[home] += (end - t) * block_bits
                wave_on_chip += (end - t) * block_bits
                t = end
            tok0 = j0 * block
            tok1 = min(tokens, j1 * block)
            visible = 0
            for i in range(q0, q1):
                seen = tokens - new_tokens + i + 1
                visible += max(0, min(tok1, seen) - tok0)
            # scores over the keys' width, then the weighted sum over the values' width
            results[op, R_FLOPS] += same * 2 * (head_dim + v_dim) * q_per_kv * visible
            vector_ops = (SOFTMAX_OPS * q_per_kv * visible
                          + dequant_ops * parts * head_dim * (tok1 - tok0))
            results[op, R_VECTOR_OPS] += same * np.int64(vector_ops)
            unit_rows = q_per_kv * (q1 - q0)
            results[op, R_ACT_READ_BITS] += same * unit_rows * head_dim * act_bits
            results[op, R_ACT_WRITTEN_BITS] += same * unit_rows * v_dim * out_bits
            wave_on_chip += same * unit_rows * (head_dim * act_bits + v_dim * out_bits)
            if q_tiles > 1:
                rows_charged = _padded_rows(unit_rows, op_int[op, C_M_GRAIN])
            unit_s = (2.0 * (head_dim + v_dim) * rows_charged * (tok1 - tok0) / core_peak
                      + vector_ops / core_vector)
            slowest = max(slowest, unit_s)
        if w == waves - 1 and split > 1:
            # each query row's partial output plus its running max and sum
            wave_on_chip += _split_reduction(op, streams * rows, v_dim + 2, v_dim, split,
                                             act_bits, results)
        wave_bits[0] += wave_on_chip
        _charge_misses(op, wave_bits, read_bits)
        _close_wave(op, wave_bits, slowest, tier_bandwidth, tier_latency_s, times, 0.0, 1)
    if streamed:
        _fill_streamed_kv(tensor, streams, parts, blocks, max_blocks, split_at, bits_lo,
                          bits_hi, miss_bits, arena)
    results[op, R_WAVES] += waves
    _record_tiles(op, hits, misses, hit_bits, miss_bits, read_bits, written_bits, results)


@jit
def _kv_append(op, op_int, step, n_cores, tier_bandwidth, tier_latency_s, tier_granularity,
               written_bits, results, times, wave_bits):
    """Write each sequence's new cached rows (K and V, or MLA's latent) of every KV head to the
    tier of their block.

    The new tokens of one stream are one write per tier they land on (blocks below the split on
    ``C_HOME``, the others on ``C_HOME_HI``), each rounded up to that tier's access granularity.
    """
    streams = op_int[op, C_BATCH] * op_int[op, C_KV_HEADS]
    parts = op_int[op, C_KV_PARTS]
    new_tokens = op_int[op, C_NEW_TOKENS]
    first = op_int[op, C_CONTEXT] + step * new_tokens
    boundary = op_int[op, C_SPLIT] * op_int[op, C_KV_BLOCK]      # first token on C_HOME_HI
    low = min(new_tokens, max(0, boundary - first))
    for part in range(2):
        count = low if part == 0 else new_tokens - low
        if count == 0:
            continue
        home = op_int[op, C_HOME] if part == 0 else op_int[op, C_HOME_HI]
        write_bits = 8 * _round_up((count * op_int[op, C_KV_ROW_BITS] + 7) // 8,
                                   tier_granularity[home])
        written_bits[op, home] += streams * parts * write_bits
        wave_bits[home] += streams * parts * write_bits
    act = streams * parts * new_tokens * op_int[op, C_HEAD_DIM] * op_int[op, C_ACT_BITS]
    results[op, R_ACT_READ_BITS] += act
    wave_bits[0] += act
    results[op, R_WAVES] += (streams + n_cores - 1) // n_cores
    _close_wave(op, wave_bits, 0.0, tier_bandwidth, tier_latency_s, times, 0.0, 1)


@jit
def _vector_op(op, op_int, step, seed, vector_rate, tier_bandwidth, tier_latency_s,
               arena, read_bits, written_bits, results, times, wave_bits):
    """An embedding lookup (one table row per token) or an RMSNorm (one weight vector)."""
    m = op_int[op, C_M]
    k = op_int[op, C_K]
    tensor = op_int[op, C_TENSOR]
    split_at = op_int[op, C_SPLIT]
    pinned = op_int[op, C_PINNED]
    act_bits = op_int[op, C_ACT_BITS]
    row_bits = _tile_bits(0, k, 1, op_int[op, C_ELEM_BITS], op_int[op, C_GROUP],
                          op_int[op, C_META_BITS], op_int[op, C_PADDED])
    _begin_op(tensor, arena)
    hits = 0
    misses = 0
    hit_bits = 0
    miss_bits = 0
    if op_int[op, C_KIND] == OP_EMBED:
        tokens = np.empty(m, dtype=np.int64)
        base = step * op_int[op, C_STEP_TOKENS] + op_int[op, C_TOKEN_BASE]
        for r in range(m):
            tokens[r] = token_id(seed, base + r, op_int[op, C_N])
        tokens.sort()
        n_rows = m
        vector_ops = 0
        rows_here = op_int[op, C_ROWS_HERE]
    else:
        tokens = np.zeros(1, dtype=np.int64)
        n_rows = 1
        rows_here = 1
        row_bits += op_int[op, C_TENSOR_META_BITS]
        vector_ops = NORM_OPS * m * k
        results[op, R_ACT_READ_BITS] += m * k * act_bits
        wave_bits[0] += m * k * act_bits
    for r in range(n_rows):
        row = tokens[r]
        if row >= rows_here:
            continue
        home = op_int[op, C_HOME] if row < split_at else op_int[op, C_HOME_HI]
        if _fetch(tensor, row, row_bits, home, pinned, arena):
            hits += 1
            hit_bits += row_bits
        else:
            misses += 1
            miss_bits += row_bits
            wave_bits[home] += row_bits
        wave_bits[0] += row_bits
    results[op, R_VECTOR_OPS] += vector_ops
    results[op, R_ACT_WRITTEN_BITS] += m * k * act_bits
    wave_bits[0] += m * k * act_bits
    results[op, R_WAVES] += 1
    _charge_misses(op, wave_bits, read_bits)
    _close_wave(op, wave_bits, vector_ops / vector_rate, tier_bandwidth, tier_latency_s, times,
                0.0, 1)
    _record_tiles(op, hits, misses, hit_bits, miss_bits, read_bits, written_bits, results)


@jit
def _collective(op, op_int, op_float, n_tiers, results, times):
    """A bandwidth-optimal collective of one ``m x k`` activation buffer over ``C_CHIPS`` chips.

    The buffer is cut into one chunk per chip; each pass (reduce-scatter, all-gather) sends
    ``chips - 1`` chunks from every chip, so an all-reduce sends ``2 (chips - 1) / chips`` of the
    buffer per chip, and a reduce-scatter adds ``chips - 1`` chunks on the vector units. Its time
    is the library's for the call (``F_LINK_S``, ``F_LINK_LATENCY_S``: the protocol and
    algorithm NCCL's tuner would pick, see :func:`memsim.runtime.collective_time`).
    """
    chips = op_int[op, C_CHIPS]
    passes = op_int[op, C_PASSES]
    act_bits = op_int[op, C_ACT_BITS]
    chunk = (op_int[op, C_M] * op_int[op, C_K] + chips - 1) // chips
    sent = passes * (chips - 1) * chunk * act_bits
    adds = (chips - 1) * chunk if passes == 2 else 0
    results[op, R_LINK_BITS] += sent
    results[op, R_ACT_READ_BITS] += sent
    results[op, R_ACT_WRITTEN_BITS] += sent
    results[op, R_VECTOR_OPS] += adds
    results[op, R_WAVES] += passes * op_int[op, C_LINK_STEPS]
    times[op, n_tiers] += op_float[op, F_LINK_S]
    times[op, n_tiers + 2] += op_float[op, F_LINK_LATENCY_S]


@jit
def _send(op, op_int, op_float, n_tiers, results, times):
    """One pipeline hand-off: ``m x k`` activations to the next stage over one link hop (the
    plan prices it on the link it crosses: ``F_LINK_S``, ``F_LINK_LATENCY_S``)."""
    sent = op_int[op, C_M] * op_int[op, C_K] * op_int[op, C_ACT_BITS]
    results[op, R_LINK_BITS] += sent
    results[op, R_ACT_READ_BITS] += sent
    results[op, R_WAVES] += 1
    times[op, n_tiers] += op_float[op, F_LINK_S]
    times[op, n_tiers + 2] += op_float[op, F_LINK_LATENCY_S]


@jit
def _all_to_all(op, rows, op_int, op_float, n_tiers, results, times):
    """Expert parallel dispatch (or combine): ``rows`` token rows of ``C_K`` activations sent to
    other chips at once, at the exchange's rate and latency (``F_A2A_*``: the links its peers
    sit behind, see :func:`memsim.plan.exchange_figures`)."""
    sent = rows * op_int[op, C_K] * op_int[op, C_ACT_BITS]
    results[op, R_LINK_BITS] += sent
    results[op, R_ACT_READ_BITS] += sent
    results[op, R_WAVES] += 1
    times[op, n_tiers] += sent / 8.0 / op_float[op, F_A2A_BANDWIDTH]
    times[op, n_tiers + 2] += op_float[op, F_A2A_LATENCY_S]


@jit_inline
def _runs_needed(op, kind, route, op_int, step, routes):
    """At most how many run nodes op ``op`` takes from the free list: two per tile it looks up
    (a hit inside a run splits it, and the tile starts a run of its own) and one per tile a
    streamed fill appends, which a streamed op never looks up."""
    if kind == OP_MATMUL:
        m = op_int[op, C_M] if route < 0 else routes[route, op_int[op, C_ROUTE_COL]]
        tm = op_int[op, C_TILE_M]
        m_tiles = 1 if tm == 0 or m <= tm else (m + tm - 1) // tm
        tk = op_int[op, C_TILE_K]
        tn = op_int[op, C_TILE_N]
        lookups = (((op_int[op, C_K] + tk - 1) // tk) * ((op_int[op, C_N] + tn - 1) // tn)
                   * m_tiles)
    elif kind == OP_ATTENTION:
        new_tokens = op_int[op, C_NEW_TOKENS]
        tokens = op_int[op, C_CONTEXT] + (step + 1) * new_tokens
        block = op_int[op, C_KV_BLOCK]
        q_tile = op_int[op, C_Q_TILE]
        q_tiles = 1 if q_tile == 0 or q_tile >= new_tokens else (new_tokens + q_tile - 1) // q_tile
        lookups = (op_int[op, C_BATCH] * op_int[op, C_KV_HEADS] * ((tokens + block - 1) // block)
                   * 2 * q_tiles)
    elif kind == OP_EMBED:
        lookups = op_int[op, C_M]
    elif kind == OP_NORM:
        lookups = 1
    else:
        lookups = 0
    return 2 * lookups


# A step's layers repeat: once the on-chip state after a layer is the state after the layer
# before with every layer tensor moved one layer on (the same runs, in the same order), each
# following layer whose ops are the previous one's moved one layer on does exactly what that
# layer did (the walk depends on tensor ids only through equality). Its counts are copied and
# the state is moved on, instead of walking it tile by tile: the same figures, bit for bit.
SNAPSHOT_RUNS = 4096    # a state of more runs is not compared (its layers are walked)


@jit_inline
def _starts_block(op, op_int):
    """True when op ``op`` begins a block: a layer's ops for one microbatch (``C_TOKEN_BASE``)."""
    return (op == 0 or op_int[op, C_LAYER] != op_int[op - 1, C_LAYER]
            or op_int[op, C_TOKEN_BASE] != op_int[op - 1, C_TOKEN_BASE])


@jit_inline
def _next_layer(t, tensor_next, tensor_base):
    """Tensor ``t`` moved one layer on: the same role in the next layer, ``t`` itself for a
    tensor outside the layers (or outside this plan), -1 when the next layer has no such one."""
    local = t - tensor_base
    if local < 0 or local >= tensor_next.shape[0]:
        return t
    nxt = tensor_next[local]
    return NIL if nxt < 0 else nxt + tensor_base


@jit
def _snapshot(a, snap):
    """The LRU's runs, newest first, as ``(tensor, lo, hi, bits, head bits, period)`` rows of
    ``snap``: how many, or -1 when more than ``snap`` holds."""
    if a[0, S_RUNS] > snap.shape[0]:
        return -1
    n = 0
    x = a[0, S_HEAD]
    while x != NIL:
        snap[n, 0] = a[x, N_TENSOR]
        snap[n, 1] = a[x, N_LO]
        snap[n, 2] = a[x, N_HI]
        snap[n, 3] = a[x, N_BITS]
        snap[n, 4] = a[x, N_HEAD_BITS]
        snap[n, 5] = a[x, N_PERIOD]
        n += 1
        x = a[x, N_OLDER]
    return n


@jit
def _state_moved_on(a, snap, n_snap, tensor_next, tensor_base):
    """True when the LRU holds the snapshot's runs with every tensor moved one layer on."""
    if a[0, S_RUNS] != n_snap:
        return False
    x = a[0, S_HEAD]
    for i in range(n_snap):
        t = _next_layer(snap[i, 0], tensor_next, tensor_base)
        if (t == NIL or a[x, N_TENSOR] != t or a[x, N_LO] != snap[i, 1]
                or a[x, N_HI] != snap[i, 2] or a[x, N_BITS] != snap[i, 3]
                or a[x, N_HEAD_BITS] != snap[i, 4] or a[x, N_PERIOD] != snap[i, 5]):
            return False
        x = a[x, N_OLDER]
    return True


@jit
def _block_moved_on(p0, q0, length, op_int, op_float, tensor_next, tensor_base):
    """True when ops [q0, q0 + length) are ops [p0, p0 + length) moved one layer on: the same
    columns but the layer (one more) and the tensor (moved on), none routed or pinned."""
    for i in range(length):
        p = p0 + i
        q = q0 + i
        if op_int[q, C_ROUTE] >= 0 or op_int[q, C_PINNED] != 0:
            return False
        if op_int[q, C_LAYER] != op_int[p, C_LAYER] + 1:
            return False
        tp = op_int[p, C_TENSOR]
        tq = op_int[q, C_TENSOR]
        if (tq >= 0) if tp < 0 else _next_layer(tp, tensor_next, tensor_base) != tq:
            return False
        for c in range(op_int.shape[1]):
            if c != C_LAYER and c != C_TENSOR and op_int[p, c] != op_int[q, c]:
                return False
        for c in range(op_float.shape[1]):
            if op_float[p, c] != op_float[q, c]:
                return False
    return True


@jit
def _layers_movable(a, layers, tensor_next, tensor_base):
    """How many layers on (at most ``layers``) every tensor the LRU holds can be moved."""
    x = a[0, S_HEAD]
    while x != NIL and layers > 0:
        t = a[x, N_TENSOR]
        for moved in range(layers):
            t = _next_layer(t, tensor_next, tensor_base)
            if t == NIL:
                layers = moved
                break
        x = a[x, N_OLDER]
    return layers


@jit
def _move_on(a, layers, tensor_next, tensor_base):
    """Move every tensor the LRU holds ``layers`` layers on: its runs and its run list."""
    moves = np.empty((a[0, S_RUNS], 4), dtype=np.int64)    # old tensor, new, first, last run
    n = 0
    x = a[0, S_HEAD]
    while x != NIL:
        old = a[x, N_TENSOR]
        new = old
        for _ in range(layers):
            new = _next_layer(new, tensor_next, tensor_base)
        if new != old:
            a[x, N_TENSOR] = new
            if a[x, N_PREV] == NIL:
                moves[n, 0] = old
                moves[n, 1] = new
                moves[n, 2] = a[1 + old, T_FIRST]
                moves[n, 3] = a[1 + old, T_LAST]
                n += 1
        x = a[x, N_OLDER]
    for i in range(n):
        a[1 + moves[i, 0], T_FIRST] = NIL
        a[1 + moves[i, 0], T_LAST] = NIL
    for i in range(n):
        a[1 + moves[i, 1], T_FIRST] = moves[i, 2]
        a[1 + moves[i, 1], T_LAST] = moves[i, 3]


@jit
def _repeat_layers(op, length, op_int, op_float, tensor_next, tensor_base, arena, read_bits,
                   written_bits, results, times):
    """After block [op - length, op) left the state its previous block's moved on, copy its
    counts into each following block that repeats it, and move the state on as far: returns
    the op after the last block copied (``op`` when none)."""
    n_ops = op_int.shape[0]
    layers = 0
    q = op
    while (q + length <= n_ops and (q + length == n_ops or _starts_block(q + length, op_int))
           and _block_moved_on(q - length, q, length, op_int, op_float, tensor_next,
                               tensor_base)):
        layers += 1
        q += length
    layers = _layers_movable(arena, layers, tensor_next, tensor_base)
    if layers == 0:
        return op
    for j in range(layers):
        for i in range(length):
            dst = op + j * length + i
            src = op - length + i
            read_bits[dst, :] = read_bits[src, :]
            written_bits[dst, :] = written_bits[src, :]
            results[dst, :] = results[src, :]
            times[dst, :] = times[src, :]
    _move_on(arena, layers, tensor_next, tensor_base)
    return op + layers * length


@jit
def walk_step(op_int, op_float, step, seed, n_cores, vector_rate, launch_s, kernel_fixed_s,
              host_launch_s, tier_bandwidth, tier_latency_s, tier_granularity, routes, arena,
              first_op, max_runs, tensor_next, tensor_base, read_bits, written_bits, results,
              times):
    """Emulate decode step ``step`` (0-based) of the plan's ops from ``first_op`` on,
    accumulating into the outputs; returns the op it stopped before (the op count when done).

    ``read_bits``/``written_bits`` are ``[op, tier]``; ``results`` is ``[op, R_*]``; ``times`` is
    ``[op, tier..., link, compute, latency, launch]`` in seconds. ``routes`` is the step's MoE
    route table (tokens per expert, rows each chip sends; see ``memsim.routing``). The residency
    state (``arena``, see :func:`new_arena`) carries over from one call to the next.
    ``tensor_next`` is, per tensor of the plan (ids from ``tensor_base``), the same role's
    tensor in the next layer (see ``SNAPSHOT_RUNS``): the layers that repeat are copied.

    The walk stops before an op whose run nodes the arena's free list may not have, unless the
    arena has its full ``max_runs`` (a bound on the runs the LRU can ever hold, which then
    leaves enough free); the state is whole between ops, so the caller grows the arena
    (:func:`grow_arena`) and calls again from the op returned.

    Each of an op's ``C_LAUNCHES`` kernels costs the device's dispatch gap ``launch_s`` and, in
    its own duration (the latency column), ``kernel_fixed_s`` that streams nothing (not charged to
    collectives, hand-offs and all-to-alls: their times come from measured calls); a stack
    that launches from the host without a captured graph also cannot run an op faster than its
    host launches (``host_launch_s`` each, 0 when graphed): the launch column takes the rest.
    """
    n_tiers = tier_bandwidth.shape[0]
    n_ops = op_int.shape[0]
    wave_bits = np.zeros(n_tiers, dtype=np.int64)
    node_rows = arena.shape[0] - 1 - arena[0, S_TENSORS]
    snap = np.empty((min(SNAPSHOT_RUNS, max_runs), 6), dtype=np.int64)
    n_snap = -1                 # runs in the snapshot of the state before the current block
    block = first_op if _starts_block(first_op, op_int) else NIL   # the current block's start
    op = first_op
    while op < n_ops:
        if op > first_op and _starts_block(op, op_int):
            if block != NIL and op_int[block, C_LAYER] >= 0 and n_snap >= 0 and _state_moved_on(
                    arena, snap, n_snap, tensor_next, tensor_base):
                op = _repeat_layers(op, op - block, op_int, op_float, tensor_next,
                                    tensor_base, arena, read_bits, written_bits, results,
                                    times)
                if op == n_ops:
                    break
            n_snap = _snapshot(arena, snap)
            block = op
        kind = op_int[op, C_KIND]
        route = op_int[op, C_ROUTE]
        if kind == OP_MATMUL and route >= 0 and routes[route, op_int[op, C_ROUTE_COL]] == 0:
            op += 1
            continue                    # an expert no token chose: no work, no launch
        live = arena[0, S_RUNS]
        if (node_rows < max_runs and node_rows - live
                < min(_runs_needed(op, kind, route, op_int, step, routes), max_runs - live)):
            return op
        _walk_op(op, kind, route, op_int, op_float, step, seed, n_cores, vector_rate,
                 tier_bandwidth, tier_latency_s, tier_granularity, routes, arena, read_bits,
                 written_bits, results, times, wave_bits)
        launches = op_int[op, C_LAUNCHES]
        if kind < OP_COLLECTIVE:        # link ops are timed from measured calls, whole
            times[op, n_tiers + 2] += kernel_fixed_s * launches
        times[op, n_tiers + 3] += launch_s * launches
        op_s = 0.0
        for col in range(times.shape[1]):
            op_s += times[op, col]
        host_bound = host_launch_s * launches - op_s
        if host_bound > 0.0:
            times[op, n_tiers + 3] += host_bound
        op += 1
    for row in range(1, 1 + arena[0, S_TENSORS]):
        arena[row, T_PINNED_LOADED] = arena[row, T_LOADED_NOW]
    return n_ops


@jit
def _walk_op(op, kind, route, op_int, op_float, step, seed, n_cores, vector_rate,
             tier_bandwidth, tier_latency_s, tier_granularity, routes, arena, read_bits,
             written_bits, results, times, wave_bits):
    """One op of a step, by kind."""
    n_tiers = tier_bandwidth.shape[0]
    if kind == OP_ALL_TO_ALL:
        _all_to_all(op, routes[route, op_int[op, C_ROUTE_COL]], op_int, op_float, n_tiers,
                    results, times)
    elif kind == OP_MATMUL:
        m = op_int[op, C_M] if route < 0 else routes[route, op_int[op, C_ROUTE_COL]]
        _matmul(op, m, op_int, op_float, n_cores, vector_rate, tier_bandwidth,
                tier_latency_s, arena, read_bits, written_bits, results, times, wave_bits)
    elif kind == OP_ATTENTION:
        _attention(op, op_int, op_float, step, n_cores, vector_rate, tier_bandwidth,
                   tier_latency_s, tier_granularity, arena, read_bits, written_bits, results,
                   times, wave_bits)
    elif kind == OP_KV_APPEND:
        _kv_append(op, op_int, step, n_cores, tier_bandwidth, tier_latency_s,
                   tier_granularity, written_bits, results, times, wave_bits)
    elif kind == OP_COLLECTIVE:
        _collective(op, op_int, op_float, n_tiers, results, times)
    elif kind == OP_SEND:
        _send(op, op_int, op_float, n_tiers, results, times)
    else:
        _vector_op(op, op_int, step, seed, vector_rate, tier_bandwidth, tier_latency_s,
                   arena, read_bits, written_bits, results, times, wave_bits)


@jit
def sum_tile_bits(k, n, tile_k, tile_n, elem_bits):
    """The benchmark's floor: a bare loop over a matrix's tiles that only sums their sizes."""
    total = 0
    for n0 in range(0, n, tile_n):
        nn = min(tile_n, n - n0)
        for k0 in range(0, k, tile_k):
            total += min(tile_k, k - k0) * nn * elem_bits
    return total
