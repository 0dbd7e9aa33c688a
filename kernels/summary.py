"""A step's integer totals in one pass over its ops (what memsim.report.summarize sums).

Counters are exact integers, so the order of the additions does not matter: one loop gives the
same totals as numpy's column sums of the per-op whole bytes, without building the per-op table.
"""

from __future__ import annotations

import numpy as np

from memsim.kernels.jit import jit


@jit
def group_totals(read_bits: np.ndarray, written_bits: np.ndarray, results: np.ndarray,
                 byte_results: np.ndarray, group: np.ndarray, n_groups: int,
                 weight_ops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Totals per group of ops (``group[op]``; -1 leaves the op out): ``[group, column]`` of the
    whole bytes read and written per tier, the whole bytes of the ``byte_results`` counters and
    the raw results (the columns of memsim.report's ``_Columns``), and ``[group, tier]`` of the
    whole bytes the ``weight_ops`` read. A counter's bits round up to whole bytes per op."""
    n_ops, n_tiers = read_bits.shape
    n_bytes, n_results = byte_results.shape[0], results.shape[1]
    totals = np.zeros((n_groups, 2 * n_tiers + n_bytes + n_results), dtype=np.int64)
    weights = np.zeros((n_groups, n_tiers), dtype=np.int64)
    for op in range(n_ops):
        g = group[op]
        if g < 0:
            continue
        for t in range(n_tiers):
            read = (read_bits[op, t] + 7) >> 3
            totals[g, t] += read
            totals[g, n_tiers + t] += (written_bits[op, t] + 7) >> 3
            if weight_ops[op]:
                weights[g, t] += read
        for j in range(n_bytes):
            totals[g, 2 * n_tiers + j] += (results[op, byte_results[j]] + 7) >> 3
        base = 2 * n_tiers + n_bytes
        for j in range(n_results):
            totals[g, base + j] += results[op, j]
    return totals, weights
