"""What the per-point speed-ups keep exact: a sweep's slim worker answers rebuild its rows, and a
point's items with its KV blocks are its cached items with those specs replaced (a summary's
time sums: tests/test_time_sums.py)."""

from __future__ import annotations

import numpy as np
import pytest

from memsim.store import encoded
from memsim.study import grid
from memsim.sweep import (CHUNK_POINTS, MAX_CHUNK_POINTS, chunk_size, chunks, evaluate_chunk,
                          evaluate_encoded, with_keys)


def test_chunks_are_bounded_and_balance_the_workers():
    assert chunk_size(10, 2) == CHUNK_POINTS
    assert chunk_size(1000, 2) == 31 == 1000 // (16 * 2)
    assert chunk_size(10 ** 6, 2) == MAX_CHUNK_POINTS


def test_the_last_chunks_are_small_so_the_workers_finish_together():
    points = grid(device=["h100-sxm", "mi300x"], model="llama-3.2-1b", batch=list(range(1, 51)))
    work = chunks(points, 31, jobs=2)
    assert [len(c) for c in work] == [31, 31, 8, 8, 8, 8, 6]
    assert [p for c in work for p in c] == [p for c in chunks(points, 31) for p in c]
    assert [len(c) for c in chunks(points, 31)] == [31, 31, 31, 7]
    assert [len(c) for c in chunks(points[:5], 31, jobs=2)] == [5]


def test_a_workers_answer_is_the_store_text_of_the_rows_of_a_chunk():
    points = grid(device=["h100-sxm", "mi300x"], model="llama-3.2-1b", batch=[1, 4],
                  context=[256, 10 ** 7])                     # the longest context fails
    want = evaluate_chunk(points)
    got = with_keys(points, evaluate_encoded(points))
    assert [(row[0], *encoded(row[1], row[2]), row[3]) for row in want] == \
        [row[:4] for row in got]
    assert any(row[3] is not None for row in got) and any(row[3] is None for row in got)


@pytest.mark.parametrize("name", ["llama-3.2-1b", "llama-3-70b", "mixtral-8x7b",
                                  "deepseek-v3-style"])
def test_items_with_kv_blocks_are_the_specs_replaced(name):
    """The items of a point equal, spec for spec, its cached items with every layer KV cache
    (not a prompt chunk's) replaced by dataclasses.replace, whatever was asked before."""
    import dataclasses

    import memsim
    from memsim import plan as plan_module

    model = memsim.model(name)
    sh = plan_module.shard(model, 1, 1)
    items = plan_module._shaped_items(model, "int8", "bf16", "bf16", 4, 0, sh, 128, None, True)
    for blocks, streams in ((1, 8), (257, 24), (3, 1)):
        got = plan_module._with_kv_blocks(items, blocks, streams)
        want = [plan_module._Item(tuple(
            dataclasses.replace(s, rows=blocks, units=blocks, sequences=streams)
            if s.kind == "kv" and not s.chunk else s for s in item.specs), item.layer,
            item.shape) for item in items]
        assert got == want
        assert [hash(item) for item in got] == [hash(item) for item in want]
