"""Seeded sampling kernels: which experts a step's tokens choose, and which drafted tokens a
speculative-decoding iteration accepts.

Every draw is a splitmix64 hash of (seed, counter), so results are deterministic for a seed and
independent of the order of calls. Mixture-of-experts routing: each token picks ``k`` distinct
experts per MoE layer by successive draws, each in proportion to the routing probabilities of the
experts it has not picked yet (for equal probabilities, a uniform top-k). Acceptance: each
sequence of a sampled iteration draws one Bernoulli per drafted position, in order, until the
first rejection. Kept apart from the decode walker, so that an edit here leaves the walker's
compiled cache alone (and this module's helpers beside the kernels that call them).
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
def _uniform(seed, counter, salt):
    """A uniform double in [0, 1) from 53 bits of the mixed (seed, counter)."""
    bits = _mix(np.uint64(seed) * np.uint64(salt) + np.uint64(counter))
    return float(bits >> np.uint64(11)) / 9007199254740992.0


ROUTING_SALT = 0x9E3779B1
ACCEPTANCE_SALT = 0x100000001B3


@jit
def route_tokens(probs, k, tokens, seed, step, choices):
    """Fill ``choices[layer, token, :]`` with the ``k`` experts each token picks in each MoE
    layer at decode step ``step``; ``probs[layer, expert]`` are the routing probabilities."""
    layers, experts = probs.shape
    picked = np.zeros(experts, dtype=np.bool_)
    for layer in range(layers):
        for t in range(tokens):
            picked[:] = False
            left = 0.0
            for e in range(experts):
                left += probs[layer, e]
            for j in range(k):
                counter = ((step * layers + layer) * tokens + t) * k + j
                target = _uniform(seed, counter, ROUTING_SALT) * left
                chosen = -1
                acc = 0.0
                for e in range(experts):
                    if picked[e]:
                        continue
                    chosen = e
                    acc += probs[layer, e]
                    if acc > target:
                        break
                picked[chosen] = True
                left -= probs[layer, chosen]
                choices[layer, t, j] = chosen


@jit
def tally(choices, experts, groups, chips, out):
    """Per layer and token group (microbatch), tokens routed to each expert, and per layer the
    rows each chip sends to other chips when ``chips`` chips hold equal shares of the experts
    and of the tokens (expert parallel: one row per token and distinct remote chip).

    ``out[layer * groups + g, e]`` counts tokens of group ``g`` routed to expert ``e``;
    ``out[layer * groups + g, experts + c]`` the rows chip ``c`` sends for group ``g``.
    """
    layers, tokens, k = choices.shape
    per_group = tokens // groups
    per_chip_tokens = tokens // chips
    per_chip_experts = experts // chips
    seen = np.zeros(chips, dtype=np.bool_)
    for layer in range(layers):
        for t in range(tokens):
            row = layer * groups + t // per_group
            home = t // per_chip_tokens
            seen[:] = False
            for j in range(k):
                e = choices[layer, t, j]
                out[row, e] += 1
                chip = e // per_chip_experts
                if chip != home and not seen[chip]:
                    seen[chip] = True
                    out[row, experts + home] += 1


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
            u = _uniform(seed, counter, ACCEPTANCE_SALT)
            counter += 1
            if u < rates[position]:
                accepted += 1
            else:
                break
        out[accepted + 1] += 1
    return out
