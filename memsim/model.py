"""Transformer model shapes: loading, validation and derived parameter counts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from memsim.datafile import (catalog_names, check_keys, read_catalog_entry, read_toml_file,
                             require_bool, require_int, require_str, require_table)
from memsim.errors import ConfigError
from memsim.units import parse_quantity


@dataclass(frozen=True)
class Model:
    """A decoder-only transformer with grouped-query attention and a gated (SwiGLU) FFN.

    ``ffn`` is the intermediate size of one FFN block (of one routed expert, for MoE models).
    An MoE model may also have ``shared_experts`` that every token uses (each of size ``ffn``)
    and ``dense_layers`` leading layers with a dense FFN of size ``dense_ffn``.
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
    def attention_params_per_layer(self) -> int:
        """Q, K, V and output projection weights of one layer."""
        q_out = self.heads * self.head_dim
        kv_out = self.kv_heads * self.head_dim
        return self.hidden * (q_out + 2 * kv_out) + q_out * self.hidden

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
        """K and V values one token adds to the cache, over all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim


_MODEL_KEYS = ("schema_version", "name", "display_name", "layers", "hidden", "heads", "kv_heads",
               "head_dim", "ffn", "vocab", "tied_embeddings", "published_params", "source")


def parse_model(data: dict, *, file: str) -> Model:
    """Validate a model file's table and build a Model."""
    check_keys(data, required=_MODEL_KEYS, optional=("moe",), file=file)
    if data["schema_version"] != 1:
        raise ConfigError(f"unsupported schema_version {data['schema_version']!r}; expected 1",
                          file=file, field="schema_version")
    ints = {key: require_int(data[key], file=file, field=key)
            for key in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab")}
    if ints["heads"] % ints["kv_heads"]:
        raise ConfigError(f"heads ({ints['heads']}) must be a multiple of kv_heads "
                          f"({ints['kv_heads']})", file=file, field="kv_heads")
    experts, per_token, active = 1, 1, 0.0
    extra: dict[str, int] = {}
    if "moe" in data:
        moe = require_table(data["moe"], file=file, field="moe")
        check_keys(moe, required=("experts", "experts_per_token"),
                   optional=("published_active_params", "shared_experts", "dense_layers",
                             "dense_ffn"), file=file, prefix="moe.")
        for key in ("shared_experts", "dense_layers", "dense_ffn"):
            if key in moe:
                extra[key] = require_int(moe[key], file=file, field=f"moe.{key}", minimum=0)
        if extra.get("dense_layers", 0) >= ints["layers"]:
            raise ConfigError(f"dense_layers must leave at least one MoE layer of "
                              f"{ints['layers']}", file=file, field="moe.dense_layers")
        experts = require_int(moe["experts"], file=file, field="moe.experts", minimum=2)
        per_token = require_int(moe["experts_per_token"], file=file,
                                field="moe.experts_per_token")
        if per_token > experts:
            raise ConfigError(f"experts_per_token ({per_token}) exceeds experts ({experts})",
                              file=file, field="moe.experts_per_token")
        if "published_active_params" in moe:
            active = parse_quantity(moe["published_active_params"], "count", file=file,
                                    field="moe.published_active_params")
    name = require_str(data["name"], file=file, field="name")
    return Model(
        name=name,
        display_name=require_str(data["display_name"], file=file, field="display_name"),
        tied_embeddings=require_bool(data["tied_embeddings"], file=file, field="tied_embeddings"),
        experts=experts, experts_per_token=per_token,
        published_params=parse_quantity(data["published_params"], "count", file=file,
                                        field="published_params"),
        published_active_params=active,
        source=require_str(data["source"], file=file, field="source"),
        **ints, **extra,
    )


def load_model(path: str | Path) -> Model:
    """Load and validate a model file."""
    return parse_model(read_toml_file(path), file=str(path))


def model_names() -> list[str]:
    """Names of the catalog's models."""
    return catalog_names("memsim.models")


def model(name: str) -> Model:
    """A catalog model by name (``llama-3-70b``), or a model file by path."""
    if name.endswith(".toml"):
        return load_model(name)
    data, file = read_catalog_entry("memsim.models", name, kind="model", folder="memsim/models")
    return parse_model(data, file=file)
