"""Tests of the model TOML loader (docs/model-format.md): every missing key at once, types and
limits with the limit named, sliding windows, unreadable files as one ConfigError, and the
catalog parsed once per process."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import pytest

import memsim
from memsim import ConfigError, load_model
from memsim.datafile import read_toml_text
from memsim.model import LIMITS, MAX_EXPERT_BLOCKS, MAX_PARAMS, model_names
from tests.test_loading import dump_toml


def raw(name: str) -> dict[str, Any]:
    text = (resources.files("memsim.models") / f"{name}.toml").read_text(encoding="utf-8")
    return read_toml_text(text, file=name)


def refused(tmp_path: Path, data: dict[str, Any]) -> ConfigError:
    path = tmp_path / "model.toml"
    path.write_text(dump_toml(data), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_model(path)
    assert info.value.file == str(path) and str(path) in str(info.value)
    return info.value


def loaded(tmp_path: Path, data: dict[str, Any]) -> memsim.Model:
    path = tmp_path / "model.toml"
    path.write_text(dump_toml(data), encoding="utf-8")
    return load_model(path)


# --- keys -----------------------------------------------------------------------------------

def test_every_missing_key_in_one_error(tmp_path):
    data = raw("llama-3-8b")
    for key in ("layers", "vocab", "source"):
        del data[key]
    err = refused(tmp_path, data)
    assert err.field == "layers, vocab, source"
    assert "3 of 13" in err.reason


def test_every_missing_moe_key_in_one_error(tmp_path):
    data = raw("mixtral-8x7b")
    data["moe"] = {}
    assert refused(tmp_path, data).field == "moe.experts, moe.experts_per_token"


def test_every_unknown_key_in_one_error(tmp_path):
    data = raw("llama-3-8b")
    data.update(n_layers=32, d_model=4096)
    err = refused(tmp_path, data)
    assert err.field == "n_layers, d_model" and "kv_heads" in err.reason


# --- types and limits -----------------------------------------------------------------------

@pytest.mark.parametrize(("key", "value", "words"), [
    ("layers", 10**6, "1 to 1,024"),
    ("layers", 99999999999999999999, "1 to 1,024"),
    ("layers", 0, "1 to 1,024"),
    ("layers", "32", "expected an integer"),
    ("layers", True, "expected an integer"),
    ("hidden", 2**20, "1 to 131,072"),
    ("vocab", 10**9, "1 to 4,194,304"),
    ("head_dim", 4096, "1 to 2,048"),
    ("tied_embeddings", 1, "true or false"),
    ("name", "", "non-empty string"),
    ("published_params", "-1", "negative"),
    ("schema_version", True, "expected 1"),
])
def test_type_and_range_name_the_field_and_limit(tmp_path, key, value, words):
    data = raw("llama-3-8b")
    data[key] = value
    err = refused(tmp_path, data)
    assert err.field == key and words in str(err)


@pytest.mark.parametrize(("key", "value", "words"), [
    ("experts", 10**5, "2 to 1,024"),
    ("experts", 1, "2 to 1,024"),
    ("experts_per_token", 0, "1 to 1,024"),
    ("shared_experts", 65, "0 to 64"),
    ("dense_layers", 32, "at least one MoE layer"),
])
def test_moe_limits(tmp_path, key, value, words):
    data = raw("mixtral-8x7b")
    data["moe"][key] = value
    err = refused(tmp_path, data)
    assert err.field == f"moe.{key}" and words in str(err)


def test_every_limit_is_stated_in_the_docs():
    docs = (Path(__file__).parents[1] / "docs" / "model-format.md").read_text(encoding="utf-8")
    for key, (lo, hi) in LIMITS.items():
        assert f"{hi:,}" in docs, key
    assert f"{MAX_EXPERT_BLOCKS:,}" in docs and "10^15" in docs and MAX_PARAMS == 10**15


def test_too_many_parameters(tmp_path):
    data = raw("mixtral-8x7b")                       # 8 x 1024 layers x 3 x 2^17 x 2^20
    data.update(layers=1024, hidden=131072, ffn=1_048_576)
    err = refused(tmp_path, data)
    assert "limit of 1e+15" in err.reason


def test_too_many_expert_blocks(tmp_path):
    data = raw("mixtral-8x7b")
    data.update(layers=128, hidden=64, heads=8, kv_heads=8, head_dim=8, ffn=64, vocab=64)
    data["moe"]["experts"] = 1024
    err = refused(tmp_path, data)
    assert err.field == "moe.experts" and "65,536" in err.reason


def test_catalog_models_are_within_the_limits():
    for name in model_names():
        m = memsim.model(name)
        assert m.total_params <= MAX_PARAMS
        assert m.moe_layers * (m.experts + m.shared_experts) <= MAX_EXPERT_BLOCKS


# --- sliding windows --------------------------------------------------------------------------

@pytest.mark.parametrize(("layers", "expected"), [
    ("all", tuple(range(32))), ("even", tuple(range(0, 32, 2))), ("odd", tuple(range(1, 32, 2))),
    ([5, 1], (1, 5))])
def test_sliding_window_table(tmp_path, layers, expected):
    data = raw("llama-3-8b")
    data["sliding_window"] = {"tokens": 4096, "layers": layers}
    model = loaded(tmp_path, data)
    assert (model.sliding_window, model.window_layers) == (4096, expected)
    assert model.whole_context_limit == 4096


@pytest.mark.parametrize(("window", "field"), [
    ({"tokens": 4096}, "sliding_window.layers"),
    ({"tokens": 0, "layers": "all"}, "sliding_window.tokens"),
    ({"tokens": 4096, "layers": "some"}, "sliding_window.layers"),
    ({"tokens": 4096, "layers": [32]}, "sliding_window.layers"),
    ({"tokens": 4096, "layers": [1, 1]}, "sliding_window.layers"),
    ({"tokens": 4096, "layers": 3}, "sliding_window.layers"),
    (4096, "sliding_window"),
])
def test_bad_sliding_window(tmp_path, window, field):
    data = raw("llama-3-8b")
    data["sliding_window"] = window
    assert refused(tmp_path, data).field == field


def test_no_window_by_default():
    assert all(memsim.model(n).whole_context_limit is None for n in model_names())


# --- unreadable files ---------------------------------------------------------------------------

@pytest.mark.parametrize(("raw_bytes", "words"), [
    (b"\xef\xbb\xbfschema_version = 1\n", "byte-order mark"),
    ("schema_version = 1\n".encode("utf-16"), "UTF-16"),
    (b"name = \"\xe9\"\n", "not UTF-8"),
    (b"\x7fELF\x02\x01\x01\x00\x00", "binary"),
    (b"a = " + b"[" * 5000 + b"]" * 5000, "TOML"),
    (b"layers = = 3", "malformed TOML"),
])
def test_unreadable_toml_is_one_config_error(tmp_path, raw_bytes, words):
    path = tmp_path / "model.toml"
    path.write_bytes(raw_bytes)
    with pytest.raises(ConfigError) as info:
        load_model(path)
    assert words in str(info.value) and info.value.file == str(path)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read file"):
        load_model(tmp_path / "absent.toml")


# --- the catalog, parsed once -------------------------------------------------------------------

def test_catalog_model_is_parsed_once():
    first = memsim.model("llama-3-8b")
    assert memsim.model("llama-3-8b") is first


def test_catalog_models_are_immutable():
    with pytest.raises(AttributeError):
        memsim.model("llama-3-8b").layers = 1       # type: ignore[misc]


def test_unknown_catalog_name_lists_the_catalog():
    with pytest.raises(ConfigError) as info:
        memsim.model("llama-9")
    assert "llama-3-8b" in info.value.reason


def test_model_names_cannot_be_mutated_through_the_cache():
    names = memsim.model_names()
    names.clear()
    assert memsim.model_names()


def test_catalog_round_trips_through_a_file(tmp_path):
    for name in model_names():
        assert loaded(tmp_path, raw(name)) == memsim.model(name)
