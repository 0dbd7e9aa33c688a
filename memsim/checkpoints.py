"""Weight formats per tensor, as published checkpoints store them.

A checkpoint is rarely one format throughout. GPTQ/AWQ and the NVIDIA ModelOpt / llm-compressor
fp8, int8 and nvfp4 checkpoints quantize the linear layers of the decoder and keep the embedding
and the LM head in 16 bits; llama.cpp's files store ``output.weight`` at Q6_K, and its ``Q4_K_M``
and ``Q5_K_M`` mixtures give half the layers' ``attn_v`` and ``ffn_down`` more bits.
:func:`weight_formats` turns what a user writes into a :class:`WeightFormats`, and
:meth:`WeightFormats.for_tensor` answers the format of one tensor.

Spelling (CLI ``--weights``, study rows, ``Decode(weights=...)``):

- ``"int4-g128"``: a format name; every role follows what the checkpoints of that format do
  (table below).
- ``"q4_k_m"``, ``"q5_k_m"``, ``"q4_k_s"``: llama.cpp's per-tensor mixtures.
- ``"int4-g128,lm_head=bf16,embedding=bf16"``: a format or mixture, then ``role=format``
  overrides separated by commas, no spaces. ``embed`` is accepted for ``embedding``; ``qkv``,
  ``experts`` and ``shared_experts`` set all their parts.
- ``"uniform:int4-g128"``: every weight in that one format, checkpoint defaults off (memsim's
  behaviour before per-role formats). Overrides may follow.
- ``{"default": "int4-g128", "embed": "bf16", "lm_head": "bf16"}``: the same as a mapping.

Roles (:data:`ROLES`): ``embedding``, ``q``, ``k``, ``v``, ``o_proj``, ``gate``, ``up``,
``down``, ``router``, ``expert_gate``, ``expert_up``, ``expert_down``, ``shared_gate``,
``shared_up``, ``shared_down``, ``lm_head``, ``draft_head``; the groups ``qkv``, ``experts`` and
``shared_experts`` (:data:`ROLE_GROUPS`) answer when their parts agree. Norms
(:data:`NORM_ROLES`) are not weights of a checkpoint format: :meth:`~WeightFormats.for_tensor`
returns ``None`` for them and the plan keeps them in the activation type (llama.cpp stores them
in F32, the HF checkpoints in 16 bits; a norm is ``hidden`` values).

Checkpoint defaults of the plain format names ([sources] below):

================================  =========  ========  ======  ============================
format                            embedding  lm_head   router  every other weight
================================  =========  ========  ======  ============================
bf16, fp16, fp32                  same       same      same    same
int4-gN, int8, fp8-*, mxfp8,      bf16       bf16      bf16    the format
nvfp4, mxfp4
q4_0, q5_0, q5_1                  the format q6_k      fp32    the format
q8_0                              q8_0       q8_0      fp32    q8_0
q4_k, q5_k, q6_k                  the format q6_k      fp32    the format
q4_k_m, q5_k_m, q4_k_s            see :func:`llama_cpp_type`
================================  =========  ========  ======  ============================

``draft_head`` (Medusa-style heads, not part of any cited checkpoint) follows ``lm_head``: a
memsim choice [D]. A model with tied embeddings stores one table for the embedding and the LM
head; ``for_tensor(..., tied=True)`` gives both the same format: an explicit override of either
(two that differ are an error), else llama.cpp's rule for its own files (the tied
``token_embd`` is quantized as ``output.weight``), else the embedding's default.

Example
-------
>>> wf = weight_formats("q4_k_m")
>>> wf.for_tensor("v", 0, 32).name, wf.for_tensor("v", 4, 32).name, wf.qkv_split(0, 32)
('q6_k', 'q4_k', True)
>>> weight_formats({"default": "int4-g128", "embed": "int4-g128"}).name
'int4-g128,embedding=int4-g128'

[sources]
llama.cpp quantizer: ggml-org/llama.cpp ``src/llama-quant.cpp`` at commit
007dbbf3fd17eefe9b47fee45f48f7ba5e62b714: ``llama_tensor_get_type_impl`` (per-ftype rules,
``use_more_bits``), ``tensor_type_fallback`` (a row length the block does not divide),
``tensor_allows_quantization`` (norms and ``ffn_gate_inp`` are never quantized),
``init_quantize_state_counters`` (``n_attention_wv`` counts attn_v tensors, ``n_ffn_down`` is
``n_layer``) [V]. Tensors are visited in layer order (``weight_name_comparer`` in
``src/llama-model-loader.h``), so the attn_v counter is the layer index [V].
llama.cpp converter: ``convert_hf_to_gguf.py`` stores norms, 1-D tensors and ``ffn_gate_inp``
(the MoE router) in F32 [V].
Check: llama.cpp loads Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf as "type q4_K: 193 tensors,
type q6_K: 33 tensors", "file size = 4.58 GiB (4.89 BPW)" (Ollama server logs quoted on GitHub)
and "CPU_Mapped model buffer size = 4685.30 MiB" (an ik_llama.cpp discussion, 2025-05-20) [V];
bartowski/Meta-Llama-3-8B-Instruct-GGUF lists the file at 4.92 GB [V]. The per-tensor types
here reproduce the counts and the 4685.30 MiB exactly (tests/test_weight_formats.py).
GPTQ/AWQ: AutoGPTQ/GPTQModel and AutoAWQ quantize the ``nn.Linear`` layers of the decoder
blocks; ``embed_tokens`` is an ``nn.Embedding`` and ``lm_head`` is left out by default, both
stored in the checkpoint's 16-bit dtype (fp16 or bf16: the same bytes) [V/D].
NVIDIA ModelOpt: the unified HF export writes ``"exclude_modules": ["lm_head"]`` for FP8,
NVFP4 and INT4-AWQ (``modelopt/torch/export``), and its default configs disable the router
(``*router*``, ``*mlp.gate.*``) [V/D]. llm-compressor's FP8/W8A8/NVFP4 recipes use
``ignore=["lm_head"]`` (MoE recipes add ``re:.*mlp.gate$``) [V/D]. DeepSeek-V3's block-fp8
checkpoint keeps the embedding, the head and the router in bf16 [V]. gpt-oss's MXFP4 checkpoint
quantizes only the MoE experts (attention stays bf16); memsim's ``mxfp4`` quantizes every linear
layer and keeps the embedding, head and router in bf16, so ``mxfp4,q=bf16,...`` overrides are
needed to mirror gpt-oss exactly [D].
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from memsim.errors import ConfigError
from memsim.formats import FORMATS, Format, get_format

#: Weight roles a plan asks about, in the order names are written.
ROLES = ("embedding", "q", "k", "v", "o_proj", "gate", "up", "down", "router",
         "expert_gate", "expert_up", "expert_down", "shared_gate", "shared_up", "shared_down",
         "lm_head", "draft_head")
#: A fused tensor of the plan and the roles it is made of.
ROLE_GROUPS = {"qkv": ("q", "k", "v"),
               "experts": ("expert_gate", "expert_up", "expert_down"),
               "shared_experts": ("shared_gate", "shared_up", "shared_down")}
#: Norm weights: kept in the activation type (``for_tensor`` returns None).
NORM_ROLES = ("attn_norm", "ffn_norm", "final_norm")
ROLE_ALIASES = {"embed": "embedding"}

#: llama.cpp's per-tensor mixtures (ftype name -> its default tensor type).
MIXTURES = {"q4_k_m": "q4_k", "q5_k_m": "q5_k", "q4_k_s": "q4_k"}

UNIFORM_PREFIX = "uniform:"

_LLAMA_CPP = ("q4_0", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k")
# llama.cpp's tensor_type_fallback: the type a tensor gets when its row length is not a
# multiple of the chosen type's block; F16 when even that block does not divide it.
_FALLBACK = {"q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0"}
_EMBEDDING_LIKE = ("embedding", "lm_head", "draft_head")


def use_more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's ``use_more_bits``: the first and last eighth of the layers, and every third
    layer between them (C integer division; ``layer - n_layers/8`` is never negative where the
    modulo is reached)."""
    eighth = n_layers // 8
    return layer < eighth or layer >= 7 * n_layers // 8 or (layer - eighth) % 3 == 2


def llama_cpp_type(ftype: str, role: str, layer: int, n_layers: int, *, n_experts: int = 0,
                   tied: bool = False) -> str:
    """The tensor type llama.cpp's quantizer picks for ``role`` in a file of ``ftype``.

    ``ftype`` is a plain llama.cpp type (``q4_0`` ... ``q6_k``: every weight that type, the
    output Q6_K as llama.cpp does for every type but Q8_0) or a mixture (``q4_k_m``,
    ``q5_k_m``, ``q4_k_s``). Rules that need what memsim does not model are stated, not
    applied: no importance matrix; not Falcon; the ``LLM_TYPE_70B`` bump of attn_v from Q4_K to
    Q5_K (Llama 2/3 70B, Qwen 72B: 40 x 8192 x 1024 weights one bit wider in Llama 3 70B
    Q4_K_M, 42 MB of 42.5 GB); fused ``attn_qkv`` tensors (treated as attn_v by llama.cpp;
    memsim's q, k and v are the separate ``attn_q/k/v`` of Llama-style GGUFs). ``n_experts ==
    8`` (Mixtral) is applied: attn_v and attn_k Q8_0 in a file of any type (llama.cpp's
    ``llama_tensor_get_type`` runs for every quantized type but ``--pure``), attn_output Q5_K
    in Q4_K_M and Q4_K_S.
    The row-length fallback is applied by :meth:`WeightFormats.for_tensor` when given ``k``.
    """
    base = MIXTURES.get(ftype, ftype)
    if role in ("lm_head", "draft_head") or (role == "embedding" and tied):
        return "q8_0" if base == "q8_0" else "q6_k"
    if role == "router":
        return "fp32"
    if role in ("k", "v") and n_experts == 8:    # whatever the type (not only the mixtures)
        return "q8_0"
    if ftype not in MIXTURES:
        return base
    if role == "v":
        if ftype in ("q4_k_m", "q5_k_m") and use_more_bits(layer, n_layers):
            return "q6_k"
        if ftype == "q4_k_s" and layer < 4:
            return "q5_k"
        return base
    if role == "o_proj" and n_experts == 8 and ftype in ("q4_k_m", "q4_k_s"):
        return "q5_k"
    if role in ("down", "expert_down", "shared_down"):
        if ftype in ("q4_k_m", "q5_k_m") and use_more_bits(layer, n_layers):
            return "q6_k"
        if ftype == "q4_k_s" and layer < n_layers // 8:
            return "q5_k"
    return base


def _checkpoint_default(base: str, role: str, layer: int, n_layers: int, n_experts: int,
                        tied: bool) -> str:
    """The format a checkpoint of ``base`` stores ``role`` in (the module's table)."""
    if base in MIXTURES or base in _LLAMA_CPP:
        return llama_cpp_type(base, role, layer, n_layers, n_experts=n_experts, tied=tied)
    if base in ("bf16", "fp16", "fp32"):
        return base
    if role in _EMBEDDING_LIKE or role == "router":
        return "bf16"
    return base


def _llama_cpp_fallback(name: str, k: int, *, file_block: int, output: bool) -> str:
    """llama.cpp's type for a tensor of row length ``k`` (``tensor_type_fallback``).

    The output tensor becomes Q8_0 when the file's own block does not divide ``k``; any
    K-quant whose 256-block does not divide ``k`` becomes Q5_0 / Q5_1 / Q8_0, and a row that
    not even 32 divides is stored F16 (llama.cpp refuses to write Q4_0/Q8_0 files of such
    tensors; memsim keeps them 16-bit).
    """
    if output and k % file_block:
        name = "q8_0"
    group = get_format(name).group
    if not group or k % group == 0:
        return name
    replacement = _FALLBACK.get(name, "fp16")
    return replacement if k % 32 == 0 else "fp16"


@dataclass(frozen=True)
class WeightFormats:
    """The storage format of every weight of a checkpoint, by role and layer.

    Attributes
    ----------
    base : a format name (``int4-g128``) or a llama.cpp mixture (``q4_k_m``).
    uniform : every role in ``base`` (no checkpoint defaults); only for a format name.
    overrides : ``(role, format name)`` pairs the user gave, one per role, in :data:`ROLES`
        order; they win over the defaults.
    """

    base: str
    uniform: bool = False
    overrides: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.uniform, bool):
            raise ConfigError(f"uniform must be True or False, got {self.uniform!r}",
                              field="weights")
        base, _ = _base((UNIFORM_PREFIX if self.uniform else "") + str(self.base), "weights",
                        None)
        if base != self.base:
            raise ConfigError(f"expected a format or mixture name, got {self.base!r}",
                              field="weights")
        pairs = tuple((str(role), str(name)) for role, name in self.overrides)
        roles = [role for role, _ in pairs]
        if roles != [role for role in ROLES if role in roles]:
            raise ConfigError(f"overrides must be (role, format) pairs, one per role of "
                              f"{', '.join(ROLES)}, in that order; got {roles}", field="weights")
        for role, name in pairs:
            _check_format_name(name, f"weights.{role}", None)
        object.__setattr__(self, "overrides", pairs)

    @property
    def name(self) -> str:
        """The canonical spelling, for reports and study keys (same as :meth:`to_spec`)."""
        return self.to_spec()

    def to_spec(self) -> str:
        """The canonical string; ``weight_formats(wf.to_spec()) == wf``."""
        given = dict(self.overrides)
        items = []
        for role in ROLES:
            if role not in given:
                continue
            group = next((g for g, parts in ROLE_GROUPS.items() if role in parts), None)
            if group is not None:
                parts = ROLE_GROUPS[group]
                if all(given.get(p) == given[role] for p in parts):
                    if role == parts[0]:
                        items.append(f"{group}={given[role]}")
                    continue
            items.append(f"{role}={given[role]}")
        head = (UNIFORM_PREFIX if self.uniform else "") + self.base
        return ",".join([head] + items)

    def __str__(self) -> str:
        return self.to_spec()

    def for_tensor(self, role: str, layer: int, n_layers: int, *, n_experts: int = 0,
                   tied: bool = False, k: int | None = None) -> Format | None:
        """The format of one weight tensor.

        Parameters
        ----------
        role : a name of :data:`ROLES`, a group of :data:`ROLE_GROUPS` (answered when its parts
            agree; a ``ValueError`` otherwise) or a norm of :data:`NORM_ROLES` (``None``: norms
            stay in the activation type).
        layer, n_layers : the tensor's layer (-1 for the embedding, head and draft heads) and
            the model's layer count (the mixtures depend on both).
        n_experts : routed experts per MoE layer (0 for a dense model); llama.cpp's mixtures
            treat 8-expert models apart.
        tied : the model's embedding and LM head are one table (both roles answer its format).
        k : the unsharded tensor's row length (contraction axis; the hidden size for the
            embedding). When given, a llama.cpp type whose block does not divide it becomes
            llama.cpp's fallback (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, else F16; an
            output tensor becomes Q8_0).
        """
        if role in NORM_ROLES:
            return None
        if role in ROLE_GROUPS:
            parts = [self.for_tensor(p, layer, n_layers, n_experts=n_experts, tied=tied, k=k)
                     for p in ROLE_GROUPS[role]]
            if any(p != parts[0] for p in parts):
                names = ", ".join(f"{r}={p.name}" for r, p in zip(ROLE_GROUPS[role], parts))
                raise ValueError(f"{role} of layer {layer} is not one format ({names}); ask "
                                 f"for_tensor for each part and plan them as separate matmuls"
                                 f" (qkv_split tells when q, k and v differ)")
            return parts[0]
        if role not in ROLES:
            raise ConfigError(f"unknown weight role {role!r}; expected one of "
                              f"{', '.join(ROLES + tuple(ROLE_GROUPS) + NORM_ROLES)}",
                              field="role")
        name, explicit = self._name_for(role, layer, n_layers, n_experts, tied)
        if k is not None and not explicit and not self.uniform and (
                self.base in MIXTURES or self.base in _LLAMA_CPP):
            name = _llama_cpp_fallback(name, k, file_block=get_format(
                MIXTURES.get(self.base, self.base)).group or 1,
                output=role in ("lm_head", "draft_head") or (tied and role == "embedding"))
        return get_format(name)

    def qkv_split(self, layer: int, n_layers: int, *, n_experts: int = 0,
                  k: int | None = None) -> bool:
        """True when q, k and v of ``layer`` differ in format: the plan must emit separate
        q, k and v matmuls instead of one fused ``qkv``."""
        names = {self.for_tensor(r, layer, n_layers, n_experts=n_experts, k=k)
                 for r in ROLE_GROUPS["qkv"]}
        return len(names) > 1

    def _name_for(self, role: str, layer: int, n_layers: int, n_experts: int,
                  tied: bool) -> tuple[str, bool]:
        """The format name of ``role`` and whether the user gave it explicitly."""
        given = dict(self.overrides)
        if tied and role in ("embedding", "lm_head"):
            if "embedding" in given and "lm_head" in given \
                    and given["embedding"] != given["lm_head"]:
                raise ConfigError(
                    f"the embedding and the LM head are one table in this model (tied "
                    f"embeddings) but {self.to_spec()!r} gives them {given['embedding']} and "
                    f"{given['lm_head']}; give them one format", field="weights")
            for r in ("embedding", "lm_head"):
                if r in given:
                    return given[r], True
        elif role in given:
            return given[role], True
        return _default_name(self, role, layer, n_layers, n_experts, tied), False


def _default_name(wf: WeightFormats, role: str, layer: int, n_layers: int, n_experts: int,
                  tied: bool) -> str:
    if wf.uniform:
        return wf.base
    if tied and role == "lm_head":
        role = "embedding"          # one table: the embedding's rule (llama.cpp: the output's)
    return _checkpoint_default(wf.base, role, layer, n_layers, n_experts, tied)


def _check_format_name(name: object, field: str, file: str | None) -> str:
    if not isinstance(name, str):
        raise ConfigError(f"expected a format name such as 'bf16', got {name!r}", file=file,
                          field=field)
    return get_format(name, field=field, file=file).name


def _base(text: object, field: str, file: str | None) -> tuple[str, bool]:
    if not isinstance(text, str):
        raise ConfigError(f"expected a format or mixture name such as 'int4-g128', got "
                          f"{text!r}", file=file, field=field)
    uniform = text.startswith(UNIFORM_PREFIX)
    name = text[len(UNIFORM_PREFIX):] if uniform else text
    if name in MIXTURES:
        if uniform:
            raise ConfigError(f"{name!r} is a mixture of formats; 'uniform:' takes one format "
                              f"such as 'uniform:q4_k'", file=file, field=field)
        return name, False
    try:
        return get_format(name, field=field, file=file).name, uniform
    except ConfigError as error:
        if not error.reason.startswith("unknown format"):
            raise
        raise ConfigError(f"{error.reason}; or a llama.cpp mixture ({', '.join(MIXTURES)}), "
                          f"optionally followed by role=format overrides", file=file,
                          field=field) from None


def _expand(key: object, field: str, file: str | None) -> tuple[str, ...]:
    role = ROLE_ALIASES.get(key, key) if isinstance(key, str) else key
    if role in ROLES:
        return (role,)
    if role in ROLE_GROUPS:
        return ROLE_GROUPS[role]
    valid = ", ".join(ROLES + tuple(ROLE_GROUPS) + tuple(ROLE_ALIASES))
    extra = " (norms stay in the activation type)" if role in NORM_ROLES else ""
    raise ConfigError(f"unknown weight role {key!r}{extra}; expected 'default' or one of "
                      f"{valid}", file=file, field=field)


def weight_formats(spec: object, field: str = "weights", *,
                   file: str | None = None) -> WeightFormats:
    """Parse a per-tensor weight-format spec (see the module docstring for the spellings).

    Errors are ``ConfigError`` naming ``field`` (``weights.lm_head`` for one role's format).
    """
    if isinstance(spec, WeightFormats):
        return spec
    if isinstance(spec, Format):
        spec = spec.name
    if isinstance(spec, str):
        head, *items = spec.split(",")
        pairs = []
        for item in items:
            role, sep, value = item.partition("=")
            if not sep or not role or not value:
                raise ConfigError(f"expected role=format after the first item of {spec!r}, got "
                                  f"{item!r} (e.g. 'int4-g128,lm_head=bf16')", file=file,
                                  field=field)
            pairs.append((role, value))
    elif isinstance(spec, Mapping):
        if "default" not in spec:
            raise ConfigError(f"a mapping of formats needs a 'default' key, got keys "
                              f"{sorted(map(str, spec))}", file=file, field=field)
        head = spec["default"]
        if isinstance(head, str) and "," in head:
            raise ConfigError(f"'default' takes one format or mixture, got {head!r}", file=file,
                              field=f"{field}.default")
        pairs = [(role, value) for role, value in spec.items() if role != "default"]
    else:
        raise ConfigError(f"expected a format name, 'format,role=format,...' or a mapping "
                          f"{{'default': ..., role: format}}, got {spec!r}", file=file,
                          field=field)
    base, uniform = _base(head, field, file)
    given: dict[str, str] = {}
    seen: set[object] = set()
    # a group (qkv, experts) first, so that one of its parts given beside it wins
    for key, value in sorted(pairs, key=lambda pair: pair[0] not in ROLE_GROUPS):
        name = ROLE_ALIASES.get(key, key) if isinstance(key, str) else key
        if name in seen:
            raise ConfigError(f"the format of {name} is given twice", file=file,
                              field=f"{field}.{name}")
        seen.add(name)
        for role in _expand(key, field, file):
            given[role] = _check_format_name(value, f"{field}.{name}", file)
    overrides = tuple((role, given[role]) for role in ROLES if role in given)
    return WeightFormats(base, uniform, overrides)


def weight_format_names() -> tuple[str, ...]:
    """Every base name :func:`weight_formats` accepts by name: catalog formats and mixtures."""
    return tuple(FORMATS) + tuple(MIXTURES)


# Activations ---------------------------------------------------------------------------------

#: Usual activation type by weight format, with its source. Weight-only formats (W8A16, W4A16)
#: dequantize to 16 bits; W8A8 / W4A4 formats quantize the activations too.
_ACTIVATIONS = {
    "fp32": ("fp32", "unquantized"),
    "bf16": ("bf16", "unquantized"),
    "fp16": ("fp16", "unquantized"),
    "int8": ("bf16", "W8A16 per-channel weight-only (TRT-LLM int8 weight-only, vLLM "
                     "compressed-tensors W8A16) [V]; SmoothQuant W8A8 is the explicit "
                     "activations='int8' choice"),
    "fp8-e4m3": ("fp8-e4m3", "W8A8: ModelOpt/TRT-LLM FP8 quantizes activations per tensor with "
                             "a static FP32 scale (32 bits per tensor) [V]"),
    "fp8-e5m2": ("fp8-e4m3", "as fp8-e4m3: E4M3 activations are the FP8 GEMM input on Hopper "
                             "and Blackwell [D]"),
    "fp8-e4m3-b128": ("fp8-e4m3-b128", "DeepSeek-V3: activations quantized per 1x128 tile "
                                       "with an FP32 scale (32 bits per 128 values) [V]"),
    "mxfp8": ("mxfp8", "OCP MX: MXFP8 x MXFP8 matmuls, an E8M0 scale per 32 values [V]"),
    "nvfp4": ("nvfp4", "W4A4: TRT-LLM / ModelOpt NVFP4 quantizes activations dynamically to "
                       "NVFP4, an FP8 E4M3 scale per 16 values plus an FP32 global scale per "
                       "tensor (8 bits per 16 + 32 per tensor) [V]"),
    "mxfp4": ("bf16", "gpt-oss MXFP4 checkpoints run W4A16 in the reference and vLLM Hopper "
                      "kernels; Blackwell TRT-LLM also offers MXFP4 x MXFP8 (W4A8) [V/D]"),
}


def usual_activations(weights_format_name: str) -> str:
    """The activation type a checkpoint of this weight format usually runs with.

    Weight-only formats (``int8``, ``int4-gN``, llama.cpp's types and mixtures, ``mxfp4``) run
    W8A16/W4A16: ``"bf16"``. FP8 checkpoints run W8A8 (``"fp8-e4m3"``, a per-tensor FP32 scale),
    DeepSeek-style block FP8 quantizes activations per 1x128 tile (``"fp8-e4m3-b128"``), NVFP4
    runs W4A4 (``"nvfp4"``: an E4M3 scale per 16 values and an FP32 scale per tensor).

    llama.cpp: its CUDA kernels (mmvq, mmq) and CPU dot products quantize the activations on
    the fly to 8-bit blocks (q8_1: 32 int8 + two FP16 = 36 B per 32 values on CUDA; Q8_K:
    256 int8 + FP32 scale + 16 int16 sums = 292 B per 256 on CPU) and run integer dot
    products, while Metal keeps float activations. The 16-bit answer here is the Metal and
    dequantize-then-GEMM view; the int8 path is not modelled by this table.

    ``weights_format_name`` may be a :class:`WeightFormats` spec; its base decides.
    """
    base, _ = _base(weight_formats(weights_format_name).base, "weights", None)
    if base in _ACTIVATIONS:
        return _ACTIVATIONS[base][0]
    return "bf16"      # int4-gN (W4A16: GPTQ/AWQ with Marlin, fpA_intB), llama.cpp types
