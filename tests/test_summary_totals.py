"""A step's integer totals (memsim.kernels.summary.group_totals, what ``summarize`` sums) against
the closed form: numpy's column sums of each op's whole bytes, per group of ops."""

from __future__ import annotations

import numpy as np
import pytest

from memsim.kernels.summary import group_totals


def closed_form(read_bits, written_bits, results, byte_results, group, n_groups, weight_ops):
    whole = lambda bits: -(-bits // 8)                                   # noqa: E731
    per_op = np.concatenate([whole(read_bits), whole(written_bits),
                             whole(results[:, byte_results]), results], axis=1)
    totals = np.stack([per_op[group == g].sum(axis=0) for g in range(n_groups)])
    weights = np.stack([whole(read_bits)[(group == g) & weight_ops].sum(axis=0)
                        for g in range(n_groups)])
    return totals, weights


@pytest.mark.parametrize("seed", range(6))
def test_group_totals_match_numpy_column_sums(seed):
    rng = np.random.default_rng(seed)
    n_ops, n_tiers, n_results = int(rng.integers(0, 300)), int(rng.integers(1, 5)), 9
    n_groups = int(rng.integers(1, 4))
    read_bits = rng.integers(0, 1 << 40, (n_ops, n_tiers))
    written_bits = rng.integers(0, 1 << 40, (n_ops, n_tiers))
    results = rng.integers(0, 1 << 40, (n_ops, n_results))
    byte_results = np.array([0, 3, 4, 7], dtype=np.int64)
    group = rng.integers(-1, n_groups, n_ops)          # -1: an op no group counts
    weight_ops = rng.random(n_ops) < 0.5
    got = group_totals(read_bits, written_bits, results, byte_results, group, n_groups,
                       weight_ops)
    want = closed_form(read_bits, written_bits, results, byte_results, group, n_groups,
                       weight_ops)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
