"""The bound on tiles an on-chip LRU can hold at once, in one pass over a plan's op table.

The op table's column numbers and op kinds come in as arguments (``columns``, ``kinds``), not as
this module's globals: Numba freezes globals into its cache, and a cached kernel does not notice
a renumbering in another file.
"""

from __future__ import annotations

import numpy as np

from memsim.kernels.jit import jit

# positions in the ``columns`` argument of lru_tiles
KIND, TENSOR, PINNED, HOME, HOME_HI, TILE_K, TILE_N, K, N, M, ELEM_BITS, KV_ROW_BITS, \
    KV_PARTS, BATCH, KV_HEADS, KV_MAX_BLOCKS = range(16)
# positions in the ``kinds`` argument
EMBED, MATMUL, ATTENTION, KV_APPEND = range(4)


@jit
def lru_tiles(op_int: np.ndarray, columns: np.ndarray, kinds: np.ndarray, steps: int,
              kv_block: int, granularity: np.ndarray) -> tuple[int, int]:
    """Over the ops that cache a tensor's tiles in the LRU (a tensor read from off chip, not
    pinned, not a KV append): the distinct tiles they touch in ``steps`` steps, and the bits of
    the smallest tile (-1 when no op caches any). An embedding caches ``M x steps`` rows, a norm
    its vector, a matmul its K x N tiles (the smallest: the remainders of K and N), attention
    its KV blocks of every stream (rounded up to the coarser home tier's access)."""
    distinct = 0
    smallest = -1
    for op in range(op_int.shape[0]):
        row = op_int[op]
        kind = row[columns[KIND]]
        if (row[columns[TENSOR]] < 0 or kind == kinds[KV_APPEND] or row[columns[PINNED]] != 0
                or (row[columns[HOME]] == 0 and row[columns[HOME_HI]] == 0)):
            continue
        elem = row[columns[ELEM_BITS]]
        kk = row[columns[K]]
        bits = kk * elem                            # an embedding row, a norm's vector
        tiles = row[columns[M]] * steps if kind == kinds[EMBED] else 1
        if kind == kinds[MATMUL]:
            tk, tn, n = row[columns[TILE_K]], row[columns[TILE_N]], row[columns[N]]
            min_k = min(tk, tk if kk % tk == 0 else kk % tk)
            min_n = min(tn, tn if n % tn == 0 else n % tn)
            bits = min_k * min_n * elem
            tiles = ((kk + tk - 1) // tk) * ((n + tn - 1) // tn)
        elif kind == kinds[ATTENTION]:
            grain = min(granularity[row[columns[HOME]]], granularity[row[columns[HOME_HI]]])
            block_bytes = (kv_block * row[columns[KV_ROW_BITS]] + 7) // 8
            bits = 8 * (((block_bytes + grain - 1) // grain) * grain)
            streams = row[columns[KV_PARTS]] * row[columns[BATCH]] * row[columns[KV_HEADS]]
            tiles = streams * row[columns[KV_MAX_BLOCKS]]
        distinct += tiles
        if smallest < 0 or bits < smallest:
            smallest = bits
    return distinct, smallest
