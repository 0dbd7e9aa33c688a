"""A layer whose ops and on-chip state repeat the layer before's, moved one layer on, is copied
instead of walked (kernels/step.py, ``SNAPSHOT_RUNS``): the counts, times and LRU contents are
those of walking every layer tile by tile, for any shape, format, placement and capacity."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import memsim
from memsim.emulate import NO_ROUTES, Residency, run_step
from memsim.plan import plan_system
from memsim.testing import examples
from tests.test_walk_fast import _held_tiles, check_against_twin


def _walk(plan, steps: int, copy_layers: bool):
    """Every step's counts and the LRU's tiles after each."""
    residency = Residency(plan)
    out = []
    for step in range(steps):
        counts = run_step(plan, residency, step, NO_ROUTES, copy_layers=copy_layers)
        out.append((counts, _held_tiles(residency.arena)))
    return out


def _tiny(layers: int, hidden: int, ffn: int) -> memsim.Model:
    return memsim.Model(name="tiny", display_name="tiny", layers=layers, hidden=hidden, heads=4,
                        kv_heads=2, head_dim=16, ffn=ffn, vocab=200, tied_embeddings=False)


@settings(max_examples=examples(40), deadline=None)
@given(layers=st.integers(3, 9), hidden=st.integers(16, 160), ffn=st.integers(16, 320),
       on_chip=st.integers(32, 60_000), cores=st.integers(1, 9),
       weights=st.sampled_from(["bf16", "int8", "int4-g32", "int4-g128", "fp8-e4m3"]),
       placement=st.sampled_from([{}, {"weights": "cxl:0.5"}, {"kv": "cxl:0.5"}]),
       batch=st.integers(1, 3), context=st.integers(0, 90), steps=st.integers(1, 3),
       microbatches=st.sampled_from([1, 2]), tile=st.sampled_from([(16, 8), (32, 16), (48, 8)]),
       tp=st.sampled_from([1, 2]), residency=st.sampled_from(["lru", "auto"]))
def test_copied_layers_equal_walked_layers(layers, hidden, ffn, on_chip, cores, weights,
                                           placement, batch, context, steps, microbatches,
                                           tile, tp, residency):
    base = memsim.device("h100-sxm").with_tier("cxl-gen5-x16")
    device = base.with_overrides({"cores": cores, "tiers.sram.capacity": f"{on_chip} B",
                                  "tiers.hbm.capacity": "1 TB", "tiers.cxl.capacity": "1 TB"})
    workload = memsim.Decode(batch=batch * microbatches, microbatches=microbatches,
                             context=context, weights=weights, placement=placement,
                             steps=steps, tile_k=tile[0], tile_n=tile[1], kv_block=4,
                             residency=residency, tp=tp)
    plan = plan_system(device, _tiny(layers, hidden, ffn), workload).stages[0]
    copied = _walk(plan, steps, copy_layers=True)
    walked = _walk(plan, steps, copy_layers=False)
    for (c, c_tiles), (w, w_tiles) in zip(copied, walked):
        for name in ("read_bits", "written_bits", "results", "times"):
            np.testing.assert_array_equal(getattr(c, name), getattr(w, name), err_msg=name)
        assert c_tiles == w_tiles


def test_copied_layers_equal_the_per_tile_twin():
    """Eight layers through a small on-chip tier, the later ones copied once the LRU settles."""
    device = memsim.device("h100-sxm").with_overrides({"cores": 5,
                                                      "tiers.sram.capacity": "3000 B"})
    workload = memsim.Decode(batch=2, context=40, weights="int8", steps=3, tile_k=16, tile_n=8,
                             kv_block=4, residency="lru")
    check_against_twin(plan_system(device, _tiny(8, 96, 200), workload).stages[0],
                       workload.steps)


def test_the_layer_map_moves_each_tensor_to_its_role_in_the_next_layer():
    """Weights and each microbatch's caches move to the same role one layer on; the last
    layer's have nowhere to go; the embedding and head stay."""
    workload = memsim.Decode(batch=4, microbatches=2, context=64)
    plan = plan_system(memsim.device("h100-sxm"), _tiny(3, 64, 128), workload).stages[0]
    names = [plan.tensor_table.name(i) for i in range(plan.n_tensors)]
    moved = {names[i]: (names[j] if j >= 0 else None)
             for i, j in enumerate(plan.tensor_table.next_layer.tolist())}
    for name, to in moved.items():
        parts = name.split(".")
        if plan.tensor_table.layer[names.index(name)] < 0:
            assert to == name
        elif int(parts[1]) == 2:
            assert to is None
        else:
            assert to == ".".join([parts[0], str(int(parts[1]) + 1)] + parts[2:])
