"""HuggingFace ``config.json`` → :class:`~memsim.model.Model`: the fields memsim needs, per
architecture, with every approximation written into the model's ``source``.

Example: ``parse_hf_config(json.load(open("config.json")), file="config.json", name="qwen")``
for a Qwen2.5 7B config gives a Model of 28 layers, hidden 3584, 28 heads, 4 KV heads of 128.
docs/model-format.md has the field table; the HF field names and class defaults below follow
the configuration classes of the ``transformers`` library (``configuration_<type>.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memsim.errors import ConfigError
from memsim.model import Model, check_shape


@dataclass(frozen=True)
class Architecture:
    """How one HuggingFace ``model_type`` maps onto memsim's Model.

    ``family`` picks the FFN reading (``dense``, ``mixtral``, ``qwen_moe``, ``deepseek``);
    ``window`` which layers a ``sliding_window`` applies to (``none``, ``all``, ``even``, or
    ``qwen``: refused when ``use_sliding_window`` is on). Defaults are the transformers
    configuration class's, used when a config.json omits the key.
    """

    model_type: str
    classes: tuple[str, ...]
    family: str
    tied_default: bool
    head_dim_default: int | None = None
    window: str = "none"
    window_default: int | None = None
    notes: tuple[str, ...] = ()


_QWEN2_BIAS = "q/k/v projection biases ((heads + 2 kv_heads) x head_dim per layer) not modelled"
_QK_NORM = "per-head q/k RMSNorm weights (2 x head_dim per layer) not modelled"

ARCHITECTURES: Mapping[str, Architecture] = {a.model_type: a for a in (
    Architecture("llama", ("LlamaForCausalLM",), "dense", tied_default=False),
    Architecture("mistral", ("MistralForCausalLM",), "dense", tied_default=False, window="all",
                 window_default=4096),
    Architecture("mixtral", ("MixtralForCausalLM",), "mixtral", tied_default=False,
                 window="all"),
    Architecture("qwen2", ("Qwen2ForCausalLM",), "dense", tied_default=False, window="qwen",
                 notes=(_QWEN2_BIAS,)),
    Architecture("qwen3", ("Qwen3ForCausalLM",), "dense", tied_default=False,
                 head_dim_default=128, window="qwen", notes=(_QK_NORM,)),
    Architecture("qwen2_moe", ("Qwen2MoeForCausalLM",), "qwen_moe", tied_default=False,
                 window="qwen", notes=(_QWEN2_BIAS, "the shared expert's sigmoid gate (hidden "
                                       "weights per layer) not modelled")),
    Architecture("qwen3_moe", ("Qwen3MoeForCausalLM",), "qwen_moe", tied_default=False,
                 head_dim_default=128, window="qwen", notes=(_QK_NORM,)),
    Architecture("gemma", ("GemmaForCausalLM",), "dense", tied_default=True,
                 head_dim_default=256),
    Architecture("gemma2", ("Gemma2ForCausalLM",), "dense", tied_default=True,
                 head_dim_default=256, window="even", window_default=4096,
                 notes=("two more RMSNorms per layer (after attention and FFN; 2 x hidden "
                        "weights) not modelled",)),
    Architecture("phi3", ("Phi3ForCausalLM",), "dense", tied_default=False, window="all"),
    Architecture("deepseek_v2", ("DeepseekV2ForCausalLM",), "deepseek", tied_default=False),
    Architecture("deepseek_v3", ("DeepseekV3ForCausalLM",), "deepseek", tied_default=False),
)}

_COMMON = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")
#: The fields each family needs beyond the common ones (all reported at once when missing).
REQUIRED: Mapping[str, tuple[str, ...]] = {
    "dense": _COMMON + ("intermediate_size",),
    "mixtral": _COMMON + ("intermediate_size", "num_local_experts", "num_experts_per_tok"),
    "qwen_moe": _COMMON + ("moe_intermediate_size", "num_experts", "num_experts_per_tok"),
    "deepseek": _COMMON + ("moe_intermediate_size", "n_routed_experts", "num_experts_per_tok",
                           "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                           "v_head_dim"),
}
#: Fields whose null is a value: ``q_lora_rank`` null means queries are not compressed
#: (DeepSeek-V2-Lite); they are missing only when absent.
_NULLABLE = ("q_lora_rank",)
_OPTIONAL = ("num_key_value_heads", "head_dim", "tie_word_embeddings")

_MTP_NOTE = ("multi-token-prediction layers (num_nextn_predict_layers) left out, as the "
             "published 671 B does; DeepSeek-V3's gate score-correction bias (one value per "
             "expert and layer) not modelled")


def supported() -> str:
    """The architectures memsim reads, as ``model_type (Class)`` for messages and docs."""
    return ", ".join(f"{a.model_type} ({', '.join(a.classes)})" for a in ARCHITECTURES.values())


def architecture_of(data: Mapping[str, Any], *, file: str) -> Architecture:
    """The Architecture named by ``model_type``, else by a class in ``architectures``."""
    model_type = data.get("model_type")
    if isinstance(model_type, str) and model_type in ARCHITECTURES:
        return ARCHITECTURES[model_type]
    classes = data.get("architectures")
    for cls in classes if isinstance(classes, list) else ():
        for arch in ARCHITECTURES.values():
            if cls in arch.classes:
                return arch
    raise ConfigError(
        f"unsupported architecture (model_type {model_type!r}, architectures {classes!r}); "
        f"memsim reads {supported()}; from them it needs {', '.join(_COMMON)} and the FFN "
        "fields of the family (intermediate_size; for MoE the expert count, top-k "
        f"num_experts_per_tok and moe_intermediate_size), and reads {', '.join(_OPTIONAL)} "
        "when given; a model TOML (docs/model-format.md) describes any other", file=file,
        field="model_type")


def _get(data: Mapping[str, Any], key: str, default: Any) -> Any:
    """``data[key]``, or ``default`` when it is absent or null."""
    value = data.get(key)
    return default if value is None else value


def parse_hf_config(data: Mapping[str, Any], *, file: str, name: str) -> Model:
    """Build a Model from a HuggingFace config.json's table.

    Parameters
    ----------
    data
        The parsed JSON object.
    file
        Its path, named by every error and in the model's ``source``.
    name
        The Model's name (the path the user gave, so that a suggested command can repeat it).

    Raises
    ------
    ConfigError
        For an architecture memsim does not read (listing those it does and the fields it
        needs), every missing field at once, or a value of the wrong type or range.
    """
    arch = architecture_of(data, file=file)
    missing = [key for key in REQUIRED[arch.family]
               if (key not in data if key in _NULLABLE else data.get(key) is None)]
    if missing:
        raise ConfigError(f"missing {'fields' if len(missing) > 1 else 'field'} that memsim "
                          f"needs from a {arch.model_type} config", file=file,
                          field=", ".join(missing))
    heads, hidden = data["num_attention_heads"], data["hidden_size"]
    shape: dict[str, Any] = {
        "layers": data["num_hidden_layers"], "hidden": hidden, "heads": heads,
        "kv_heads": _get(data, "num_key_value_heads", heads), "vocab": data["vocab_size"],
        "head_dim": _get(data, "head_dim", arch.head_dim_default),
    }
    fields = {"layers": "num_hidden_layers", "hidden": "hidden_size",
              "heads": "num_attention_heads", "kv_heads": "num_key_value_heads",
              "vocab": "vocab_size", "head_dim": "head_dim"}
    if shape["head_dim"] is None and arch.family != "deepseek":   # MLA derives its own
        shape["head_dim"] = _split_heads(hidden, heads, file=file)
        fields["head_dim"] = "hidden_size"
    tied = _get(data, "tie_word_embeddings", arch.tied_default)
    if not isinstance(tied, bool):
        raise ConfigError(f"expected true or false, got {tied!r}", file=file,
                          field="tie_word_embeddings")
    notes = list(arch.notes)
    family = {"dense": _dense, "mixtral": _mixtral, "qwen_moe": _qwen_moe,
              "deepseek": _deepseek}[arch.family]
    family(data, shape, fields, notes, file=file)
    _window(arch, data, shape, fields, file=file)
    if isinstance(data.get("quantization_config"), Mapping):
        method = data["quantization_config"].get("quant_method", "?")
        notes.append(f"quantization_config ({method}) not read: the weight format is the "
                     "workload's (--weights)")
    shape.update(name=name, display_name=_display_name(file), tied_embeddings=tied,
                 source=f"HuggingFace config.json {file} (model_type {arch.model_type})"
                        + "".join(f"; {note}" for note in notes))
    return check_shape(shape, file=file, fields=fields)


def _split_heads(hidden: Any, heads: Any, *, file: str) -> Any:
    """hidden_size / num_attention_heads, the head width when the config gives none."""
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        if hidden % heads:
            raise ConfigError(f"hidden_size {hidden} is not a multiple of num_attention_heads "
                              f"{heads}; give head_dim", file=file, field="head_dim")
        return hidden // heads
    return hidden        # not an integer pair: check_shape names the bad field


def _dense(data, shape, fields, notes, *, file) -> None:
    shape["ffn"] = data["intermediate_size"]
    fields["ffn"] = "intermediate_size"


def _mixtral(data, shape, fields, notes, *, file) -> None:
    shape.update(ffn=data["intermediate_size"], experts=data["num_local_experts"],
                 experts_per_token=data["num_experts_per_tok"])
    fields.update(ffn="intermediate_size", experts="num_local_experts",
                  experts_per_token="num_experts_per_tok")


def _qwen_moe(data, shape, fields, notes, *, file) -> None:
    """Qwen2-MoE / Qwen3-MoE: a shared expert of width W is W / ffn blocks of the routed
    width (the same weights and FLOPs); ``mlp_only_layers`` may only be leading layers."""
    ffn = data["moe_intermediate_size"]
    shape.update(ffn=ffn, experts=data["num_experts"],
                 experts_per_token=data["num_experts_per_tok"])
    fields.update(ffn="moe_intermediate_size", experts="num_experts",
                  experts_per_token="num_experts_per_tok",
                  shared_experts="shared_expert_intermediate_size",
                  dense_layers="mlp_only_layers", dense_ffn="intermediate_size")
    width = _get(data, "shared_expert_intermediate_size", 0)
    if width:
        if not isinstance(width, int) or not isinstance(ffn, int) or ffn < 1 or width % ffn:
            raise ConfigError(f"a shared expert of width {width!r} is not a whole number of "
                              f"routed experts of moe_intermediate_size {ffn!r}; memsim models "
                              "shared experts in blocks of the routed width", file=file,
                              field="shared_expert_intermediate_size")
        shape["shared_experts"] = width // ffn
        if width != ffn:
            notes.append(f"the shared expert (width {width}) is {width // ffn} blocks of width "
                         f"{ffn}")
    if _get(data, "decoder_sparse_step", 1) != 1:
        raise ConfigError("not yet: MoE layers every few layers (decoder_sparse_step > 1); "
                          "memsim places MoE layers after leading dense ones only", file=file,
                          field="decoder_sparse_step")
    dense = _get(data, "mlp_only_layers", [])
    if not isinstance(dense, list) or dense != list(range(len(dense))):
        raise ConfigError(f"not yet: dense layers {dense!r} other than the leading ones; "
                          "memsim places MoE layers after leading dense ones only", file=file,
                          field="mlp_only_layers")
    if dense:
        shape.update(dense_layers=len(dense), dense_ffn=data.get("intermediate_size"))


def _deepseek(data, shape, fields, notes, *, file) -> None:
    """DeepSeek-V2/V3 (and Kimi K2, DeepSeek-V3's architecture): routed and shared experts of
    moe_intermediate_size, first_k_dense_replace leading dense layers, and multi-head latent
    attention (its five dimensions; ``q_lora_rank`` null: no query compression). The cache is
    MLA's one latent, so ``num_key_value_heads`` and ``head_dim`` are not read."""
    dense = _get(data, "first_k_dense_replace", 0)
    shape.update(ffn=data["moe_intermediate_size"], experts=data["n_routed_experts"],
                 experts_per_token=data["num_experts_per_tok"],
                 shared_experts=_get(data, "n_shared_experts", 0), dense_layers=dense,
                 attention="mla", kv_lora_rank=data["kv_lora_rank"],
                 q_lora_rank=_get(data, "q_lora_rank", 0),
                 qk_rope_head_dim=data["qk_rope_head_dim"],
                 qk_nope_head_dim=data["qk_nope_head_dim"], v_head_dim=data["v_head_dim"])
    for key in ("kv_heads", "head_dim"):     # the latent's, derived from the MLA dimensions
        shape.pop(key)
        fields.pop(key)
    if dense:
        shape["dense_ffn"] = data.get("intermediate_size")
    fields.update(ffn="moe_intermediate_size", experts="n_routed_experts",
                  experts_per_token="num_experts_per_tok", shared_experts="n_shared_experts",
                  dense_layers="first_k_dense_replace", dense_ffn="intermediate_size")
    if _get(data, "moe_layer_freq", 1) != 1:
        raise ConfigError("not yet: MoE layers every few layers (moe_layer_freq > 1); memsim "
                          "places MoE layers after leading dense ones only", file=file,
                          field="moe_layer_freq")
    notes.append(_MTP_NOTE)


def _window(arch: Architecture, data: Mapping[str, Any], shape: dict[str, Any],
            fields: dict[str, str], *, file: str) -> None:
    """Sliding-window attention: the window and the layers it applies to (``layer_types``
    when the config lists them, else the architecture's rule)."""
    if arch.window == "none":
        return
    if arch.window == "qwen":
        if data.get("use_sliding_window"):
            raise ConfigError("not yet: Qwen sliding-window attention (use_sliding_window = "
                              "true; transformers versions disagree on which layers use it)",
                              file=file, field="use_sliding_window")
        return
    window = data["sliding_window"] if "sliding_window" in data else arch.window_default
    if window is None:
        return
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ConfigError(f"expected a window of at least one token, or null for none, got "
                          f"{window!r}", file=file, field="sliding_window")
    layers = shape["layers"] if isinstance(shape["layers"], int) else 0
    types = data.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or not all(
                kind in ("sliding_attention", "full_attention") for kind in types):
            raise ConfigError(f"not yet: layer types other than sliding_attention and "
                              f"full_attention in {types!r}", file=file, field="layer_types")
        if len(types) != layers:
            raise ConfigError(f"expected one entry per layer ({layers}), got {len(types)}",
                              file=file, field="layer_types")
        chosen = [i for i, kind in enumerate(types) if kind == "sliding_attention"]
    else:
        chosen = list(range(0, layers, 2 if arch.window == "even" else 1))
    if chosen:
        shape.update(sliding_window=window, window_layers=tuple(chosen))
        fields.update(sliding_window="sliding_window", window_layers="layer_types")


def _display_name(file: str) -> str:
    """The folder of a ``config.json`` (``Qwen2.5-7B-Instruct``), else the file's stem."""
    path = Path(file)
    return path.parent.name if path.name == "config.json" and path.parent.name else path.stem
