"""Tests of reading HuggingFace config.json files: the two published fixtures load, emulate and
match their published parameter counts; every supported architecture maps its fields; anything
memsim cannot model is refused with one ConfigError naming file and field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import memsim
from memsim import ConfigError, load_model
from memsim.hf_config import ARCHITECTURES, parse_hf_config
from memsim.testing import examples, strategies

FIXTURES = Path(__file__).parent / "fixtures"
QWEN = FIXTURES / "Qwen2.5-7B-Instruct" / "config.json"
MIXTRAL = FIXTURES / "Mixtral-8x7B-v0.1" / "config.json"
DEEPSEEK_V3 = FIXTURES / "DeepSeek-V3" / "config.json"
DEEPSEEK_V2_LITE = FIXTURES / "DeepSeek-V2-Lite" / "config.json"
SHAPE = ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab", "tied_embeddings",
         "experts", "experts_per_token", "shared_experts", "dense_layers", "dense_ffn")


def shape(model: memsim.Model) -> dict[str, Any]:
    return {key: getattr(model, key) for key in SHAPE}


def write(tmp_path: Path, data: Any, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def refused(tmp_path: Path, data: Any) -> ConfigError:
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        load_model(path)
    assert info.value.file == str(path)
    return info.value


# --- the published fixtures -------------------------------------------------------------------

@pytest.mark.parametrize(("path", "published"), [
    (QWEN, 7.61e9), (MIXTRAL, 46.7e9), (DEEPSEEK_V3, 671e9), (DEEPSEEK_V2_LITE, 15.7e9)])
def test_published_configs_match_published_parameter_counts(path, published):
    model = load_model(path)
    assert abs(model.total_params / published - 1) < 0.01


def test_qwen_fixture_fields():
    model = load_model(QWEN)
    assert shape(model) == dict(layers=28, hidden=3584, heads=28, kv_heads=4, head_dim=128,
                                ffn=18944, vocab=152064, tied_embeddings=False, experts=1,
                                experts_per_token=1, shared_experts=0, dense_layers=0,
                                dense_ffn=0)
    assert model.display_name == "Qwen2.5-7B-Instruct" and model.name == str(QWEN)
    assert model.whole_context_limit is None          # use_sliding_window is false
    assert "biases" in model.source


def test_mixtral_fixture_is_the_catalog_mixtral():
    model = load_model(MIXTRAL)
    assert shape(model) == shape(memsim.model("mixtral-8x7b"))
    assert abs(model.active_params / 12.9e9 - 1) < 0.01


@pytest.mark.parametrize(("path", "weights", "bytes_per_weight"), [
    (QWEN, "bf16", 2), (MIXTRAL, "fp8-e4m3", 1)])      # Mixtral in bf16 needs 93 GB: two H100s
def test_published_configs_emulate(path, weights, bytes_per_weight):
    model = load_model(path)
    report = memsim.emulate("h100-sxm", model, batch=1, context=512, weights=weights)
    assert report.time_per_token > 0
    # a step streams every weight a token uses once, but only one row of the embedding
    streamed = model.active_params - model.vocab * model.hidden
    assert report.bytes_read["hbm"] >= bytes_per_weight * streamed


def test_catalog_lookup_takes_config_paths_and_folders():
    assert memsim.model(str(QWEN)) == load_model(QWEN)
    assert shape(memsim.model(str(MIXTRAL.parent))) == shape(load_model(MIXTRAL))


def test_cli_runs_a_config_json(capsys):
    from memsim.cli import main
    assert main(["run", "h100-sxm", str(QWEN), "--context", "512", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)


# --- every supported architecture -------------------------------------------------------------

def base(model_type: str, **extra: Any) -> dict[str, Any]:
    data = {"model_type": model_type, "num_hidden_layers": 4, "hidden_size": 256,
            "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 1000,
            "intermediate_size": 512}
    data.update(extra)
    return {k: v for k, v in data.items() if v is not ...}


DENSE = dict(layers=4, hidden=256, heads=8, kv_heads=2, head_dim=32, ffn=512, vocab=1000,
             tied_embeddings=False, experts=1, experts_per_token=1, shared_experts=0,
             dense_layers=0, dense_ffn=0)

CASES = {
    "llama": (base("llama"), DENSE, None),
    "mistral": (base("mistral", sliding_window=64), DENSE, (64, (0, 1, 2, 3))),
    "mixtral": (base("mixtral", num_local_experts=8, num_experts_per_tok=2, sliding_window=None),
                {**DENSE, "experts": 8, "experts_per_token": 2}, None),
    "qwen2": (base("qwen2", tie_word_embeddings=True, sliding_window=131072,
                   use_sliding_window=False), {**DENSE, "tied_embeddings": True}, None),
    "qwen3": (base("qwen3", head_dim=...), {**DENSE, "head_dim": 128}, None),
    "qwen2_moe": (base("qwen2_moe", moe_intermediate_size=64, num_experts=16,
                       num_experts_per_tok=4, shared_expert_intermediate_size=256),
                  {**DENSE, "ffn": 64, "experts": 16, "experts_per_token": 4,
                   "shared_experts": 4}, None),
    "qwen3_moe": (base("qwen3_moe", head_dim=64, moe_intermediate_size=96, num_experts=32,
                       num_experts_per_tok=8, mlp_only_layers=[0]),
                  {**DENSE, "head_dim": 64, "ffn": 96, "experts": 32, "experts_per_token": 8,
                   "dense_layers": 1, "dense_ffn": 512}, None),
    "gemma": (base("gemma", num_key_value_heads=1), {**DENSE, "kv_heads": 1, "head_dim": 256,
                                                     "tied_embeddings": True}, None),
    "gemma2": (base("gemma2", head_dim=16, sliding_window=128),
               {**DENSE, "head_dim": 16, "tied_embeddings": True}, (128, (0, 2))),
    "phi3": (base("phi3", num_key_value_heads=..., sliding_window=2047),
             {**DENSE, "kv_heads": 8}, (2047, (0, 1, 2, 3))),
    "deepseek_v2": (base("deepseek_v2", moe_intermediate_size=32, n_routed_experts=16,
                         n_shared_experts=2, num_experts_per_tok=6, first_k_dense_replace=1,
                         kv_lora_rank=64, qk_rope_head_dim=16, q_lora_rank=None,
                         qk_nope_head_dim=32, v_head_dim=32),
                    {**DENSE, "kv_heads": 1, "head_dim": 80, "ffn": 32, "experts": 16,
                     "experts_per_token": 6, "shared_experts": 2, "dense_layers": 1,
                     "dense_ffn": 512}, None),
    "deepseek_v3": (base("deepseek_v3", moe_intermediate_size=32, n_routed_experts=8,
                         n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=0,
                         kv_lora_rank=56, qk_rope_head_dim=8, q_lora_rank=48,
                         qk_nope_head_dim=16, v_head_dim=16),
                    {**DENSE, "kv_heads": 1, "head_dim": 64, "ffn": 32, "experts": 8,
                     "experts_per_token": 2, "shared_experts": 1}, None),
}


def test_every_supported_architecture_has_a_case():
    assert set(CASES) == set(ARCHITECTURES)


@pytest.mark.parametrize("model_type", sorted(CASES))
def test_architecture_fields(model_type, tmp_path):
    data, expected, window = CASES[model_type]
    model = load_model(write(tmp_path, data))
    assert shape(model) == expected
    assert (model.sliding_window, model.window_layers) == (window or (0, ()))
    assert model.whole_context_limit == (window[0] if window else None)
    assert model_type in model.source


@pytest.mark.parametrize("model_type", sorted(CASES))
def test_architecture_from_class_name_alone(model_type, tmp_path):
    data = dict(CASES[model_type][0])
    del data["model_type"]
    data["architectures"] = list(ARCHITECTURES[model_type].classes)
    assert shape(load_model(write(tmp_path, data))) == CASES[model_type][1]


def test_small_models_emulate(tmp_path):
    for model_type in ("gemma2", "qwen2_moe", "deepseek_v3"):
        model = load_model(write(tmp_path, CASES[model_type][0], f"{model_type}.json"))
        assert memsim.emulate("h100-sxm", model, batch=1, context=32).time_per_token > 0


MLA_FIELDS = ("attention", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim",
              "qk_nope_head_dim", "v_head_dim")


def test_deepseek_v3_config_is_the_catalog_model():
    """deepseek-ai/DeepSeek-V3's config.json (tests/fixtures/DeepSeek-V3, transcribed from
    huggingface.co/deepseek-ai/DeepSeek-V3) loads as multi-head latent attention, the catalog's
    deepseek-v3-style."""
    model = load_model(DEEPSEEK_V3)
    catalog = memsim.model("deepseek-v3-style")
    assert shape(model) == shape(catalog)
    assert [getattr(model, f) for f in MLA_FIELDS] == [getattr(catalog, f) for f in MLA_FIELDS]
    assert model.is_mla and (model.kv_heads, model.head_dim) == (1, 576)
    assert model.kv_elements_per_token() == 61 * (512 + 64)
    assert "quantization_config (fp8) not read" in model.source
    data = json.loads(DEEPSEEK_V3.read_text(encoding="utf-8"))
    kimi = dict(data, model_type="kimi_k2", n_routed_experts=384)   # K2 reuses the V3 class
    assert parse_hf_config(kimi, file="k2/config.json", name="k2").experts == 384


def test_deepseek_v2_lite_has_no_query_compression():
    """q_lora_rank null (DeepSeek-V2-Lite): one q_proj; 15.7 B parameters (model card of
    huggingface.co/deepseek-ai/DeepSeek-V2-Lite)."""
    model = load_model(DEEPSEEK_V2_LITE)
    assert model.is_mla and model.q_lora_rank == 0
    assert "q_proj" in model.mla_params_per_layer and "q_a_proj" not in model.mla_params_per_layer
    assert abs(model.total_params / 15.7e9 - 1) < 0.01


def test_layer_types_choose_the_windowed_layers(tmp_path):
    types = ["sliding_attention", "full_attention", "full_attention", "sliding_attention"]
    model = load_model(write(tmp_path, base("gemma2", sliding_window=64, layer_types=types)))
    assert model.window_layers == (0, 3) and model.sliding_window == 64


@pytest.mark.parametrize("types", [[[1], [1], [1], [1]], [{}, 1, None, "x"], "sliding"])
def test_layer_types_that_are_not_names_are_one_error(tmp_path, types):
    """A list of lists ended in a TypeError traceback (unhashable type: 'list')."""
    with pytest.raises(ConfigError) as info:
        load_model(write(tmp_path, base("gemma2", sliding_window=64, layer_types=types)))
    assert info.value.field == "layer_types"


@pytest.mark.parametrize("window", [0, -4, 4.5, "4096", True])
def test_a_sliding_window_that_is_no_token_count_is_named(tmp_path, window):
    """0 was reported as 'layer_types: window_layers given without a sliding_window' for a
    file with no layer_types."""
    with pytest.raises(ConfigError) as info:
        load_model(write(tmp_path, base("mistral", sliding_window=window)))
    assert info.value.field == "sliding_window"


def test_class_defaults_fill_omitted_fields(tmp_path):
    """config.json omits values equal to the transformers class default."""
    gemma2 = load_model(write(tmp_path, base("gemma2", head_dim=16)))
    assert gemma2.sliding_window == 4096 and gemma2.window_layers == (0, 2)
    assert gemma2.tied_embeddings
    mistral = load_model(write(tmp_path, base("mistral")))
    assert mistral.sliding_window == 4096


@given(strategies.models(experts=st.just(1)))
@settings(max_examples=examples(25))
def test_llama_config_round_trip(model):
    data = {"model_type": "llama", "num_hidden_layers": model.layers,
            "hidden_size": model.hidden, "num_attention_heads": model.heads,
            "num_key_value_heads": model.kv_heads, "head_dim": model.head_dim,
            "intermediate_size": model.ffn, "vocab_size": model.vocab,
            "tie_word_embeddings": model.tied_embeddings}
    assert shape(parse_hf_config(data, file="c.json", name="c")) == shape(model)


# --- refusals -----------------------------------------------------------------------------------

def test_unknown_architecture_lists_the_supported_ones(tmp_path):
    err = refused(tmp_path, {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
                             "n_layer": 12})
    assert err.field == "model_type"
    for arch in ARCHITECTURES.values():
        assert arch.model_type in err.reason and arch.classes[0] in err.reason
    for needed in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                   "num_key_value_heads", "vocab_size", "intermediate_size"):
        assert needed in err.reason


def test_config_without_model_type_or_architectures(tmp_path):
    assert refused(tmp_path, {"hidden_size": 4096}).field == "model_type"


def test_all_missing_mla_fields_at_once(tmp_path):
    """q_lora_rank may be null (no query compression) but not absent."""
    data = json.loads(DEEPSEEK_V3.read_text(encoding="utf-8"))
    for key in ("q_lora_rank", "v_head_dim", "n_routed_experts"):
        del data[key]
    assert refused(tmp_path, data).field == "n_routed_experts, q_lora_rank, v_head_dim"


def test_all_missing_fields_at_once(tmp_path):
    data = CASES["mixtral"][0]
    for key in ("num_hidden_layers", "vocab_size", "num_local_experts"):
        del data[key]
    err = refused(tmp_path, data)
    assert err.field == "num_hidden_layers, vocab_size, num_local_experts"


@pytest.mark.parametrize(("extra", "field", "words"), [
    ({"num_hidden_layers": 10**6}, "num_hidden_layers", "1 to 1,024"),
    ({"num_hidden_layers": 99999999999999999999}, "num_hidden_layers", "1 to 1,024"),
    ({"hidden_size": "4096"}, "hidden_size", "expected an integer"),
    ({"hidden_size": 4096.0}, "hidden_size", "expected an integer"),
    ({"num_key_value_heads": 3}, "num_key_value_heads", "multiple"),
    ({"num_key_value_heads": 0}, "num_key_value_heads", "1 to 1,024"),
    ({"tie_word_embeddings": "no"}, "tie_word_embeddings", "true or false"),
    ({"hidden_size": 250, "num_attention_heads": 8}, "head_dim", "multiple"),
])
def test_bad_values_name_the_hf_field(tmp_path, extra, field, words):
    err = refused(tmp_path, base("llama", **extra))
    assert err.field == field and words in err.reason


@pytest.mark.parametrize(("model_type", "extra", "field"), [
    ("mixtral", {"num_local_experts": 10**5, "num_experts_per_tok": 2}, "num_local_experts"),
    ("mixtral", {"num_local_experts": 8, "num_experts_per_tok": 9}, "num_experts_per_tok"),
    ("mixtral", {"num_local_experts": 1, "num_experts_per_tok": 1}, "num_local_experts"),
    ("qwen2_moe", {"moe_intermediate_size": 64, "num_experts": 8, "num_experts_per_tok": 2,
                   "shared_expert_intermediate_size": 100}, "shared_expert_intermediate_size"),
    ("qwen2_moe", {"moe_intermediate_size": 64, "num_experts": 8, "num_experts_per_tok": 2,
                   "decoder_sparse_step": 2}, "decoder_sparse_step"),
    ("qwen3_moe", {"moe_intermediate_size": 64, "num_experts": 8, "num_experts_per_tok": 2,
                   "mlp_only_layers": [2]}, "mlp_only_layers"),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 4096}, "use_sliding_window"),
    ("deepseek_v3", {"moe_intermediate_size": 32, "n_routed_experts": 8,
                     "num_experts_per_tok": 2, "kv_lora_rank": 64, "qk_rope_head_dim": 16,
                     "q_lora_rank": None, "qk_nope_head_dim": 16, "v_head_dim": 16,
                     "moe_layer_freq": 2}, "moe_layer_freq"),
    ("deepseek_v3", {"moe_intermediate_size": 32, "n_routed_experts": 8,
                     "num_experts_per_tok": 2, "kv_lora_rank": 0, "qk_rope_head_dim": 16,
                     "q_lora_rank": None, "qk_nope_head_dim": 16, "v_head_dim": 16},
     "kv_lora_rank"),
    ("deepseek_v3", {"moe_intermediate_size": 32, "n_routed_experts": 8,
                     "num_experts_per_tok": 2, "kv_lora_rank": 64, "qk_rope_head_dim": 16,
                     "q_lora_rank": 1.5, "qk_nope_head_dim": 16, "v_head_dim": 16},
     "q_lora_rank"),
    ("gemma2", {"sliding_window": 64, "layer_types": ["linear_attention"] * 4}, "layer_types"),
    ("gemma2", {"sliding_window": 64, "layer_types": ["full_attention"] * 3}, "layer_types"),
    ("mistral", {"sliding_window": 2**40}, "sliding_window"),
])
def test_shapes_memsim_cannot_model_are_refused(tmp_path, model_type, extra, field):
    assert refused(tmp_path, base(model_type, **extra)).field == field


@pytest.mark.parametrize(("raw", "words"), [
    (b"{\"model_type\": ", "malformed JSON"),
    (b"[1, 2]", "expected a JSON object"),
    (b"{\"hidden_size\": NaN}", "not a JSON number"),
    (b"\xef\xbb\xbf{}", "byte-order mark"),
    ("{}".encode("utf-16"), "UTF-16"),
    (b"{\"a\": \"\xff\"}", "not UTF-8"),
    (b"{\x00}", "binary"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
])
def test_unreadable_json_is_one_config_error(tmp_path, raw, words):
    path = tmp_path / "config.json"
    path.write_bytes(raw)
    with pytest.raises(ConfigError) as info:
        load_model(path)
    assert words in info.value.reason and info.value.file == str(path)


def test_a_large_file_is_refused_before_reading(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"{" + b" " * (2 << 20))
    with pytest.raises(ConfigError, match="larger than 1024 KiB"):
        load_model(path)


def test_a_folder_without_config_json(tmp_path):
    with pytest.raises(ConfigError, match="without a config.json"):
        load_model(tmp_path)
