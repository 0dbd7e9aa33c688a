"""Tests of memsim.checkpoints: weight formats per tensor, as checkpoints store them.

llama.cpp's rules are written out again here from src/llama-quant.cpp (commit 007dbbf), not read
back from memsim, and whole-model bytes are checked against llama.cpp's own report of the Llama
3.1 8B Q4_K_M file. :func:`checkpoint_role_bytes` is the per-role closed form for plan tests.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import memsim
from memsim import ConfigError, Model, bytes_for, get_format, model
from memsim.checkpoints import (MIXTURES, NORM_ROLES, ROLE_GROUPS, ROLES, WeightFormats,
                                usual_activations, weight_formats)
from memsim.formats import FORMATS
from memsim.testing import examples

# --- helpers the plan tests may reuse ---------------------------------------------------------


def model_tensors(m: Model) -> list[tuple[str, int, tuple[int, int]]]:
    """Every weight matrix of an unsharded model as ``(role, layer, (rows, k))``, norms left out:
    q, k and v separately, experts by part."""
    h, hd = m.hidden, m.head_dim
    out = [("embedding", -1, (m.vocab, h))]
    for layer in range(m.layers):
        out += [("q", layer, (m.heads * hd, h)), ("k", layer, (m.kv_heads * hd, h)),
                ("v", layer, (m.kv_heads * hd, h)), ("o_proj", layer, (h, m.heads * hd))]
        if m.is_moe_layer(layer):
            out.append(("router", layer, (m.experts, h)))
            for prefix, count in (("expert", m.experts), ("shared", m.shared_experts)):
                for _ in range(count):
                    out += [(f"{prefix}_gate", layer, (m.ffn, h)),
                            (f"{prefix}_up", layer, (m.ffn, h)),
                            (f"{prefix}_down", layer, (h, m.ffn))]
        else:
            width = m.dense_ffn if m.is_moe else m.ffn
            out += [("gate", layer, (width, h)), ("up", layer, (width, h)),
                    ("down", layer, (h, width))]
    if not m.tied_embeddings:
        out.append(("lm_head", -1, (m.vocab, h)))
    return out


def checkpoint_role_bytes(m: Model, weights: object) -> dict[str, int]:
    """Bytes of every weight role of an unsharded checkpoint of ``m`` (norms excluded; a tied
    table counted once, under ``embedding``), each tensor rounded up to whole bytes."""
    wf = weight_formats(weights)
    n_experts = m.experts if m.is_moe else 0
    out: dict[str, int] = {}
    for role, layer, shape in model_tensors(m):
        fmt = wf.for_tensor(role, layer, m.layers, n_experts=n_experts, tied=m.tied_embeddings,
                            k=shape[1])
        out[role] = out.get(role, 0) + bytes_for(shape, fmt)
    return out


# --- llama.cpp's rules, written out independently ---------------------------------------------

def more_bits(i: int, n: int) -> bool:
    # llama-quant.cpp: i_layer < n_layers/8 || i_layer >= 7*n_layers/8
    #                  || (i_layer - n_layers/8)%3 == 2
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


# use_more_bits for 32 layers, listed by hand: 0-3, 28-31, and 4 + 2 + 3j
MORE_BITS_32 = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31}


def test_use_more_bits_for_32_layers_by_hand():
    assert {i for i in range(32) if more_bits(i, 32)} == MORE_BITS_32
    assert len(MORE_BITS_32) == 16


@pytest.mark.parametrize(("mixture", "base"), [("q4_k_m", "q4_k"), ("q5_k_m", "q5_k")])
def test_k_m_mixture_per_layer_for_32_layers(mixture, base):
    wf = weight_formats(mixture)
    for layer in range(32):
        bumped = "q6_k" if layer in MORE_BITS_32 else base
        got = {role: wf.for_tensor(role, layer, 32).name
               for role in ("q", "k", "v", "o_proj", "gate", "up", "down")}
        assert got == {"q": base, "k": base, "v": bumped, "o_proj": base, "gate": base,
                       "up": base, "down": bumped}, layer
        assert wf.qkv_split(layer, 32) == (layer in MORE_BITS_32)
    assert wf.for_tensor("lm_head", -1, 32).name == "q6_k"
    assert wf.for_tensor("embedding", -1, 32).name == base          # untied token_embd
    assert wf.for_tensor("embedding", -1, 32, tied=True).name == "q6_k"
    assert wf.for_tensor("router", 0, 32).name == "fp32"             # ffn_gate_inp stays F32


@pytest.mark.parametrize("n_layers", [1, 2, 7, 16, 22, 40, 61, 80, 126])
def test_k_m_mixture_matches_the_rule_for_any_depth(n_layers):
    wf = weight_formats("q4_k_m")
    for layer in range(n_layers):
        expected = "q6_k" if more_bits(layer, n_layers) else "q4_k"
        for role in ("v", "down", "expert_down", "shared_down"):
            assert wf.for_tensor(role, layer, n_layers).name == expected


def test_mixtral_eight_expert_rules():
    for mixture, o_proj in (("q4_k_m", "q5_k"), ("q5_k_m", "q5_k"), ("q4_k_s", "q5_k")):
        wf = weight_formats(mixture)
        base = MIXTURES[mixture]
        for layer in range(32):
            assert wf.for_tensor("v", layer, 32, n_experts=8).name == "q8_0"
            assert wf.for_tensor("k", layer, 32, n_experts=8).name == "q8_0"
            assert wf.for_tensor("q", layer, 32, n_experts=8).name == base
            expected_o = o_proj if mixture != "q5_k_m" else base
            assert wf.for_tensor("o_proj", layer, 32, n_experts=8).name == expected_o
            assert wf.for_tensor("expert_gate", layer, 32, n_experts=8).name == base
    # without 8 experts, none of it
    assert weight_formats("q4_k_m").for_tensor("k", 5, 32, n_experts=64).name == "q4_k"


@pytest.mark.parametrize("ftype", ["q4_0", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "q8_0"])
def test_an_eight_expert_models_k_and_v_are_q8_0_in_a_file_of_any_type(ftype):
    """llama.cpp's llama_tensor_get_type bumps attn_k and attn_v of an 8-expert model to Q8_0
    for every quantized file type, not only the K-quant mixtures ("for the 8-expert model,
    bumping this to Q8_0 trades just ~128MB"); attn_output's Q5_K is the mixtures' alone."""
    wf = weight_formats(ftype)
    for layer in (0, 13, 31):
        assert wf.for_tensor("k", layer, 32, n_experts=8).name == "q8_0"
        assert wf.for_tensor("v", layer, 32, n_experts=8).name == "q8_0"
        assert wf.for_tensor("q", layer, 32, n_experts=8).name == ftype
        assert wf.for_tensor("o_proj", layer, 32, n_experts=8).name == ftype
    assert wf.for_tensor("v", 5, 32, n_experts=0).name == ftype


def test_q4_k_s_rules():
    wf = weight_formats("q4_k_s")
    assert [wf.for_tensor("v", i, 32).name for i in range(6)] == ["q5_k"] * 4 + ["q4_k"] * 2
    assert [wf.for_tensor("down", i, 32).name for i in range(6)] == ["q5_k"] * 4 + ["q4_k"] * 2
    assert wf.for_tensor("lm_head", -1, 32).name == "q6_k"


def test_row_length_fallback():
    wf = weight_formats("q4_k_m")
    # 896 (Qwen2.5 0.5B hidden) is 3.5 super-blocks: Q4_K -> Q5_0, Q6_K -> Q8_0, output Q8_0
    assert wf.for_tensor("up", 5, 24, k=896).name == "q5_0"
    assert wf.for_tensor("down", 0, 24, k=896).name == "q8_0"
    assert wf.for_tensor("lm_head", -1, 24, k=896).name == "q8_0"
    assert weight_formats("q5_k_m").for_tensor("up", 5, 24, k=896).name == "q5_1"
    assert wf.for_tensor("up", 5, 24, k=100).name == "fp16"      # not even 32 divides it
    assert wf.for_tensor("up", 5, 24, k=4096).name == "q4_k"
    # a Q4_0 file's output: Q6_K when 256 divides the row, else fallback Q8_0
    assert weight_formats("q4_0").for_tensor("lm_head", -1, 16, k=4096).name == "q6_k"
    assert weight_formats("q4_0").for_tensor("lm_head", -1, 16, k=4064).name == "q8_0"
    # an explicit choice and non-llama.cpp formats are kept as given
    assert weight_formats("q4_k_m,up=q4_k").for_tensor("up", 5, 24, k=896).name == "q4_k"
    assert weight_formats("int4-g128").for_tensor("up", 5, 24, k=896).name == "int4-g128"


# --- defaults per format ----------------------------------------------------------------------

SIXTEEN_BIT_ENDS = ["int4-g32", "int4-g64", "int4-g128", "int4-g100", "int8", "fp8-e4m3",
                    "fp8-e5m2", "fp8-e4m3-b128", "mxfp8", "nvfp4", "mxfp4"]
LINEAR = ("q", "k", "v", "o_proj", "gate", "up", "down", "expert_gate", "expert_up",
          "expert_down", "shared_gate", "shared_up", "shared_down")


@pytest.mark.parametrize("name", SIXTEEN_BIT_ENDS)
def test_quantized_checkpoints_keep_embedding_head_router_in_16_bits(name):
    wf = weight_formats(name)
    assert wf.name == name
    for role in ("embedding", "lm_head", "router", "draft_head"):
        assert wf.for_tensor(role, -1 if role != "router" else 3, 32).name == "bf16"
    for role in LINEAR:
        assert wf.for_tensor(role, 3, 32).name == name
    assert wf.for_tensor("qkv", 3, 32).name == name
    assert not wf.qkv_split(3, 32)


@pytest.mark.parametrize("name", ["bf16", "fp16", "fp32"])
def test_16_and_32_bit_checkpoints_are_uniform(name):
    wf = weight_formats(name)
    for role in ROLES:
        assert wf.for_tensor(role, 0, 4).name == name


@pytest.mark.parametrize(("name", "embedding", "head"), [
    ("q4_0", "q4_0", "q6_k"), ("q5_0", "q5_0", "q6_k"), ("q5_1", "q5_1", "q6_k"),
    ("q8_0", "q8_0", "q8_0"),               # llama.cpp leaves a Q8_0 file's output at Q8_0
    ("q4_k", "q4_k", "q6_k"), ("q5_k", "q5_k", "q6_k"), ("q6_k", "q6_k", "q6_k"),
])
def test_llama_cpp_files(name, embedding, head):
    wf = weight_formats(name)
    assert wf.for_tensor("embedding", -1, 32).name == embedding
    assert wf.for_tensor("lm_head", -1, 32).name == head
    assert wf.for_tensor("embedding", -1, 32, tied=True).name == head   # one table: output's
    assert wf.for_tensor("router", 0, 32).name == "fp32"
    for role in LINEAR:
        assert wf.for_tensor(role, 7, 32).name == name


def test_uniform_and_explicit_overrides():
    uniform = weight_formats("uniform:int4-g128")
    assert all(uniform.for_tensor(role, 0, 2).name == "int4-g128" for role in ROLES)
    spelled = weight_formats("int4-g128,embedding=int4-g128,lm_head=int4-g128,router=int4-g128,"
                             "draft_head=int4-g128")
    assert all(spelled.for_tensor(role, 0, 2) == uniform.for_tensor(role, 0, 2) for role in ROLES)
    wf = weight_formats("q4_k_m,lm_head=bf16,qkv=q8_0")
    assert wf.for_tensor("lm_head", -1, 32).name == "bf16"
    assert wf.for_tensor("qkv", 0, 32).name == "q8_0"
    assert wf.for_tensor("down", 0, 32).name == "q6_k"
    assert not wf.qkv_split(0, 32)


def test_norms_stay_in_the_activation_type():
    for wf in (weight_formats("q4_k_m"), weight_formats("uniform:nvfp4")):
        for role in NORM_ROLES:
            assert wf.for_tensor(role, 0, 8) is None


def test_fused_group_answers_only_when_its_parts_agree():
    wf = weight_formats("int4-g128,expert_down=q8_0")
    with pytest.raises(ValueError, match="expert_down=q8_0"):
        wf.for_tensor("experts", 0, 8)
    assert wf.for_tensor("shared_experts", 0, 8).name == "int4-g128"
    with pytest.raises(ValueError, match="qkv"):
        weight_formats("q5_k_m").for_tensor("qkv", 0, 32)


def test_tied_table_takes_one_format():
    assert weight_formats("int4-g128").for_tensor("lm_head", -1, 16, tied=True).name == "bf16"
    wf = weight_formats("int4-g128,embedding=int4-g128")
    assert wf.for_tensor("lm_head", -1, 16, tied=True).name == "int4-g128"
    assert wf.for_tensor("lm_head", -1, 16, tied=False).name == "bf16"
    both = weight_formats("int4-g128,embedding=fp16,lm_head=fp8-e4m3")
    with pytest.raises(ConfigError) as info:
        both.for_tensor("embedding", -1, 16, tied=True)
    assert info.value.field == "weights"
    assert both.for_tensor("embedding", -1, 16).name == "fp16"      # untied: each its own


def test_unknown_role_in_a_query():
    with pytest.raises(ConfigError) as info:
        weight_formats("bf16").for_tensor("qkv_proj", 0, 2)
    assert info.value.field == "role"


# --- parsing ----------------------------------------------------------------------------------

def test_string_and_mapping_spellings_agree():
    by_string = weight_formats("int4-g128,embedding=bf16,lm_head=bf16")
    by_mapping = weight_formats({"default": "int4-g128", "embed": "bf16", "lm_head": "bf16"})
    assert by_string == by_mapping
    assert hash(by_string) == hash(by_mapping)
    assert weight_formats(by_string) is by_string
    assert weight_formats(get_format("q4_0")) == weight_formats("q4_0")
    assert by_string.name == by_string.to_spec() == str(by_string) \
        == "int4-g128,embedding=bf16,lm_head=bf16"
    assert weight_formats({"default": "uniform:q6_k"}).name == "uniform:q6_k"


def test_a_part_given_beside_its_group_wins():
    wf = weight_formats("int4-g128,expert_down=q8_0,experts=fp8-e4m3")
    assert wf.for_tensor("expert_gate", 0, 4).name == "fp8-e4m3"
    assert wf.for_tensor("expert_down", 0, 4).name == "q8_0"


BASES = sorted(FORMATS) + sorted(MIXTURES)
KEYS = ROLES + tuple(ROLE_GROUPS) + ("embed",)


@st.composite
def specs(draw):
    base = draw(st.sampled_from(BASES) | st.integers(8, 4096).map(lambda n: f"int4-g{n}"))
    if base not in MIXTURES and draw(st.booleans()):
        base = "uniform:" + base
    keys = draw(st.lists(st.sampled_from(KEYS),
                         unique_by=lambda k: {"embed": "embedding"}.get(k, k), max_size=6))
    values = draw(st.lists(st.sampled_from(sorted(FORMATS)), min_size=len(keys),
                           max_size=len(keys)))
    return base, dict(zip(keys, values))


@settings(max_examples=examples(200))
@given(spec=specs())
def test_round_trip(spec):
    base, overrides = spec
    text = ",".join([base] + [f"{k}={v}" for k, v in overrides.items()])
    wf = weight_formats(text)
    assert weight_formats(wf.to_spec()) == wf
    assert weight_formats(wf.name).name == wf.name
    assert weight_formats({"default": base, **overrides}) == wf
    # the canonical name does not depend on the order the overrides were written in
    reordered = ",".join([base] + [f"{k}={v}" for k, v in reversed(overrides.items())])
    assert weight_formats(reordered).name == wf.name
    for role in ROLES:
        fmt = wf.for_tensor(role, 1, 4)
        assert fmt is not None and fmt.name in FORMATS or fmt.name.startswith("int4-g")


@pytest.mark.parametrize(("spec", "field", "words"), [
    ("int4-g99999999999999999999", "weights", ["2**20"]),
    ("int4-g128,lm_head", "weights", ["role=format"]),
    ("int4-g128,=bf16", "weights", ["role=format"]),
    ("int4-g128,", "weights", ["role=format"]),
    ("int4-g128,lm_head=bf17", "weights.lm_head", ["'bf17'"]),
    ("int4-g128,lm_head=q4_k_m", "weights.lm_head", ["'q4_k_m'"]),
    ("int4-g128,embed=bf16,embedding=fp16", "weights.embedding", ["twice"]),
    ("int4-g128,attn_norm=bf16", "weights", ["activation type"]),
    ("int4-g128,qkv_proj=bf16", "weights", ["'qkv_proj'", "lm_head"]),
    ("uniform:q4_k_m", "weights", ["mixture"]),
    ("q4_k_x", "weights", ["q4_k_m"]),
    ("", "weights", ["unknown format"]),
    ({"embed": "bf16"}, "weights", ["'default'"]),
    ({"default": "int4-g128,lm_head=bf16"}, "weights.default", ["one format"]),
    ({"default": "int4-g128", "lm_head": 16}, "weights.lm_head", ["16"]),
    ({"default": 4}, "weights", ["int4-g128"]),
    (5, "weights", ["mapping"]),
    (None, "weights", ["mapping"]),
])
def test_errors_name_the_field(spec, field, words):
    with pytest.raises(ConfigError) as info:
        weight_formats(spec)
    assert info.value.field == field
    for word in words:
        assert word in str(info.value)
    assert "\n" not in str(info.value)


def test_errors_name_the_callers_field_and_file():
    with pytest.raises(ConfigError) as info:
        weight_formats("int4-g128,lm_head=bf17", "draft.weights", file="study.toml")
    assert str(info.value).startswith("study.toml: draft.weights.lm_head: ")


# --- activations ------------------------------------------------------------------------------

@pytest.mark.parametrize(("weights", "activations"), [
    ("bf16", "bf16"), ("fp16", "fp16"), ("fp32", "fp32"),
    ("int8", "bf16"), ("int4-g128", "bf16"), ("int4-g77", "bf16"),
    ("q4_0", "bf16"), ("q8_0", "bf16"), ("q4_k", "bf16"), ("q6_k", "bf16"),
    ("q4_k_m", "bf16"), ("q5_k_m", "bf16"), ("mxfp4", "bf16"),
    ("fp8-e4m3", "fp8-e4m3"), ("fp8-e5m2", "fp8-e4m3"), ("fp8-e4m3-b128", "fp8-e4m3-b128"),
    ("mxfp8", "mxfp8"), ("nvfp4", "nvfp4"), ("int4-g128,lm_head=fp8-e4m3", "bf16"),
])
def test_usual_activations(weights, activations):
    assert usual_activations(weights) == activations
    assert activations in FORMATS


def test_usual_activations_of_every_weight_format_is_a_format():
    for name in BASES:
        assert usual_activations(name) in FORMATS
    with pytest.raises(ConfigError):
        usual_activations("int9")


# --- whole models -----------------------------------------------------------------------------

def test_llama_3_8b_q4_k_m_matches_llama_cpp():
    """llama.cpp loads Llama 3.1 8B Q4_K_M as 'type q4_K: 193 tensors, type q6_K: 33 tensors'
    and 'model buffer size = 4685.30 MiB (4.89 BPW)' (the tensor data: every tensor, norms in
    F32, no metadata; Llama 3.1 adds a 64-value F32 rope_freqs, 256 B, below the rounding).

    Closed form: per layer 218,103,808 weights at 144/256 B, the v and down of the 16
    'more bits' layers (62,914,560 weights) at 210/256 B instead, token_embd (525,336,576) at
    144/256, output at 210/256, and 65 norms of 4096 F32."""
    m = model("llama-3-8b")
    roles = checkpoint_role_bytes(m, "q4_k_m")
    weights = sum(roles.values())
    layer = (2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14336 * 4096) * 144 // 256
    bump = (1024 * 4096 + 4096 * 14336) * (210 - 144) // 256
    table = 128256 * 4096
    closed = 32 * layer + 16 * bump + table * 144 // 256 + table * 210 // 256
    assert weights == closed == 4_911_833_088
    norms_f32 = (2 * 32 + 1) * 4096 * 4
    tensor_data = weights + norms_f32
    assert tensor_data == 4_912_898_048
    assert round(tensor_data / 2**20, 2) == 4685.30
    assert round(tensor_data * 8 / 8.03e9, 2) == 4.89
    wf = weight_formats("q4_k_m")
    types = [wf.for_tensor(role, layer, 32).name for role, layer, _ in model_tensors(m)]
    assert (types.count("q4_k"), types.count("q6_k"), len(types)) == (193, 33, 226)
    # bartowski/Meta-Llama-3-8B-Instruct-GGUF lists the file at 4.92 GB: the tensor data plus
    # the GGUF header (the 128,256-token vocabulary and 280,147 merges as strings, ~7 MB) and
    # at most 31 B of alignment per tensor. The published figure has three digits: the
    # difference must lie in [0, 15 MB].
    assert 0 <= 4.925e9 - tensor_data and 4.915e9 - tensor_data <= 15e6


def test_llama_3_2_1b_int4_keeps_its_16_bit_table():
    m = model("llama-3.2-1b")
    roles = checkpoint_role_bytes(m, "int4-g128")
    assert m.tied_embeddings and "lm_head" not in roles
    assert roles["embedding"] == 128256 * 2048 * 2 == 525_336_576
    # the decoder's matmuls in int4-g128: 4 bits per weight and 20 bits per 128 inputs
    per_layer = sum(rows * (4 * k + 20 * math.ceil(k / 128)) for rows, k in (
        (2048, 2048), (512, 2048), (512, 2048), (2048, 2048),
        (8192, 2048), (8192, 2048), (2048, 8192))) // 8
    assert sum(v for r, v in roles.items() if r != "embedding") == 16 * per_layer
    uniform = checkpoint_role_bytes(m, "uniform:int4-g128")
    assert uniform["embedding"] == 128256 * (2048 * 4 + 16 * 20) // 8
    assert roles["embedding"] / uniform["embedding"] == pytest.approx(3.85, abs=0.01)


def test_mixtral_q4_k_m_roles():
    m = model("mixtral-8x7b")
    wf = weight_formats("q4_k_m")
    assert wf.for_tensor("router", 0, m.layers, n_experts=8).name == "fp32"
    roles = checkpoint_role_bytes(m, wf)
    assert roles["router"] == 32 * 8 * 4096 * 4
    assert roles["v"] == 32 * 1024 * 4096 * 34 // 32          # Q8_0: 34 B per 32
    downs = sum(210 if more_bits(i, 32) else 144 for i in range(32)) * 8 * 4096 * 14336 // 256
    assert roles["expert_down"] == downs


def test_weight_formats_is_frozen_and_hashable():
    wf = weight_formats("q4_k_m,lm_head=bf16")
    with pytest.raises(AttributeError):
        wf.base = "bf16"                                     # type: ignore[misc]
    assert {wf: 1}[WeightFormats("q4_k_m", False, (("lm_head", "bf16"),))] == 1


@pytest.mark.parametrize("fmt", ["q4_k", "q5_k", "q6_k"])
def test_walker_reads_exactly_the_k_quant_storage(fmt):
    """With no on-chip reuse every decoder matmul reads its K-quant super-blocks exactly (the
    walker's byte count from ``kernel_params``, against ``bytes_for``)."""
    m = memsim.model("llama-3.2-1b")
    dev = memsim.device("h100-sxm").with_overrides({"tiers.sram.capacity": "1 KiB"})
    report = memsim.emulate(dev, m, batch=1, context=100, weights=fmt)
    shapes = {"qkv": ((m.heads + 2 * m.kv_heads) * m.head_dim, m.hidden),
              "o_proj": (m.hidden, m.heads * m.head_dim),
              "gate": (m.ffn, m.hidden), "up": (m.ffn, m.hidden), "down": (m.hidden, m.ffn)}
    rows = [row for row in report.ops if row.name in shapes]
    assert len(rows) == 5 * m.layers
    for row in rows:
        assert row.bytes_read["hbm"] == bytes_for(shapes[row.name], fmt), row
    block = {"q4_k": 144, "q5_k": 176, "q6_k": 210}[fmt]
    assert bytes_for(shapes["down"], fmt) == m.hidden * (m.ffn // 256) * block


@pytest.mark.parametrize("args", [("bogus",), ("q4_k_m", True), ("int4-g128", 1),
                                  ("bf16", False, (("lm_head", "bf16"), ("embedding", "bf16"))),
                                  ("bf16", False, (("lm_head", "bf17"),)),
                                  ("bf16", False, (("norm", "bf16"),))])
def test_direct_construction_is_validated(args):
    with pytest.raises(ConfigError):
        WeightFormats(*args)


def test_direct_construction_keeps_pairs_hashable():
    wf = WeightFormats("int4-g128", False, [["embedding", "bf16"]])    # type: ignore[list-item]
    assert wf.overrides == (("embedding", "bf16"),)
    assert hash(wf) == hash(weight_formats("int4-g128,embed=bf16"))
