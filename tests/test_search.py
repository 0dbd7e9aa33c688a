"""memsim.search: the configurations that meet a target, ranked, with the Pareto front."""

from __future__ import annotations

import pytest

from memsim.errors import ConfigError
from memsim.inputs import device_from
from memsim.search import parse_target, search

DEVICES = ("h100-sxm", "mi300x", "tpu-v5e")


@pytest.fixture(scope="module")
def found(tmp_path_factory):
    store = tmp_path_factory.mktemp("search") / "search.sqlite"
    result = search("llama-3-8b", "ms_per_token<=15", devices=DEVICES,
                    weights=("bf16", "int4-g128"), kv=("bf16",), store=store)
    return result, store


def test_every_returned_configuration_meets_the_target(found):
    result, _ = found
    assert result.configurations and result.met == len(result.configurations)
    assert all(c.time_per_token_s * 1e3 <= 15 for c in result.configurations)
    assert result.points >= result.met and result.computed == result.points


def test_ranked_by_cost_per_million_tokens_then_chips(found):
    configs = found[0].configurations
    priced = [c.usd_per_million_tokens for c in configs if c.usd_per_million_tokens is not None]
    assert priced == sorted(priced)
    first_unpriced = next((i for i, c in enumerate(configs)
                           if c.usd_per_million_tokens is None), len(configs))
    assert all(c.usd_per_million_tokens is None for c in configs[first_unpriced:])
    for c in configs:              # the device file's price x chips over the batch's tokens/s
        price = device_from(c.device).usd_per_chip_hour
        if price is None:
            assert c.usd_per_million_tokens is None
        else:
            assert c.usd_per_million_tokens == pytest.approx(
                price * c.chips / (c.tokens_per_s_total * 3600) * 1e6)


def test_the_pareto_front_is_non_dominated_and_covers_the_rest(found):
    configs = found[0].configurations
    front = [c for c in configs if c.pareto]
    assert front

    def beats(a, b):
        return (a.time_per_token_s <= b.time_per_token_s
                and a.tokens_per_s_per_chip >= b.tokens_per_s_per_chip
                and (a.time_per_token_s < b.time_per_token_s
                     or a.tokens_per_s_per_chip > b.tokens_per_s_per_chip))
    for c in front:
        assert not any(beats(o, c) for o in configs)
    for c in configs:
        if not c.pareto:
            assert any(beats(o, c) for o in front)


def test_a_rerun_with_the_same_store_evaluates_nothing_new(found):
    result, store = found
    again = search("llama-3-8b", "ms_per_token<=15", devices=DEVICES,
                   weights=("bf16", "int4-g128"), kv=("bf16",), store=store)
    assert again.computed == 0 and again.points == result.points
    assert again.configurations == result.configurations


def test_an_impossible_target_returns_none_with_one_line(tmp_path):
    result = search("llama-3-8b", "ms_per_token<=0.001", devices=("h100-sxm",),
                    weights=("int4-g128",), kv=("bf16",), store=tmp_path / "s.sqlite")
    assert result.configurations == () and result.computed == 0
    assert "no configuration meets ms_per_token<=0.001" in result.explanation
    assert "\n" not in result.explanation
    missed = search("llama-3-8b", "tokens_per_s>=400", devices=("h100-sxm",),
                    weights=("bf16",), kv=("bf16",), store=tmp_path / "s.sqlite")
    assert missed.configurations == () and "the closest" in missed.explanation


def test_targets_combine_and_bad_ones_are_one_clear_error():
    both = parse_target("ms_per_token<=20, tokens_per_s_total>=500")
    assert [(t.metric, t.op, t.value) for t in both] == [
        ("ms_per_token", "<=", 20.0), ("tokens_per_s_total", ">=", 500.0)]
    for bad in ("ms_per_token>=20", "latency<=3", "ms_per_token<=-1", "ms_per_token<=x", ""):
        with pytest.raises(ConfigError, match="--target"):
            parse_target(bad)


def test_to_dict_is_plain_data(found):
    import json
    data = found[0].to_dict()
    assert json.loads(json.dumps(data))["met"] == found[0].met
    assert {"device", "tp", "pp", "chips", "pareto", "usd_per_million_tokens"} <= set(
        data["configurations"][0])


def test_the_bound_prunes_only_points_that_miss(monkeypatch, tmp_path):
    import memsim.search as module
    kwargs = dict(devices=("h100-sxm", "groq-lpu"), weights=("bf16", "int4-g128"),
                  kv=("bf16",))
    pruned = search("llama-3-8b", "ms_per_token<=4", store=tmp_path / "a.sqlite", **kwargs)
    monkeypatch.setattr(module, "BOUND_SAFETY", 0.0)
    every = search("llama-3-8b", "ms_per_token<=4", store=tmp_path / "b.sqlite", **kwargs)
    assert pruned.pruned > 0 and every.pruned == 0
    assert pruned.configurations == every.configurations
