"""A step's float time sums (memsim.kernels.summary.time_sums, what ``summarize`` adds up)
against the closed form: numpy's own sums of the same ops, bit for bit (numpy sums pairwise, so
the order of every addition matters)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memsim.kernels.summary import time_sums

N_CLASSES = 3


def closed_form(times, critical, spent_class, fixed_launches, kernel_fixed_s):
    """The numpy expressions memsim.report summed the times with before the kernel."""
    running = float(np.cumsum(times.sum(axis=1))[-1]) if len(times) else 0.0
    by_column = times[critical].sum(axis=0)
    launch = float(np.add.reduce(times[critical, -1]))
    work = np.add.reduce(times[:, :-1], axis=1)
    kernel_fixed = 0.0
    if len(fixed_launches):
        fixed = np.minimum(fixed_launches * kernel_fixed_s, times[:, -2])
        work = work - fixed
        kernel_fixed = float(np.add.reduce(fixed[critical]))
    spent = [float(np.add.reduce(work[critical & (spent_class == c)]))
             for c in range(N_CLASSES)]
    return running, by_column, launch, kernel_fixed, spent


def _bits(value) -> bytes:
    return np.asarray(value, dtype=np.float64).tobytes()


def _check(n_ops: int, n_cols: int, seed: int, every: bool, fixed: bool) -> None:
    rng = np.random.default_rng(seed)
    times = rng.random((n_ops, n_cols)) * 10.0 ** rng.integers(-12, -1, size=(n_ops, n_cols))
    times[rng.random((n_ops, n_cols)) < 0.2] = 0.0          # columns an op spends nothing in
    critical = np.ones(n_ops, dtype=bool) if every else rng.random(n_ops) < 0.6
    spent_class = rng.integers(-1, N_CLASSES, size=n_ops)
    launches = (rng.integers(0, 4, size=n_ops) if fixed else np.zeros(0, dtype=np.int64))
    kernel_fixed_s = 2.5e-6 if fixed else 0.0
    got = time_sums(times, critical, spent_class, N_CLASSES, launches, kernel_fixed_s)
    want = closed_form(times, critical, spent_class, launches, kernel_fixed_s)
    for a, b in zip(got, want):
        assert _bits(a) == _bits(b)


@pytest.mark.parametrize("n_ops", [0, 1, 7, 8, 9, 15, 16, 17, 127, 128, 129, 147, 256, 257,
                                   723, 1000, 5000, 20001])
@pytest.mark.parametrize("n_cols", [5, 6, 8, 9, 10, 12])
def test_time_sums_are_numpys_sums_bit_for_bit(n_ops, n_cols):
    for seed, (every, fixed) in enumerate([(True, True), (True, False), (False, True),
                                           (False, False)]):
        _check(n_ops, n_cols, 1000 * n_ops + 10 * n_cols + seed, every, fixed)


@settings(max_examples=60, deadline=None)
@given(n_ops=st.integers(0, 600), n_cols=st.integers(5, 14), seed=st.integers(0, 2 ** 32 - 1),
       every=st.booleans(), fixed=st.booleans())
def test_time_sums_match_numpy_on_any_shape(n_ops, n_cols, seed, every, fixed):
    _check(n_ops, n_cols, seed, every, fixed)
