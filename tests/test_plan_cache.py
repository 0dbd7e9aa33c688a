"""A point's figures do not depend on what the process planned before it.

Plans are built from per-process caches of what a point shares with others (its device, model,
formats and parallelism); these tests run varied points in two orders, so that one order meets
each point on a cache miss and the other on a hit, and compare every figure exactly: the JSON
and CSV of the report and the warm step's per-op rows.
"""

from __future__ import annotations

import numpy as np
import pytest

import memsim
from memsim.kernels import step as k

CXL = ("h100-sxm", "cxl-gen5-x16")

#: (device, model, workload fields): parallelism, MoE, MLA, prefill, speculative heads,
#: placement rules, the pinned and tiered policies and SRAM machines, at several batch x context.
POINTS = (
    ("h100-sxm", "llama-3-70b", dict(weights="int8")),
    ("h100-sxm", "llama-3-70b", dict(weights="int8", batch=8, context=1024)),
    ("h100-sxm", "llama-3.2-1b", dict(weights="int8")),
    ("h100-sxm", "llama-3.2-1b", dict(weights="int8", batch=16, context=8192)),
    ("h100-sxm", "llama-3.2-1b", dict(batch=4, context=512, kv="fp8-e4m3")),
    ("h100-sxm", "llama-3-70b", dict(tp=8, batch=32, context=2048)),
    ("h100-sxm", "llama-3-70b", dict(tp=4, pp=2, microbatches=2, batch=8, context=4096)),
    ("h100-sxm", "llama-3-70b", dict(tp=4, pp=2, batch=2, context=512)),
    ("h100-sxm", "mixtral-8x7b", dict(tp=2, batch=4, context=2048)),
    ("h100-sxm", "mixtral-8x7b", dict(ep=2, batch=8, context=1024, weights="int8")),
    ("h100-sxm", "deepseek-v3-style", dict(tp=8, weights="int4-g128", batch=2, context=4096)),
    ("h100-sxm", "llama-3-8b", dict(prefill_chunk=256, prefill_context=512, batch=2)),
    ("h100-sxm", "llama-3-8b", dict(draft_heads=2, batch=1, context=2048)),
    ("h100-sxm", "llama-3-8b", dict(new_tokens=4, batch=2, context=1024)),
    (CXL, "llama-3-8b", dict(placement={"kv": "cxl:0.5"}, batch=8, context=8192)),
    (CXL, "llama-3-8b", dict(placement={"weights": "cxl:0.3"}, context=64)),
    (CXL, "llama-3-70b", dict(policy="tiered", weights="int8", batch=4, context=4096)),
    ("mtia-v2", "llama-3.2-1b", dict(weights="int8", context=512, steps=3)),
    ("mtia-v2", "llama-3.2-1b", dict(weights="int8", policy="hybrid", batch=2, context=1024)),
    ("wse-3", "llama-3-8b", dict(batch=4, context=8192)),
    ("groq-lpu", "llama-3-70b", dict(pp=576, weights="int8", kv="fp16")),
    ("groq-lpu", "llama-3.2-1b", dict(tp=4, pp=4, batch=2, context=1024)),
    ("inferentia2", "llama-3-8b", dict(tp=12, batch=2, context=2048)),
    ("mi300x", "llama-3.2-1b", dict(batch=8, context=2048, weights="int4-g128", kv="fp8-e4m3")),
    ("b200", "llama-3-70b", dict(weights="int4-g128", batch=1, context=32768)),
    ("tpu-v5e", "llama-3-8b", dict(tp=4, batch=8, context=4096)),
    ("mi300x", "llama-3-8b", dict(batch=64, context=128)),
    # the same devices, models and shapes at other batch x context (a hit on the rows above)
    ("h100-sxm", "llama-3-70b", dict(weights="int8", batch=3, context=777)),
    ("h100-sxm", "llama-3-70b", dict(tp=8, batch=5, context=100)),
    ("h100-sxm", "llama-3-70b", dict(tp=4, pp=2, microbatches=2, batch=4, context=300)),
    ("h100-sxm", "mixtral-8x7b", dict(ep=2, batch=4, context=4000, weights="int8")),
    ("h100-sxm", "deepseek-v3-style", dict(tp=8, weights="int4-g128", batch=1, context=1000)),
    ("h100-sxm", "llama-3-8b", dict(prefill_chunk=256, prefill_context=512, batch=4,
                                    context=3000)),
    ("h100-sxm", "llama-3-8b", dict(draft_heads=2, batch=4, context=100)),
    ("h100-sxm", "llama-3-8b", dict(new_tokens=4, batch=1, context=5000)),
    (CXL, "llama-3-8b", dict(placement={"kv": "cxl:0.5"}, batch=2, context=512)),
    (CXL, "llama-3-70b", dict(policy="tiered", weights="int8", batch=16, context=8192)),
    ("mtia-v2", "llama-3.2-1b", dict(weights="int8", policy="hybrid", batch=1, context=64)),
    ("groq-lpu", "llama-3-70b", dict(pp=576, weights="int8", kv="fp16", context=1024)),
    ("groq-lpu", "llama-3.2-1b", dict(tp=4, pp=4, batch=4, context=100)),
    ("inferentia2", "llama-3-8b", dict(tp=12, batch=1, context=4000)),
    ("wse-3", "llama-3-8b", dict(batch=1, context=1024)),
)


def _device(spec) -> memsim.Device:
    if isinstance(spec, tuple):
        name, tier = spec
        return memsim.device(name).with_tier(tier)
    return memsim.device(spec)


def figures(point) -> tuple[str, str, list[dict]]:
    """Every figure of one point: the report's JSON and CSV and the warm per-op rows."""
    device, model, fields = point
    rep = memsim.emulate(_device(device), model, **fields)
    return rep.to_json(), rep.to_csv(), [row.to_dict() for row in rep.op_rows("warm")]


def test_points_in_two_orders_give_the_same_figures():
    forward = [figures(point) for point in POINTS]
    backward = [figures(point) for point in reversed(POINTS)][::-1]
    for point, a, b in zip(POINTS, forward, backward):
        assert a == b, point


def test_a_repeated_point_gives_the_same_figures():
    first = figures(POINTS[0])
    figures(POINTS[1])
    assert figures(POINTS[0]) == first


def test_cached_rows_are_read_only_and_a_plan_owns_its_tables():
    from memsim.plan import _stage_rows, plan_system

    dev, mod = memsim.device("h100-sxm"), memsim.model("llama-3.2-1b")
    first = plan_system(dev, mod, memsim.Decode(batch=2, context=256)).stages[0]
    expected = first.op_int.copy(), first.op_float.copy()
    first.op_int[:] = -7                    # a caller scribbling over its plan's tables
    first.op_float[:] = -7.0
    again = plan_system(dev, mod, memsim.Decode(batch=2, context=256)).stages[0]
    assert (again.op_int == expected[0]).all() and (again.op_float == expected[1]).all()
    assert _stage_rows.cache_info().currsize <= _stage_rows.cache_info().maxsize


def test_the_cached_rows_cannot_be_written():
    from memsim.plan import _Keyed, _StageRows, _stage_rows

    hits = _stage_rows.cache_info().hits
    memsim.emulate("h100-sxm", "llama-3.2-1b", batch=3, context=128)
    memsim.emulate("h100-sxm", "llama-3.2-1b", batch=5, context=640)
    assert _stage_rows.cache_info().hits > hits       # the second point reused the rows
    rows = _StageRows.of(np.zeros((1, k.N_INT_COLS), dtype=np.int64),
                         np.zeros((1, k.N_FLOAT_COLS)), ("embed",), ("bf16",),
                         np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64), ())
    for array in (rows.op_int, rows.op_float, rows.op_micro, rows.m_role):
        with pytest.raises(ValueError):
            array[0] = 1
    assert _Keyed((1,), 2) == _Keyed((1,), 2, shape_hash=hash((1,))) != _Keyed((1,), 3)


def test_a_batch_and_context_set_on_cached_rows_match_the_closed_form():
    from memsim.plan import plan_system

    dev, mod = memsim.device("h100-sxm"), memsim.model("llama-3.2-1b")
    plan_system(dev, mod, memsim.Decode(batch=1, context=4096))        # the rows, cached
    plan = plan_system(dev, mod, memsim.Decode(batch=6, context=1000, steps=2)).stages[0]
    kind = plan.op_int[:, k.C_KIND]
    assert (plan.op_int[:, k.C_BATCH] == 6).all()
    assert (plan.op_int[:, k.C_CONTEXT] == 1000).all()
    assert (plan.op_int[:, k.C_KV_MAX_BLOCKS] == -(-(1000 + 2) // 16)).all()
    assert (plan.op_int[:, k.C_STEP_TOKENS] == 6).all()
    no_m = (kind == k.OP_KV_APPEND) | (kind == k.OP_ATTENTION)
    assert (plan.op_int[no_m, k.C_M] == 0).all() and (plan.op_int[~no_m, k.C_M] == 6).all()


def test_a_tables_next_layer_is_its_own_and_writable():
    from memsim.plan import _next_layer, plan_system

    dev = memsim.device("h100-sxm")
    for name in ("llama-3.2-1b", "llama-3-8b"):        # a tied head and an untied one
        for batch, context in ((1, 4096), (3, 100)):
            table = plan_system(dev, memsim.model(name),
                                memsim.Decode(batch=batch, context=context)).stages[0].tensor_table
            own = _next_layer(table.spec, table.layer, table.block_start)
            assert (table.next_layer == own).all()
            assert table.next_layer.flags.writeable     # a kernel argument: one Numba type
            table.next_layer[0] = 5                     # the next plan's is its own


def test_runs_of_one_shape_share_an_op_frame_and_its_tables_stay_put():
    from memsim.emulate import SystemRun
    from memsim.plan import plan_system

    dev, mod = memsim.device("h100-sxm"), memsim.model("llama-3.2-1b")
    one = SystemRun(plan_system(dev, mod, memsim.Decode(batch=2, context=300)))
    two = SystemRun(plan_system(dev, mod, memsim.Decode(batch=7, context=9000)))
    assert one.ops is two.ops
    with pytest.raises(ValueError):
        one.ops.kind[0] = 0
    other = SystemRun(plan_system(dev, mod, memsim.Decode(batch=2, context=300, tp=2)))
    assert other.ops is not one.ops and other.ops.peer_ops.any() and not one.ops.peer_ops.any()


#: Pairs of workloads that share their stages' cached rows (all but the batch and context).
SHARED = (
    ("h100-sxm", "llama-3-70b", dict(weights="int8"), dict(batch=3, context=777)),
    ("h100-sxm", "llama-3-70b", dict(tp=4, pp=2, microbatches=2, batch=2),
     dict(batch=8, context=300)),
    ("h100-sxm", "mixtral-8x7b", dict(ep=2, weights="int8", batch=2),
     dict(batch=6, context=4000)),
    ("h100-sxm", "deepseek-v3-style", dict(tp=8, weights="int4-g128"),
     dict(batch=2, context=1000)),
    ("h100-sxm", "llama-3-8b", dict(prefill_chunk=256, prefill_context=512),
     dict(batch=4, context=3000)),
    ("h100-sxm", "llama-3-8b", dict(draft_heads=2, new_tokens=3), dict(batch=5, context=100)),
    ("groq-lpu", "llama-3.2-1b", dict(tp=4, pp=4), dict(batch=4, context=100)),
    ("mtia-v2", "llama-3.2-1b", dict(weights="int8", policy="hybrid"), dict(batch=2, context=64)),
)


def _tables(device: str, model: str, fields: dict) -> list:
    from memsim.plan import plan_system

    system = plan_system(memsim.device(device), memsim.model(model), memsim.Decode(**fields))
    out = []
    for plan in system.stages:
        table = plan.tensor_table
        out.append((plan.op_int.tolist(), plan.op_float.tolist(), plan.op_names,
                    plan.op_formats, plan.op_microbatch.tolist(), plan.layers,
                    plan.lru_capacity_bits, plan.max_lru_entries, plan.residency,
                    [getattr(table, name).tolist() for name in (
                        "spec", "layer", "item", "home", "home_hi", "split", "pinned",
                        "aliased", "tier_bytes", "block_start", "next_layer", "is_weight")],
                    [spec for spec in table.specs], table.need(),
                    plan.bytes_by_tier("weight"), plan.bytes_by_tier("kv")))
    return out


@pytest.mark.parametrize("device,model,shape,point", SHARED + (
    ("h100-sxm", "llama-3.2-1b", dict(weights="int8"), dict(batch=3, context=100)),
    ("h100-sxm", "llama-3.2-1b", dict(residency="pinned"), dict(batch=2, context=64)),
    (CXL, "llama-3-70b", dict(policy="tiered", weights="int8"), dict(batch=16, context=8192)),
))
def test_a_tables_held_bytes_and_tied_head_match_their_columns(device, model, shape, point):
    """What a table takes from its cached frame (which tensors are weights, which one a tied
    LM head aliases) and the bytes it holds equal what its own columns and specs say."""
    for fields in (shape, {**shape, **point}):
        system = memsim.plan.plan_system(_device(device), memsim.model(model),
                                         memsim.Decode(**fields))
        for plan in system.stages:
            table = plan.tensor_table
            kinds = np.array([table.specs[i].kind for i in table.spec])
            roles = [table.specs[i].role for i in table.spec]
            assert (table.is_weight == (kinds == "weight")).all()
            live = ~table.aliased
            for weights in (True, False):
                want = table.tier_bytes[live & ((kinds == "weight") == weights)].sum(axis=0)
                assert (table.held(weights) == want).all()
            assert table.need() == dict(enumerate(table.tier_bytes[live].sum(axis=0).tolist()))
            tied = memsim.model(model).tied_embeddings and "lm_head" in roles
            assert table.aliased.sum() == (1 if tied and "embedding" in roles else 0)
            if table.aliased.any():
                e, h = roles.index("embedding"), roles.index("lm_head")
                assert table.aliased[h] and (table.tier_bytes[h] == table.tier_bytes[e]).all()
                assert table.home[h] == table.home[e] and table.home_hi[h] == table.home_hi[e]


def test_a_plan_set_on_cached_rows_is_the_plan_lowered_afresh():
    """A point planned on rows cached for another batch and context has the tables a process
    that never saw the other point lowers: a column that follows the batch or context and is
    not set on the cached rows shows here."""
    from memsim.plan import _stage_rows, _table_frame

    for device, model, shape, point in SHARED:
        _tables(device, model, shape)                       # the rows, cached for the default
        patched = _tables(device, model, {**shape, **point})
        _stage_rows.cache_clear()
        _table_frame.cache_clear()
        assert _tables(device, model, {**shape, **point}) == patched, (device, model, point)


def test_distinct_rows_names_each_kinds_first_row_and_each_rows_kind():
    from memsim.plan import distinct_rows

    firsts, kinds = distinct_rows(np.array([[1, 2], [3, 4], [1, 2], [5, 6], [3, 4]]))
    assert firsts.tolist() == [0, 1, 3]
    assert kinds.tolist() == [0, 1, 0, 2, 1]
    firsts, kinds = distinct_rows(np.zeros((0, 3), dtype=np.int64))
    assert firsts.size == 0 and kinds.size == 0


def test_a_point_sets_no_collective_column_but_m():
    """A stage's collectives are sorted into kinds once per process, by the columns a point
    does not set and by the role that sets their M; that holds while M is the only collective
    column a point sets."""
    from memsim.plan import _POINT_COLUMNS, COLLECTIVE_COLUMNS

    assert set(COLLECTIVE_COLUMNS) & set(_POINT_COLUMNS.tolist()) == {k.C_M}


def test_collectives_are_priced_for_their_own_device_object():
    """A collective's time priced for one device is not reused for another whose link differs,
    nor does pricing the other change the first's (the prices are kept per device object)."""
    dev = memsim.device("h100-sxm")
    slow = dev.with_overrides({"link.bandwidth": "45 GB/s"})
    workload = memsim.Decode(tp=4, batch=2, context=512)

    def link_times(device):
        plan = memsim.plan.plan_system(device, memsim.model("llama-3.2-1b"), workload).stages[0]
        rows = plan.op_int[:, k.C_KIND] == k.OP_COLLECTIVE
        return plan.op_float[rows, k.F_LINK_S:k.F_LINK_LATENCY_S + 1].copy()

    first = link_times(dev)
    slower = link_times(slow)
    assert len(first) and (slower[:, 0] > first[:, 0]).all()
    assert (link_times(dev) == first).all()
