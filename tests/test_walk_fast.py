"""The walker's closed-form paths (a wave of streamed, on-chip or pinned matmul units summed
piece by piece; streamed attention walked once per split index; a streamed fill that keeps
and appends whole alike columns at once; held runs of K/V blocks hit as one relink) give the
per-tile twin's counts, times and LRU contents, tile for tile and in recency order."""

from __future__ import annotations

import numpy as np
import pytest

import memsim
from memsim.emulate import NO_ROUTES, Residency, run_step
from memsim.kernels import step as walker
from memsim.plan import plan_system
from tests import reference


def _held_tiles(arena: np.ndarray) -> list[tuple[tuple[int, int], int]]:
    """The arena's tiles, least recently used first: ((tensor, tile), bits)."""
    tiles = []
    run = arena[0, walker.S_TAIL]
    while run != walker.NIL:
        tensor, bits = int(arena[run, walker.N_TENSOR]), int(arena[run, walker.N_BITS])
        head_bits, period = int(arena[run, walker.N_HEAD_BITS]), int(arena[run, walker.N_PERIOD])
        tiles += [((tensor, t), head_bits if period and t % period == 0 else bits)
                  for t in range(arena[run, walker.N_LO], arena[run, walker.N_HI])]
        run = arena[run, walker.N_NEWER]
    return tiles


def _model(hidden: int, ffn: int) -> memsim.Model:
    return memsim.Model(name="tiny", display_name="tiny", layers=2, hidden=hidden, heads=4,
                        kv_heads=2, head_dim=16, ffn=ffn, vocab=200, tied_embeddings=False)


CASES = [
    # (on-chip bytes, cores, weights, placement, hidden, ffn, tile_k, tile_n, context)
    (3000, 4, "bf16", {}, 96, 200, 16, 8, 40),          # split-free waves, ragged columns
    (3000, 64, "int8", {}, 96, 200, 16, 8, 40),         # split-K, per-channel scales
    (20000, 7, "int8", {"weights": "cxl:0.5"}, 120, 160, 48, 8, 64),   # two homes
    (2500, 5, "int4-g32", {"kv": "cxl:0.5"}, 64, 96, 32, 16, 70),      # aligned groups
    (2500, 5, "int4-g128", {}, 160, 96, 32, 16, 30),    # groups span tiles: per-tile fill
    (6000, 3, "bf16", {}, 96, 400, 16, 8, 20),          # the tail kept is whole columns
    (6000, 3, "int8", {}, 100, 400, 16, 8, 20),         # ... of two runs each, ragged K
    (9000, 3, "int8", {}, 96, 400, 16, 8, 20),          # ... as one run of whole columns,
    (40000, 2, "int8", {}, 96, 400, 16, 8, 20),         # trimmed and hit by the next step
    (1 << 22, 3, "bf16", {}, 64, 96, 16, 8, 50),        # everything held: runs of hits
]


@pytest.mark.parametrize("case", CASES)
def test_fast_paths_equal_the_per_tile_twin(case):
    on_chip, cores, weights, placement, hidden, ffn, tile_k, tile_n, context = case
    base = memsim.device("h100-sxm").with_tier("cxl-gen5-x16")
    device = base.with_overrides({"cores": cores, "tiers.sram.capacity": f"{on_chip} B",
                                  "tiers.hbm.capacity": "1 TB", "tiers.cxl.capacity": "1 TB"})
    workload = memsim.Decode(batch=2, context=context, weights=weights, placement=placement,
                             steps=3, tile_k=tile_k, tile_n=tile_n, kv_block=4,
                             residency="lru")
    check_against_twin(plan_system(device, _model(hidden, ffn), workload).stages[0],
                       workload.steps)


def check_against_twin(plan, steps: int) -> None:
    """``steps`` steps of ``plan`` give the twin's counts and LRU contents after each."""
    residency = Residency(plan)
    twin = reference.new_state(plan)
    for step in range(steps):
        counts = run_step(plan, residency, step, NO_ROUTES)
        reference.assert_counts_equal(counts, reference.run_step(plan, twin, step))
        assert _held_tiles(residency.arena) == list(twin.lru.tiles.items())
