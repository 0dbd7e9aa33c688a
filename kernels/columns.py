"""A point's columns of a stage's op table, set in one pass over the ops cached for its shape,
and the bytes its tensor table holds.

The op rows of a stage are lowered once per process for every batch and context
(``memsim.plan._StageRows``); a point sets the columns that follow its batch, context and
placement. Done with numpy, that is a dozen masked and fancy-indexed assignments of a few
microseconds each; one loop here sets the same values (and one sums a table's bytes). The
column numbers come in as an argument (``columns``), not as this module's globals: Numba
freezes globals into its cache.
"""

from __future__ import annotations

import numpy as np

from memsim.kernels.jit import jit

# positions in the ``columns`` argument of set_point_columns
BATCH, CONTEXT, KV_MAX_BLOCKS, M, STEP_TOKENS, TOKEN_BASE, TENSOR, HOME, HOME_HI, SPLIT, \
    PINNED = range(11)
N_COLUMNS = 11


@jit
def set_point_columns(op_int: np.ndarray, columns: np.ndarray, decode: np.ndarray,
                      m_role: np.ndarray, op_micro: np.ndarray, m_by_role: np.ndarray,
                      mb: int, context: int, max_blocks: int, step_tokens: int,
                      token_base: int, m_rows: int, home: np.ndarray, home_hi: np.ndarray,
                      split: np.ndarray, pinned: np.ndarray) -> None:
    """Set, in every op row of ``op_int``: the batch ``mb``, ``context`` and ``max_blocks``
    where ``decode`` (not a prompt chunk's op); M by the op's ``m_role`` (``m_by_role``);
    the step's tokens and the op's first token (``token_base`` + its microbatch x ``m_rows``);
    and, for an op that reads a tensor, the tensor's ``home``, ``home_hi``, ``split`` and
    ``pinned`` flag."""
    c_tensor = columns[TENSOR]
    for op in range(op_int.shape[0]):
        if decode[op]:
            op_int[op, columns[BATCH]] = mb
            op_int[op, columns[CONTEXT]] = context
            op_int[op, columns[KV_MAX_BLOCKS]] = max_blocks
        op_int[op, columns[M]] = m_by_role[m_role[op]]
        op_int[op, columns[STEP_TOKENS]] = step_tokens
        op_int[op, columns[TOKEN_BASE]] = token_base + op_micro[op] * m_rows
        t = op_int[op, c_tensor]
        if t >= 0:
            op_int[op, columns[HOME]] = home[t]
            op_int[op, columns[HOME_HI]] = home_hi[t]
            op_int[op, columns[SPLIT]] = split[t]
            op_int[op, columns[PINNED]] = 1 if pinned[t] else 0


@jit
def held_bytes(tier_bytes: np.ndarray, aliased: np.ndarray,
               is_weight: np.ndarray) -> np.ndarray:
    """``[kind, tier]`` the bytes per tier of the weights (kind 0) and of the KV caches (1) of
    a tensor table (``tier_bytes``: ``[tensor, tier]``), an ``aliased`` tensor not counted.
    Exact integer sums: their order does not matter."""
    out = np.zeros((2, tier_bytes.shape[1]), dtype=np.int64)
    for t in range(tier_bytes.shape[0]):
        if aliased[t]:
            continue
        kind = 0 if is_weight[t] else 1
        for tier in range(tier_bytes.shape[1]):
            out[kind, tier] += tier_bytes[t, tier]
    return out
