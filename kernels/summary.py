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


@jit
def _block_sum(values: np.ndarray, start: int, n: int) -> float:
    """numpy's pairwise sum of a block of at most 128 elements: eight running sums."""
    if n < 8:
        res = -0.0
        for i in range(start, start + n):
            res += values[i]
        return res
    r0, r1, r2, r3 = values[start], values[start + 1], values[start + 2], values[start + 3]
    r4, r5, r6, r7 = values[start + 4], values[start + 5], values[start + 6], values[start + 7]
    i = 8
    while i < n - n % 8:
        at = start + i
        r0 += values[at]
        r1 += values[at + 1]
        r2 += values[at + 2]
        r3 += values[at + 3]
        r4 += values[at + 4]
        r5 += values[at + 5]
        r6 += values[at + 6]
        r7 += values[at + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += values[start + i]
        i += 1
    return res


@jit
def _pairwise_sum(values: np.ndarray, start: int, n: int) -> float:
    """numpy's pairwise sum of ``values[start:start + n]`` (``pairwise_sum_DOUBLE`` of
    numpy/_core/src/umath/loops_utils.h.src), addition for addition: blocks of at most 128
    elements (:func:`_block_sum`), a longer run split in two halves (the first a multiple of
    eight long) whose sums are added. The halves are walked with a stack, not by recursion:
    Numba's cache cannot load a recursive function (the process segfaults)."""
    if n <= 128:
        return _block_sum(values, start, n)
    starts = np.empty(64, dtype=np.int64)      # a split halves the run: depth <= 63
    sizes = np.empty(64, dtype=np.int64)
    left = np.empty(64)                        # a node's left half's sum, once known
    left_done = np.zeros(64, dtype=np.bool_)
    top = 0
    starts[0], sizes[0] = start, n
    while True:
        size = sizes[top]
        if size > 128:                         # descend into the left half
            half = size // 2 - (size // 2) % 8
            top += 1
            starts[top], sizes[top], left_done[top] = starts[top - 1], half, False
            continue
        res = _block_sum(values, starts[top], size)
        top -= 1
        while top >= 0:                        # hand the sum up to the nodes it completes
            if not left_done[top]:
                left[top], left_done[top] = res, True
                half = sizes[top] // 2 - (sizes[top] // 2) % 8
                top += 1
                starts[top] = starts[top - 1] + half
                sizes[top] = sizes[top - 1] - half
                left_done[top] = False
                break
            res = left[top] + res
            top -= 1
        if top < 0:
            return res


@jit
def _numpy_sum(values: np.ndarray, n: int) -> float:
    """``np.add.reduce(values[:n])`` bit for bit: the identity, plus the pairwise sum."""
    return 0.0 + _pairwise_sum(values, 0, n)


@jit
def time_sums(times: np.ndarray, critical: np.ndarray, spent_class: np.ndarray, n_classes: int,
              fixed_launches: np.ndarray, kernel_fixed_s: float) -> tuple:
    """A step's float time sums in one pass, each what memsim.report's numpy expression gives bit
    for bit (numpy's pairwise sums, tests/test_time_sums.py).

    ``times`` is [op, column] with the latency and launch columns last; ``critical`` marks the
    ops on the critical path; ``spent_class[op]`` the :data:`memsim.report._SPENT_ON_NAMES` index
    of what the op's time is spent on (-1: none); ``fixed_launches[op]`` the op's kernels that
    pay ``kernel_fixed_s`` (empty: none split out). Returns the running sum over every op of
    its row's sum (``np.cumsum(times.sum(axis=1))[-1]``), the critical ops' column sums
    (``times[critical].sum(axis=0)``), their launch time, their kernel fixed time, and per class
    their work (the row less its launch and fixed time)."""
    n_ops, n_cols = times.shape
    has_fixed = fixed_launches.shape[0] == n_ops
    running = 0.0
    by_column = np.zeros(n_cols)
    launch = np.empty(n_ops)
    fixed = np.empty(n_ops)
    work = np.empty((n_classes, n_ops))
    in_class = np.zeros(n_classes, dtype=np.int64)
    n_critical = 0
    for op in range(n_ops):
        row = times[op]
        total = _numpy_sum(row, n_cols)
        running = total if op == 0 else running + total
        if not critical[op]:
            continue
        for c in range(n_cols):
            by_column[c] += row[c]
        launch[n_critical] = row[n_cols - 1]
        spent = _numpy_sum(row, n_cols - 1)
        if has_fixed:
            fixed_s = min(fixed_launches[op] * kernel_fixed_s, row[n_cols - 2])
            fixed[n_critical] = fixed_s
            spent = spent - fixed_s
        n_critical += 1
        c = spent_class[op]
        if c >= 0:
            work[c, in_class[c]] = spent
            in_class[c] += 1
    spent_on = np.empty(n_classes)
    for c in range(n_classes):
        spent_on[c] = _numpy_sum(work[c], in_class[c])
    return (running, by_column, _numpy_sum(launch, n_critical),
            _numpy_sum(fixed, n_critical if has_fixed else 0), spent_on)
