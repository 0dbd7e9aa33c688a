"""Mixture-of-experts: routed experts per token, their bytes at every batch, expert parallel."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import memsim
from memsim.layout import collective_steps
from memsim.plan import exchange_figures, plan_system
from memsim.routing import Router, probabilities
from memsim.testing import examples

EXPERT_OPS = ("expert_gate", "expert_up", "expert_down")


def moe_model(experts: int, k: int, layers: int = 2, **extra) -> memsim.Model:
    return memsim.Model(name="moe", display_name="moe", layers=layers, hidden=256, heads=4,
                        kv_heads=2, head_dim=64, ffn=512, vocab=1000, tied_embeddings=False,
                        experts=experts, experts_per_token=k, **extra)


def test_mixtral_batch_one_reads_its_active_parameters():
    """Two experts per layer for one token: the bytes read are the active parameters (12.9 B
    in bf16), less the embedding table but one looked-up row; not the 46.7 B total."""
    model = memsim.model("mixtral-8x7b")
    report = memsim.emulate("h200", model, batch=1, context=1024)
    active_bytes = 2 * (model.active_params - model.vocab * model.hidden + model.hidden)
    assert report.weight_bytes_read == active_bytes
    assert report.weight_bytes_read < 0.3 * report.weights_held
    assert "weights read" in report.table()


def test_bytes_read_approach_all_experts_as_the_batch_grows():
    model = memsim.model("mixtral-8x7b")
    previous = 0
    for batch in (1, 4, 16, 64):
        report = memsim.emulate("h200", model, batch=batch, context=256, steps=3)
        expert_bytes = sum(r.bytes_read["hbm"] for r in report.ops if r.name in EXPERT_OPS)
        mean, _ = report.warm_spread()["weight_bytes_read"]
        assert mean >= previous
        previous = mean
    all_experts = model.moe_layers * model.experts * model.ffn_params_per_expert * 2
    assert expert_bytes > 0.99 * all_experts          # 64 tokens x 2 of 8 miss almost none


@settings(max_examples=examples(30))
@given(st.integers(2, 64), st.integers(1, 8), st.integers(1, 64), st.integers(0, 99))
def test_distinct_experts_match_the_uniform_closed_form(experts, k, batch, seed):
    """E (1 - (1 - k/E)^B) distinct experts per layer, within three standard errors of the
    emulated mean over 48 layers x 4 steps."""
    k = min(k, experts)
    model = moe_model(experts, k, layers=48)
    router = Router(model, "uniform", seed, batch, 1, 1)
    samples = []
    for step in range(4):
        routes = router.tally(step)
        samples += list((routes[:, :experts] > 0).sum(axis=1))
    values = np.array(samples, dtype=np.float64)
    e = experts
    expected = e * (1 - (1 - k / e) ** batch)
    # the standard error from the exact variance of the distinct count
    none = (1 - k / e) ** batch                                # expert e unchosen
    neither = ((e - k) * (e - k - 1) / (e * (e - 1))) ** batch  # e and f both unchosen
    variance = e * none * (1 - none) + e * (e - 1) * (neither - none ** 2)
    error = math.sqrt(max(variance, 0.0) / len(values))
    assert abs(values.mean() - expected) <= 3 * error + 1e-9


def test_the_walker_reads_exactly_the_experts_the_router_chose():
    dev = memsim.device("h100-sxm").with_overrides({"tiers.sram.capacity": "4 KiB"})
    model = moe_model(16, 4, layers=3)
    report = memsim.emulate(dev, model, batch=5, context=64, seed=11, steps=1)
    routes = Router(model, "uniform", 11, 5, 1, 1).tally(0)
    expert_rows = [r for r in report.op_rows("cold") if r.name == "expert_gate"]
    chosen = [row.bytes_read["hbm"] > 0 for row in expert_rows]
    assert chosen == list((routes[:, :16] > 0).ravel())
    per_expert = 256 * 512 * 2
    assert all(row.bytes_read["hbm"] in (0, per_expert) for row in expert_rows)


def test_each_routing_is_deterministic_for_a_seed():
    model = moe_model(8, 2)
    for routing in ("uniform", "zipf:1.3"):
        a = Router(model, routing, 5, 32, 1, 1).choices(3)
        assert (a == Router(model, routing, 5, 32, 1, 1).choices(3)).all()
        assert (a != Router(model, routing, 6, 32, 1, 1).choices(3)).any()
        assert all(len(set(row)) == 2 for layer in a for row in layer)


def test_zipf_routing_concentrates_tokens_on_hot_experts():
    model = moe_model(16, 2, layers=8)
    probs = probabilities(model, "zipf:1.5", seed=0)
    assert np.allclose(probs.sum(axis=1), 1.0)
    uniform = Router(model, "uniform", 0, 64, 1, 1).tally(0)[:, :16]
    skewed = Router(model, "zipf:1.5", 0, 64, 1, 1).tally(0)[:, :16]
    assert uniform.sum() == skewed.sum() == 8 * 64 * 2
    assert (skewed > 0).sum() < (uniform > 0).sum()


def _trace(tmp_path, choices) -> str:
    path = tmp_path / "trace.npy"
    np.save(path, np.array(choices))
    return str(path)


def test_a_routing_trace_drives_the_experts(tmp_path):
    model = moe_model(4, 1, layers=2)
    path = _trace(tmp_path, [[[0], [0]], [[3], [1]]])         # [layer, token, k]
    dev = memsim.device("h100-sxm").with_overrides({"tiers.sram.capacity": "4 KiB"})
    report = memsim.emulate(dev, model, batch=2, context=8, routing=path, steps=1)
    gates = [r for r in report.op_rows("cold") if r.name == "expert_gate"]
    assert [r.bytes_read["hbm"] > 0 for r in gates] == [True, False, False, False,
                                                         False, True, False, True]


@pytest.mark.parametrize("choices, message", [
    ([[[0], [9]], [[0], [1]]], "0..3"),
    ([[[0, 0], [1, 2]], [[0, 1], [1, 2]]], "shaped"),
    ([[[0.5], [1]], [[0], [1]]], "integer"),
])
def test_bad_traces_name_the_file(tmp_path, choices, message):
    path = _trace(tmp_path, choices)
    with pytest.raises(memsim.ConfigError, match=message) as info:
        memsim.emulate("h100-sxm", moe_model(4, 1), batch=2, context=8, routing=path)
    assert info.value.field == "routing" and info.value.file == path


def test_duplicate_experts_in_a_trace_are_refused(tmp_path):
    path = _trace(tmp_path, [[[1, 1]], [[0, 1]]])
    with pytest.raises(memsim.ConfigError, match="same expert twice"):
        memsim.emulate("h100-sxm", moe_model(4, 2), batch=1, context=8, routing=path)


# Expert parallel ----------------------------------------------------------------------------

def test_all_to_all_bytes_are_the_closed_form_for_a_trace(tmp_path):
    """Four chips hold two experts each and two tokens each; every token sends its hidden state
    once to each other chip holding one of its experts, and gets it back (combine)."""
    experts, k, chips, batch = 8, 2, 4, 8
    rng = np.random.default_rng(3)
    choices = np.array([[rng.choice(experts, k, replace=False) for _ in range(batch)]
                        for _ in range(2)])
    path = _trace(tmp_path, choices)
    model = moe_model(experts, k, layers=2)
    report = memsim.emulate("h100-sxm", model, batch=batch, context=16, ep=chips, routing=path)
    rows = 0
    for layer in range(2):
        for token in range(batch):
            home = token // (batch // chips)
            rows += len({e // (experts // chips) for e in choices[layer, token]} - {home})
    assert report.link_bytes == 2 * rows * model.hidden * 2      # dispatch + combine, bf16
    assert report.chips == chips and report.ep == chips
    assert sum(report.chip(c)["link_bytes"] for c in range(chips)) == report.link_bytes


def test_skewed_routing_makes_a_longer_step_than_uniform():
    """The same tokens and the same mean load per expert, but the chips holding hot experts
    work longer, and the step waits for the slowest chip at every layer."""
    model = moe_model(8, 2, layers=4)
    fields = dict(batch=64, context=128, ep=4, steps=4, runtime="vendor")
    uniform = memsim.emulate("h100-sxm", model, **fields)
    skewed = memsim.emulate("h100-sxm", model, routing="zipf:2.0", **fields)
    assert skewed.warm_spread()["time_s"][0] > uniform.warm_spread()["time_s"][0]
    busy = skewed.warm.chip_busy_s
    assert skewed.time_per_step >= max(busy)


def test_expert_parallel_holds_a_share_of_the_experts_per_chip():
    model = memsim.model("mixtral-8x7b")
    system = plan_system(memsim.device("h100-sxm"), model, memsim.Decode(ep=4, batch=4))
    for plan in system.stages:
        experts = {t.name.split(".")[2] for t in plan.tensors if t.role == "experts"}
        assert len(experts) == 2
    with pytest.raises(memsim.ConfigError, match="divide the experts"):
        plan_system(memsim.device("h100-sxm"), model, memsim.Decode(ep=3, batch=3))
    with pytest.raises(memsim.ConfigError, match="not modelled yet"):
        plan_system(memsim.device("h100-sxm"), model, memsim.Decode(ep=2, pp=2, batch=2))


# Placement, shared experts, the CLI ------------------------------------------------------

def test_cold_experts_behind_cxl_by_routing_statistics():
    dev = memsim.device("h200").with_tier("cxl-gen5-x16")
    fields = dict(batch=4, context=256, routing="zipf:1.5", steps=4)
    report = memsim.emulate(dev, "mixtral-8x7b", placement={"experts": "cxl:0.5"}, **fields)
    held = report.holdings[0].weights
    half = 32 * 4 * 3 * 4096 * 14336 * 2
    assert held["cxl"] == half
    read_far = report.warm.weight_bytes_read["cxl"]
    read_near = sum(r.bytes_read["hbm"] for r in report.ops if r.name in EXPERT_OPS)
    assert read_far < read_near             # the cold half is chosen less often


def test_shared_experts_and_dense_layers():
    model = moe_model(32, 4, layers=3, shared_experts=1, dense_layers=1, dense_ffn=1024)
    dev = memsim.device("h100-sxm").with_overrides({"tiers.sram.capacity": "4 KiB"})
    report = memsim.emulate(dev, model, batch=1, context=32, steps=1)
    rows = report.op_rows("cold")
    assert [r.layer for r in rows if r.name == "gate"] == [0]
    assert next(r for r in rows if r.name == "gate").bytes_read["hbm"] == 256 * 1024 * 2
    shared = [r for r in rows if r.name == "shared_gate"]
    assert [r.layer for r in shared] == [1, 2] and all(r.bytes_read["hbm"] for r in shared)
    assert sum(1 for r in rows if r.name == "expert_gate" and r.bytes_read["hbm"]) == 2 * 4


def test_deepseek_style_model_runs_through_the_same_path():
    full = memsim.model("deepseek-v3-style")
    small = memsim.Model(**{**full.__dict__, "layers": 5, "name": "deepseek-5"})
    report = memsim.emulate("b200", small, batch=2, context=512, weights="fp8-e4m3", steps=1)
    touched = sum(1 for r in report.op_rows("cold") if r.name == "expert_gate" and r.misses)
    assert 8 <= touched / 2 <= 16                    # 2 tokens x top-8 of 256 per MoE layer


def test_run_and_compare_take_moe_models(capsys):
    from memsim.cli import main
    assert main(["run", "h200", "mixtral-8x7b", "--batch", "2", "--json"]) == 0
    import json
    data = json.loads(capsys.readouterr().out)
    assert data["weight_bytes_read"] < data["weights_held"]
    assert main(["compare", "mixtral-8x7b", "--devices", "h100-sxm,mi300x", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["fits"] for r in rows] == [True, True] and rows[0]["chips"] == 2


def test_expert_parallel_tables_list_each_chips_rows_once_with_a_chip_column():
    """Issue 15 item 4: per-chip op rows of an EP run, once each, labelled by chip."""
    model = moe_model(8, 2, layers=2)
    report = memsim.emulate("h100-sxm", model, batch=4, context=64, ep=4)
    lines = report.table().splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["chip", "layer"])
    rows = [line.split() for line in lines[header + 1:]]
    keys = [(row[0], row[1], row[2]) for row in rows]
    assert len(keys) == len(set(keys))
    assert {row[0] for row in rows} == {"0", "1", "2", "3"}
    assert report.to_csv().splitlines()[0].startswith("index,chip,")


def test_an_exchange_across_link_domains_moves_its_far_share_over_the_scale_out_network():
    """Rank 0 of expert group g trades rows with rank 0 of every other group (chips j x tp).
    Two tensor-parallel chips per group and eight groups on 8-GPU H100 nodes: groups 0-3 sit
    on the first node, 4-7 on the second, so three of group 0's seven peers are over NVLink and
    four over InfiniBand; the exchange lasts as long as the slower share and waits out the
    slower link's hops. A system within one node keeps the NVLink figures unchanged."""
    dev = memsim.device("h100-sxm")
    link, out = dev.link, dev.scale_out
    bandwidth, latency, energy = exchange_figures(dev, tp=2, ep=8, group=0)
    assert bandwidth == 1.0 / max(3 / 7 / link.bandwidth, 4 / 7 / out.bandwidth)
    out_hops = (out.latency_s * collective_steps(out.topology, 8) + out.collective_latency_s)
    in_hops = link.latency_s * collective_steps(link.topology, 8) + link.collective_latency_s
    assert latency == max(out_hops, in_hops)
    assert energy == (3 * link.energy_j_per_byte + 4 * out.energy_j_per_byte) / 7
    assert exchange_figures(dev, tp=2, ep=4, group=3) == (
        link.bandwidth, link.latency_s * collective_steps(link.topology, 4)
        + link.collective_latency_s, link.energy_j_per_byte)


@pytest.mark.parametrize("model, tp, ep, crosses", [
    ("mixtral-8x7b", 2, 8, True), ("mixtral-8x7b", 2, 4, False),
    ("deepseek-v3-style", 1, 16, True)])
def test_the_scale_out_network_times_an_expert_parallel_system_that_spans_it(model, tp, ep,
                                                                            crosses):
    """A slower scale-out network slows the exchanges of an expert-parallel system spanning two
    nodes, and nothing else of it (its tensor-parallel groups sit within a node); a system
    within one node is as it was."""
    fields = dict(batch=16, context=256, tp=tp, ep=ep,
                  weights="fp8-e4m3-b128" if model.startswith("deepseek") else "bf16")
    dev = memsim.device("h100-sxm")
    slow = dev.with_overrides({"scale_out.bandwidth": "5 GB/s", "scale_out.latency": "20 us"})
    base, slowed = (memsim.emulate(d, model, **fields) for d in (dev, slow))
    assert base.link_bytes == slowed.link_bytes
    exchanges = {"moe_dispatch", "moe_combine"}
    assert any(row.name in exchanges for row in base.ops)
    for a, b in zip(base.ops, slowed.ops):
        assert (b.time_s > a.time_s if crosses and a.name in exchanges
                else b.time_s == a.time_s), a.name
    assert (slowed.time_per_token > base.time_per_token) == crosses
