"""Seeded Monte Carlo of speculative-decoding acceptance.

Each sequence of each sampled iteration draws one Bernoulli per drafted position, in order, with
that position's acceptance rate; the first rejection stops it. The iteration then yields the
accepted drafts plus one token from the verification. Kept in its own module with its own
generator so that the decode walker's cache is not touched by an edit here.
"""

from __future__ import annotations

import numpy as np

from memsim.kernels.jit import jit, jit_inline


@jit_inline
def _mix(x):
    """splitmix64 finaliser."""
    z = np.uint64(x) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@jit_inline
def _uniform(seed, counter):
    """A uniform double in [0, 1) from 53 bits of the mixed counter."""
    bits = _mix(np.uint64(seed) * np.uint64(0x100000001B3) + np.uint64(counter))
    return float(bits >> np.uint64(11)) / 9007199254740992.0


@jit
def tokens_histogram(rates, draws, seed):
    """Counts of tokens per sequence-iteration over ``draws`` draws: ``out[t]`` is how many
    yielded ``t`` tokens (1 .. len(rates) + 1; ``out[0]`` stays 0)."""
    gamma = rates.shape[0]
    out = np.zeros(gamma + 2, dtype=np.int64)
    counter = 0
    for _ in range(draws):
        accepted = 0
        for position in range(gamma):
            u = _uniform(seed, counter)
            counter += 1
            if u < rates[position]:
                accepted += 1
            else:
                break
        out[accepted + 1] += 1
    return out
