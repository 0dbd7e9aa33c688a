"""Transformer model shapes: loading, validation and derived parameter counts.

A model comes from the catalog (``memsim.model("llama-3-8b")``, parsed once per process), from a
model TOML file (docs/model-format.md) or from a HuggingFace ``config.json``
(:mod:`memsim.hf_config`); :func:`load_model` reads either file and :func:`check_shape` holds
the limits both obey.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memsim.datafile import (catalog_names, decode_text, read_catalog_entry, read_toml_text,
                             require_bool, require_str, require_table)
from memsim.errors import ConfigError
from memsim.units import parse_quantity


@dataclass(frozen=True)
class Model:
    """A decoder-only transformer with grouped-query or multi-head latent attention and a
    gated (SwiGLU) FFN.

    ``ffn`` is the intermediate size of one FFN block (of one routed expert, for MoE models).
    An MoE model may also have ``shared_experts`` that every token uses (each of size ``ffn``)
    and ``dense_layers`` leading layers with a dense FFN of size ``dense_ffn``.
    ``sliding_window`` (tokens; 0 for none) is the span that the layers in ``window_layers``
    attend to; the other layers attend to the whole context.

    ``attention`` is ``"gqa"`` (grouped-query: ``kv_heads`` K and V heads of ``head_dim``) or
    ``"mla"`` (DeepSeek-V2/V3's multi-head latent attention, run as serving engines run it at
    decode: the up-projections absorbed into the query and the output, every head attending to
    one shared latent). An MLA model caches one row of ``kv_lora_rank + qk_rope_head_dim``
    values per token and layer, so it has ``kv_heads = 1`` and ``head_dim`` equal to that row
    (the absorbed keys' width); its values are the first ``kv_lora_rank`` of them.
    ``q_lora_rank`` is 0 when queries are not compressed (DeepSeek-V2-Lite).
    """

    name: str
    display_name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tied_embeddings: bool
    experts: int = 1
    experts_per_token: int = 1
    shared_experts: int = 0
    dense_layers: int = 0
    dense_ffn: int = 0
    published_params: float = 0.0
    published_active_params: float = 0.0
    source: str = ""
    sliding_window: int = 0
    window_layers: tuple[int, ...] = ()
    attention: str = "gqa"
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0

    @property
    def is_moe(self) -> bool:
        """True for a mixture-of-experts model."""
        return self.experts > 1

    def is_moe_layer(self, layer: int) -> bool:
        """True when ``layer`` routes tokens to experts (False for the leading dense layers)."""
        return self.is_moe and layer >= self.dense_layers

    @property
    def moe_layers(self) -> int:
        """Layers with routed experts."""
        return self.layers - self.dense_layers if self.is_moe else 0

    @property
    def whole_context_limit(self) -> int | None:
        """The most tokens a sequence may hold for whole-context attention to equal the model's
        (its sliding window), or None when every layer attends to the whole context."""
        return self.sliding_window if self.sliding_window and self.window_layers else None

    @property
    def is_mla(self) -> bool:
        """True for multi-head latent attention."""
        return self.attention == "mla"

    @property
    def kv_parts(self) -> int:
        """Rows one token caches per KV head and layer: K and V (2), or MLA's one latent (1)."""
        return 1 if self.is_mla else 2

    @property
    def value_dim(self) -> int:
        """Width of the values a head's attention weighs: ``head_dim``, or for MLA (absorbed)
        the latent's ``kv_lora_rank``."""
        return self.kv_lora_rank if self.is_mla else self.head_dim

    @property
    def attention_params_per_layer(self) -> int:
        """Q, K, V and output projection weights of one layer; for MLA its low-rank projections
        with their two RMSNorms (``q_a``, ``q_a_norm`` and ``q_b``, or ``q_proj`` without query
        compression; ``kv_a`` with ``kv_a_norm``; ``kv_b``; ``o_proj``)."""
        if self.is_mla:
            return sum(self.mla_params_per_layer.values())
        q_out = self.heads * self.head_dim
        kv_out = self.kv_heads * self.head_dim
        return self.hidden * (q_out + 2 * kv_out) + q_out * self.hidden

    @property
    def mla_params_per_layer(self) -> dict[str, int]:
        """MLA's weights of one layer by tensor, as a DeepSeek checkpoint names them (empty for
        grouped-query attention)."""
        if not self.is_mla:
            return {}
        h, heads, rank = self.hidden, self.heads, self.kv_lora_rank
        q_out = heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        q = ({"q_a_proj": h * self.q_lora_rank, "q_a_layernorm": self.q_lora_rank,
              "q_b_proj": self.q_lora_rank * q_out} if self.q_lora_rank
             else {"q_proj": h * q_out})
        return {**q, "kv_a_proj_with_mqa": h * (rank + self.qk_rope_head_dim),
                "kv_a_layernorm": rank,
                "kv_b_proj": rank * heads * (self.qk_nope_head_dim + self.v_head_dim),
                "o_proj": heads * self.v_head_dim * h}

    @property
    def ffn_params_per_expert(self) -> int:
        """Gate, up and down projection weights of one FFN block."""
        return 3 * self.hidden * self.ffn

    @property
    def router_params_per_layer(self) -> int:
        """The expert router's weights (zero for a dense model)."""
        return self.hidden * self.experts if self.is_moe else 0

    @property
    def norm_params(self) -> int:
        """RMSNorm weights: two per layer and the final one."""
        return (2 * self.layers + 1) * self.hidden

    @property
    def embedding_params(self) -> int:
        """Input embedding plus the LM head (counted once when tied)."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    def _ffn_params(self, routed: int) -> int:
        """FFN weights of all layers when each MoE layer uses ``routed`` routed experts."""
        dense = self.layers - self.moe_layers
        moe = self.moe_layers * (self.router_params_per_layer + (routed + self.shared_experts)
                                 * self.ffn_params_per_expert)
        return dense * 3 * self.hidden * (self.dense_ffn or self.ffn) + moe

    @property
    def total_params(self) -> int:
        """All parameters, as published counts them (norms included)."""
        return (self.layers * self.attention_params_per_layer
                + self._ffn_params(self.experts if self.is_moe else 0)
                + self.embedding_params + self.norm_params)

    @property
    def active_params(self) -> int:
        """Parameters one token uses: top-k experts instead of all (equal to total for dense)."""
        return (self.layers * self.attention_params_per_layer
                + self._ffn_params(self.experts_per_token if self.is_moe else 0)
                + self.embedding_params + self.norm_params)

    def kv_elements_per_token(self) -> int:
        """Values one token adds to the cache over all layers: K and V, or MLA's latent."""
        return self.kv_parts * self.layers * self.kv_heads * self.head_dim


# Limits ------------------------------------------------------------------------------------

#: Inclusive bounds of each integer shape field; docs/model-format.md states them with reasons.
LIMITS: Mapping[str, tuple[int, int]] = {
    "layers": (1, 1024), "hidden": (1, 131_072), "heads": (1, 1024), "kv_heads": (1, 1024),
    "head_dim": (1, 2048), "ffn": (1, 1_048_576), "vocab": (1, 4_194_304),
    "experts": (2, 1024), "experts_per_token": (1, 1024), "shared_experts": (0, 64),
    "dense_layers": (0, 1023), "dense_ffn": (0, 1_048_576), "sliding_window": (0, 2**31),
    "kv_lora_rank": (1, 65_536), "q_lora_rank": (0, 131_072), "qk_rope_head_dim": (0, 2048),
    "qk_nope_head_dim": (1, 2048), "v_head_dim": (1, 2048),
}
#: Attention kinds: grouped-query, and multi-head latent attention (DeepSeek-V2/V3, Kimi K2).
ATTENTION_KINDS = ("gqa", "mla")
#: MLA's dimensions, in the order a model TOML's ``[mla]`` table and docs list them.
MLA_KEYS = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
            "v_head_dim")
#: The most parameters a model may have (about 1,500 times the largest published model).
MAX_PARAMS = 10**15
#: The most expert FFN blocks (routed and shared, over all MoE layers): each is planned as its
#: own tensors, so planning time grows with this count.
MAX_EXPERT_BLOCKS = 65_536
#: The largest model file memsim reads (a config.json or model TOML is a few KiB).
MAX_FILE_BYTES = 1 << 20


def _int_field(value: Any, key: str, *, file: str, field: str) -> int:
    """An integer within LIMITS[key]; ``field`` is its name in the file being read."""
    lo, hi = LIMITS[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"expected an integer, got {value!r}", file=file, field=field)
    if not lo <= value <= hi:
        raise ConfigError(f"expected an integer from {lo} to {hi:,} (memsim's limit for "
                          f"{key}), got {value:,}", file=file, field=field)
    return value


def check_shape(values: Mapping[str, Any], *, file: str,
                fields: Mapping[str, str] | None = None) -> Model:
    """Validate a model's values against :data:`LIMITS` and each other, and build the Model.

    Parameters
    ----------
    values
        Keyword arguments of :class:`Model`.
    file
        The file they came from, named by every error.
    fields
        The key in that file of each Model field whose name differs (``"layers"`` ->
        ``"num_hidden_layers"``), so that errors name what the user wrote.
    """
    names = dict(fields or {})

    def where(key: str) -> str:
        return names.get(key, key)

    shape = dict(values)
    for key in LIMITS:
        if key in shape:
            shape[key] = _int_field(shape[key], key, file=file, field=where(key))
    _check_mla(shape, file=file, where=where)
    if shape["kv_heads"] > shape["heads"] or shape["heads"] % shape["kv_heads"]:
        raise ConfigError(f"heads ({shape['heads']}) must be a multiple of kv_heads "
                          f"({shape['kv_heads']})", file=file, field=where("kv_heads"))
    _check_moe(shape, file=file, where=where)
    _check_window(shape, file=file, where=where)
    model = Model(**shape)
    if model.total_params > MAX_PARAMS:
        raise ConfigError(f"{model.total_params:.3g} parameters exceed memsim's limit of "
                          f"{MAX_PARAMS:.0e}", file=file, field=where("layers"))
    blocks = model.moe_layers * (model.experts + model.shared_experts)
    if blocks > MAX_EXPERT_BLOCKS:
        raise ConfigError(f"{model.moe_layers} MoE layers x {model.experts + model.shared_experts}"
                          f" experts = {blocks:,} expert FFNs exceed memsim's limit of "
                          f"{MAX_EXPERT_BLOCKS:,}", file=file, field=where("experts"))
    return model


def check_model(model: Model) -> Model:
    """A Model built in Python, held to the limits and relations of one read from a file.

    The Python API takes a :class:`Model` as it takes a model file, so the same
    :func:`check_shape` refuses both (heads not a multiple of kv_heads, a dense model's
    experts_per_token, a zero dimension). Checked once per distinct model in a process.
    """
    if not isinstance(model, Model):
        raise ConfigError(f"expected a memsim.Model, got {type(model).__name__}", field="model")
    try:
        hash(model)
    except TypeError:
        return _check_model(model)
    return _check_model_cached(model)


@functools.lru_cache(maxsize=64)
def _check_model_cached(model: Model) -> Model:
    return _check_model(model)


def _check_model(model: Model) -> Model:
    values = {f.name: getattr(model, f.name) for f in dataclasses.fields(Model)}
    # What a file leaves out: a dense model's expert count, and MLA's dimensions under GQA.
    if values["experts"] == 1:
        del values["experts"]
    if values["attention"] == "gqa":
        for key in MLA_KEYS:
            if values[key] == 0:
                del values[key]
    check_shape(values, file=f"memsim.Model {model.name!r}")
    return model


def _check_mla(shape: dict[str, Any], *, file: str, where) -> None:
    """An MLA shape gives its dimensions; its cache is one latent "KV head" of
    ``kv_lora_rank + qk_rope_head_dim`` values (set here, so the other fields follow)."""
    kind = shape.get("attention", "gqa")
    if kind not in ATTENTION_KINDS:
        raise ConfigError(f"expected one of {', '.join(ATTENTION_KINDS)}, got {kind!r}",
                          file=file, field=where("attention"))
    if kind == "gqa":
        given = [key for key in MLA_KEYS if shape.get(key)]
        if given:
            raise ConfigError("multi-head latent attention dimensions given for grouped-query "
                              "attention", file=file, field=", ".join(map(where, given)))
        return
    missing = [key for key in MLA_KEYS if key not in shape]
    if missing:
        raise ConfigError(f"missing {'fields' if len(missing) > 1 else 'field'} of multi-head "
                          "latent attention", file=file, field=", ".join(map(where, missing)))
    row = shape["kv_lora_rank"] + shape["qk_rope_head_dim"]
    for key, value in (("kv_heads", 1), ("head_dim", row)):
        if shape.get(key, value) != value:
            raise ConfigError(f"multi-head latent attention caches one latent of kv_lora_rank + "
                              f"qk_rope_head_dim = {row} values, so {key} is {value}; got "
                              f"{shape[key]!r} (leave it out)", file=file, field=where(key))
    shape.update(kv_heads=1, head_dim=row)


def _check_moe(shape: dict[str, Any], *, file: str, where) -> None:
    """Relations between the MoE fields of a shape."""
    experts = shape.get("experts", 1)
    if experts == 1:
        for key in ("shared_experts", "dense_layers", "dense_ffn"):
            if shape.get(key):
                raise ConfigError(f"{key} needs routed experts (experts >= 2)", file=file,
                                  field=where(key))
        if shape.get("experts_per_token", 1) != 1:
            raise ConfigError(f"experts_per_token = {shape['experts_per_token']} needs routed "
                              "experts (experts >= 2)", file=file, field=where("experts_per_token"))
        return
    if shape.get("experts_per_token", 1) > experts:
        raise ConfigError(f"experts_per_token ({shape['experts_per_token']}) exceeds experts "
                          f"({experts})", file=file, field=where("experts_per_token"))
    if shape.get("dense_layers", 0) >= shape["layers"]:
        raise ConfigError(f"dense_layers must leave at least one MoE layer of "
                          f"{shape['layers']}", file=file, field=where("dense_layers"))


def _check_window(shape: dict[str, Any], *, file: str, where) -> None:
    """A sliding window needs the layers it applies to, and those layers must exist."""
    layers = tuple(shape.get("window_layers", ()))
    if not shape.get("sliding_window"):
        if layers:
            raise ConfigError("window_layers given without a sliding_window", file=file,
                              field=where("window_layers"))
        return
    bad = [x for x in layers if isinstance(x, bool) or not isinstance(x, int)
           or not 0 <= x < shape["layers"]]
    if bad or not layers or len(set(layers)) != len(layers):
        raise ConfigError(f"expected distinct layer numbers from 0 to {shape['layers'] - 1}, got "
                          f"{list(layers)!r}", file=file, field=where("window_layers"))
    shape["window_layers"] = tuple(sorted(layers))


# The model TOML ----------------------------------------------------------------------------

_MODEL_KEYS = ("schema_version", "name", "display_name", "layers", "hidden", "heads", "kv_heads",
               "head_dim", "ffn", "vocab", "tied_embeddings", "published_params", "source")
# An [mla] model's cache is one latent: kv_heads and head_dim follow from its dimensions (and
# may be left out).
_MLA_DERIVED = ("kv_heads", "head_dim")
_MOE_KEYS = ("experts", "experts_per_token")
_MOE_OPTIONAL = ("published_active_params", "shared_experts", "dense_layers", "dense_ffn")
_WINDOW_KEYS = ("tokens", "layers")


def check_keys_all(table: Mapping[str, Any], *, required: tuple[str, ...],
                   optional: tuple[str, ...] = (), file: str, prefix: str = "") -> None:
    """Refuse unknown keys (listing the valid ones), then every missing key in one error."""
    allowed = set(required) | set(optional)
    unknown = [key for key in table if key not in allowed]
    if unknown:
        raise ConfigError(f"unknown key{'s' if len(unknown) > 1 else ''}; valid keys are "
                          f"{', '.join(sorted(allowed))}", file=file,
                          field=", ".join(prefix + key for key in unknown))
    missing = [key for key in required if key not in table]
    if missing:
        raise ConfigError(f"missing required key{'s' if len(missing) > 1 else ''} "
                          f"({len(missing)} of {len(required)})", file=file,
                          field=", ".join(prefix + key for key in missing))


def parse_model(data: Mapping[str, Any], *, file: str) -> Model:
    """Validate a model TOML file's table and build a Model."""
    mla = "mla" in data
    required = tuple(key for key in _MODEL_KEYS if not (mla and key in _MLA_DERIVED))
    check_keys_all(data, required=required, file=file,
                   optional=("moe", "sliding_window", "mla") + (_MLA_DERIVED if mla else ()))
    if type(data["schema_version"]) is not int or data["schema_version"] != 1:
        raise ConfigError(f"unsupported schema_version {data['schema_version']!r}; expected 1",
                          file=file, field="schema_version")
    shape: dict[str, Any] = {key: data[key] for key in
                             ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab")
                             if key in data}
    fields: dict[str, str] = {}
    if mla:
        table = require_table(data["mla"], file=file, field="mla")
        check_keys_all(table, required=MLA_KEYS, file=file, prefix="mla.")
        shape.update(table, attention="mla")
        fields.update((key, f"mla.{key}") for key in MLA_KEYS)
    if "moe" in data:
        moe = require_table(data["moe"], file=file, field="moe")
        check_keys_all(moe, required=_MOE_KEYS, optional=_MOE_OPTIONAL, file=file, prefix="moe.")
        shape.update((key, moe[key]) for key in _MOE_KEYS + _MOE_OPTIONAL[1:] if key in moe)
        fields.update((key, f"moe.{key}") for key in _MOE_KEYS + _MOE_OPTIONAL)
        if "published_active_params" in moe:
            shape["published_active_params"] = parse_quantity(
                moe["published_active_params"], "count", file=file,
                field="moe.published_active_params")
    if "sliding_window" in data:
        shape.update(_parse_window(data["sliding_window"], data["layers"], file=file))
        fields.update(sliding_window="sliding_window.tokens", window_layers="sliding_window.layers")
    shape.update(
        name=require_str(data["name"], file=file, field="name"),
        display_name=require_str(data["display_name"], file=file, field="display_name"),
        tied_embeddings=require_bool(data["tied_embeddings"], file=file, field="tied_embeddings"),
        published_params=parse_quantity(data["published_params"], "count", file=file,
                                        field="published_params"),
        source=require_str(data["source"], file=file, field="source"),
    )
    return check_shape(shape, file=file, fields=fields)


def _parse_window(value: Any, layers: Any, *, file: str) -> dict[str, Any]:
    """The ``[sliding_window]`` table: ``tokens`` and ``layers`` ("all", "even", "odd" or a
    list of layer numbers)."""
    table = require_table(value, file=file, field="sliding_window")
    check_keys_all(table, required=_WINDOW_KEYS, file=file, prefix="sliding_window.")
    tokens = _int_field(table["tokens"], "sliding_window", file=file,
                        field="sliding_window.tokens")
    if tokens < 1:
        raise ConfigError("expected a window of at least 1 token", file=file,
                          field="sliding_window.tokens")
    chosen = table["layers"]
    count = _int_field(layers, "layers", file=file, field="layers")
    patterns = {"all": range(count), "even": range(0, count, 2), "odd": range(1, count, 2)}
    if isinstance(chosen, str):
        if chosen not in patterns:
            raise ConfigError(f"expected all, even, odd or a list of layer numbers, got "
                              f"{chosen!r}", file=file, field="sliding_window.layers")
        chosen = patterns[chosen]
    elif not isinstance(chosen, list):
        raise ConfigError(f"expected all, even, odd or a list of layer numbers, got {chosen!r}",
                          file=file, field="sliding_window.layers")
    return {"sliding_window": tokens, "window_layers": tuple(chosen)}


# Reading files -----------------------------------------------------------------------------

def read_model_text(path: Path) -> str:
    """The text of a model file: UTF-8 without a byte-order mark, at most MAX_FILE_BYTES."""
    file = str(path)
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read file: {exc.strerror}", file=file) from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"larger than {MAX_FILE_BYTES >> 10} KiB; a model file is a TOML or "
                          "config.json of a few KiB (weights are not read)", file=file)
    return decode_text(raw, file=file)


def read_json_text(text: str, *, file: str) -> dict[str, Any]:
    """Parse a JSON object, refusing NaN/Infinity and nesting Python cannot follow."""
    def constant(name: str) -> Any:
        raise ConfigError(f"{name} is not a JSON number", file=file)

    try:
        data = json.loads(text, parse_constant=constant)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"malformed JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
                          file=file) from None
    except RecursionError:
        raise ConfigError("malformed JSON: nested too deeply", file=file) from None
    if not isinstance(data, dict):
        raise ConfigError(f"expected a JSON object, got {type(data).__name__}", file=file)
    return data


def _is_json(path: Path, text: str) -> bool:
    """A file is read as JSON when named ``.json`` or when it opens with ``{``."""
    return path.suffix.lower() == ".json" or (path.suffix.lower() != ".toml"
                                              and text.lstrip().startswith("{"))


def load_model(path: str | Path) -> Model:
    """Load and validate a model TOML file, a HuggingFace ``config.json``, or a folder holding
    a ``config.json`` (a downloaded HuggingFace model).

    Parameters
    ----------
    path
        The file or folder. A ``.json`` file, or a file whose text opens with ``{``, is read as a
        HuggingFace config (:func:`memsim.hf_config.parse_hf_config`); anything else as a model
        TOML (docs/model-format.md).

    Raises
    ------
    ConfigError
        Naming the file and field, for any file memsim cannot read as a model.
    """
    folder, path = Path(path), model_source(path)
    if folder.is_dir() and not path.is_file():
        raise ConfigError("a folder without a config.json; give a model TOML or a "
                          "HuggingFace config.json", file=str(folder))
    text = read_model_text(path)
    if _is_json(path, text):
        from memsim.hf_config import parse_hf_config     # a sibling data module, loaded on use
        return parse_hf_config(read_json_text(text, file=str(path)), file=str(path),
                               name=str(path))
    try:
        return parse_model(read_toml_text(text, file=str(path)), file=str(path))
    except RecursionError:
        raise ConfigError("malformed TOML: nested too deeply", file=str(path)) from None


# The catalog -------------------------------------------------------------------------------

@functools.cache
def _catalog_names() -> tuple[str, ...]:
    return tuple(catalog_names("memsim.models"))


def model_names() -> list[str]:
    """Names of the catalog's models."""
    return list(_catalog_names())


@functools.cache
def _catalog_model(name: str) -> Model:
    """A catalog model, parsed once per process (Model is frozen, so sharing it is safe)."""
    data, file = read_catalog_entry("memsim.models", name, kind="model", folder="memsim/models")
    return parse_model(data, file=file)


def model_source(path: str | Path) -> Path:
    """The file a model named by path is read from: the file, or a folder's config.json (a
    downloaded HuggingFace model)."""
    path = Path(path)
    return path / "config.json" if path.is_dir() else path


def is_model_path(name: str) -> bool:
    """True when ``name`` names a file or folder rather than a catalog model."""
    return (name.endswith((".toml", ".json")) or "/" in name or "\\" in name
            or (name not in _catalog_names() and Path(name).exists()))


def model(name: str) -> Model:
    """A catalog model by name (``llama-3-70b``), or a model file or folder by path
    (see :func:`load_model`). A catalog model is parsed once per process; later calls are a
    dictionary lookup."""
    if is_model_path(name):
        return load_model(name)
    return _catalog_model(name)
