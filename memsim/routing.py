"""Which experts a step's tokens choose: uniform, Zipf-skewed, or a user's routing trace.

``routing`` is ``"uniform"``, ``"zipf:S"`` (expert of rank r chosen in proportion to r^-S, the
ranks shuffled per layer with the seed, so each layer has its own hot experts), or the path of a
``.npy`` trace of expert ids shaped ``[steps, moe_layers, tokens, k]`` (or without the leading
steps axis; step ``s`` uses trace ``s mod steps``).
"""

from __future__ import annotations

import math
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from memsim.errors import ConfigError
from memsim.workload import parse_routing
from memsim.kernels import sampling as kr
from memsim.model import Model


#: Largest Zipf exponent: at S = 100 the top expert already takes all but 1e-30 of the tokens.
#: Largest routing trace memsim reads: 2**28 expert ids (2 GiB as int64).
MAX_TRACE_ELEMENTS = 2**28


def probabilities(model: Model, routing: str, seed: int) -> np.ndarray:
    """Routing probabilities ``[moe_layer, expert]`` (a trace's empirical frequencies)."""
    kind, exponent = parse_routing(routing)
    layers, experts = model.moe_layers, model.experts
    if kind == "uniform":
        return np.full((layers, experts), 1.0 / experts)
    if kind == "trace":
        trace = load_trace(routing, model)
        counts = np.zeros((layers, experts))
        for layer in range(layers):
            counts[layer] = np.bincount(trace[:, layer].ravel(), minlength=experts)
        return counts / counts.sum(axis=1, keepdims=True)
    weights = 1.0 / np.arange(1, experts + 1) ** exponent
    rng = np.random.default_rng(seed)
    probs = np.stack([weights[rng.permutation(experts)] for _ in range(layers)])
    return probs / probs.sum(axis=1, keepdims=True)


def _trace_header(path: str) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype from a ``.npy`` header, read before the data so that a file claiming a
    huge shape is refused without allocating it."""
    def fail(reason: str) -> ConfigError:
        return ConfigError(f"not a .npy routing trace: {reason}", file=path, field="routing")

    if zipfile.is_zipfile(path):
        raise fail("it is an .npz archive (np.savez); save one array with np.save")
    try:
        with open(path, "rb") as handle:
            version = np.lib.format.read_magic(handle)
            readers = {(1, 0): np.lib.format.read_array_header_1_0,
                       (2, 0): np.lib.format.read_array_header_2_0}
            if version not in readers:
                raise fail(f".npy format version {version[0]}.{version[1]} is not supported")
            shape, _, dtype = readers[version](handle)
    except OSError as exc:
        raise ConfigError(f"cannot read the routing trace: {exc.strerror}", file=path,
                          field="routing") from None
    except (ValueError, EOFError, SyntaxError, TypeError) as exc:
        raise fail(f"{exc}" or "empty or truncated file") from None
    return tuple(shape), dtype


def load_trace(path: str, model: Model) -> np.ndarray:
    """A routing trace as int64 ``[steps, moe_layers, tokens, k]``, validated."""
    shape, dtype = _trace_header(path)
    size = math.prod(shape)
    if size > MAX_TRACE_ELEMENTS:
        raise ConfigError(f"the header claims {size:,} expert ids {shape}, above memsim's limit "
                          f"of {MAX_TRACE_ELEMENTS:,}", file=path, field="routing")
    if len(shape) in (3, 4) and 0 in shape:
        raise ConfigError(f"the trace is empty (shape {shape}): it needs at least one step "
                          f"and one token", file=path, field="routing")
    try:
        trace = np.load(Path(path), allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise ConfigError(f"cannot read a .npy routing trace: {exc}", file=path,
                          field="routing") from None
    if trace.ndim == 3:
        trace = trace[None]
    k = model.experts_per_token
    if (trace.ndim != 4 or trace.shape[1] != model.moe_layers or trace.shape[3] != k
            or not np.issubdtype(trace.dtype, np.integer)):
        raise ConfigError(f"expected integer expert ids shaped [steps, {model.moe_layers} MoE "
                          f"layers, tokens, {k}] (or without steps), got {trace.dtype} "
                          f"{trace.shape}", file=path, field="routing")
    if trace.size and (trace.min() < 0 or trace.max() >= model.experts):
        raise ConfigError(f"expert ids must lie in 0..{model.experts - 1}", file=path,
                          field="routing")
    ordered = np.sort(trace, axis=-1)
    if (ordered[..., 1:] == ordered[..., :-1]).any():
        raise ConfigError("a token picks the same expert twice in one layer", file=path,
                          field="routing")
    return trace.astype(np.int64)


@dataclass(frozen=True)
class Router:
    """Routes a step's tokens and tallies them for the walker."""

    model: Model
    routing: str
    seed: int
    tokens: int          # batch x new tokens per sequence
    groups: int          # microbatches
    chips: int           # expert-parallel chips

    def choices(self, step: int) -> np.ndarray:
        """Experts each token picks, ``[moe_layer, token, k]``."""
        kind, _ = parse_routing(self.routing)
        k = self.model.experts_per_token
        if kind == "trace":
            trace = load_trace(self.routing, self.model)
            chosen = trace[step % trace.shape[0]]
            if chosen.shape[1] != self.tokens:
                raise ConfigError(f"the trace routes {chosen.shape[1]} tokens per step; the "
                                  f"workload has {self.tokens} (batch x new tokens)",
                                  file=self.routing, field="routing")
            return np.ascontiguousarray(chosen)
        out = np.zeros((self.model.moe_layers, self.tokens, k), dtype=np.int64)
        kr.route_tokens(probabilities(self.model, self.routing, self.seed), k, self.tokens,
                        self.seed, step, out)
        return out

    def tally(self, step: int) -> np.ndarray:
        """The walker's route table: per (MoE layer, microbatch) row, tokens per expert, then
        rows each expert-parallel chip sends."""
        out = np.zeros((self.model.moe_layers * self.groups, self.model.experts + self.chips),
                       dtype=np.int64)
        kr.tally(self.choices(step), self.model.experts, self.groups, self.chips, out)
        return out
