"""Numeric storage formats of weights and KV caches, with the exact storage cost of a tensor.

Convention: the *last* axis of a shape is the contraction axis along which quantization groups
run (a linear layer's weight is ``(out_features, in_features)``; a KV cache row is one token's
``head_dim`` values of one head). Every leading axis is a row. Costs are counted in bits and
are exact: a group format stores ``ceil(K / group)`` groups per row, each with its metadata; a
block format (``block_padded``) stores a ragged last block whole, padded, as llama.cpp and the OCP
MX formats do; per-tensor metadata (a global scale) is stored once.

llama.cpp's K-quants are block formats of 256-weight super-blocks whose metadata (the super-block
scales and the packed 6- or 8-bit sub-block scales) is counted as the block's metadata, so that
``element_bits * 256 + group_meta_bits`` is the C struct's size in bits:

=====  ===================================================  =====  ==========
name   block (ggml-common.h, QK_K = 256)                    bytes  bits/weight
=====  ===================================================  =====  ==========
q4_k   d, dmin (fp16) + scales[12] + qs[128]                144    4.5
q5_k   d, dmin (fp16) + scales[12] + qh[32] + qs[128]       176    5.5
q6_k   ql[128] + qh[64] + scales[16] (int8) + d (fp16)      210    6.5625
q5_0   d (fp16) + qh[4] + qs[16], 32 weights                22     5.5
q5_1   d, m (fp16) + qh[4] + qs[16], 32 weights             24     6
=====  ===================================================  =====  ==========

Source: ggml-org/llama.cpp ``ggml/src/ggml-common.h`` at commit
01243c587feceaa5d6a6c2305535ef2f549c48b8 (the ``static_assert`` on each struct's size) [V].
llama.cpp's quantizer never writes a ragged super-block: a tensor whose rows its block does not
divide falls back to another type (see :mod:`memsim.checkpoints`); the padded cost here is what a
ragged block would cost if one were stored.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from memsim.errors import ConfigError

#: Compute classes a device may run natively on its matrix units.
COMPUTE_CLASSES = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp6", "fp4", "int4")


@dataclass(frozen=True)
class Format:
    """One storage format.

    Attributes
    ----------
    name : catalog name (``int4-g128``).
    element_bits : payload bits per element.
    group : elements per quantization group along the last axis; 0 means one group per row
        (per output channel); ``None`` means no per-group metadata.
    group_meta_bits : metadata bits per group (scale, zero point).
    block_padded : a ragged last group is stored as a whole block.
    tensor_meta_bits : metadata stored once per tensor (a global FP32 scale).
    compute : the compute class a device needs to use it without dequantization.
    dequant_ops : vector operations per element to convert it to the activation type when the
        device lacks a native path (unpack, subtract zero, multiply by scale) [E]: the matrix
        path's dequantization, and a GEMV's when its runtime counts no instructions for the
        format; a runtime's ``[gemv.FORMAT]`` count replaces it for that runtime's GEMV
        (:mod:`memsim.instructions`).
    description, source : what it is and where the layout comes from.
    """

    name: str
    element_bits: int
    group: int | None
    group_meta_bits: int
    block_padded: bool
    tensor_meta_bits: int
    compute: str
    dequant_ops: int
    description: str
    source: str

    def tensor_bits(self, shape: Sequence[int]) -> int:
        """Exact storage of a tensor of ``shape`` in bits, metadata included."""
        rows, k = _rows_and_k(shape, self.name)
        if rows == 0 or k == 0:
            return 0
        if self.group is None:
            return rows * k * self.element_bits + self.tensor_meta_bits
        group = k if self.group == 0 else self.group
        groups = -(-k // group)
        payload_elements = groups * group if self.block_padded else k
        return (rows * payload_elements * self.element_bits
                + rows * groups * self.group_meta_bits + self.tensor_meta_bits)

    def bits_per_element(self, k: int = 4096) -> float:
        """Effective bits per element of a row of length ``k``, group metadata included."""
        return (self.tensor_bits((1, k)) - self.tensor_meta_bits) / k

    def kernel_params(self, k: int) -> tuple[int, int, int, int, int]:
        """Plain integers a kernel needs to cost a tile of a row of length ``k``.

        Returns ``(element_bits, group, group_meta_bits, block_padded, tensor_meta_bits)`` with
        ``group`` resolved to elements (``k`` for per-row groups, 0 for no groups).
        """
        if self.group is None:
            group = 0
        elif self.group == 0:
            group = max(k, 1)
        else:
            group = self.group
        return (self.element_bits, group, self.group_meta_bits, int(self.block_padded),
                self.tensor_meta_bits)


def _rows_and_k(shape: Sequence[int], name: str) -> tuple[int, int]:
    if len(shape) == 0:
        raise ConfigError("a tensor shape needs at least one axis", field="shape")
    for n in shape:
        if isinstance(n, bool) or int(n) != n or n < 0:
            raise ConfigError(f"shape axes must be non-negative integers, got {tuple(shape)}",
                              field="shape")
    rows = math.prod(int(n) for n in shape[:-1])
    return rows, int(shape[-1])


def _fixed(name: str, bits: int, compute: str, description: str, *, tensor_meta_bits: int = 0,
           dequant_ops: int = 0, source: str = "IEEE 754 / bfloat16") -> Format:
    return Format(name, bits, None, 0, False, tensor_meta_bits, compute, dequant_ops,
                  description, source)


#: Largest quantization group a format name may ask for (``int4-gN``): 2**20 elements, far above
#: any published checkpoint (GPTQ/AWQ use 32 to 128, or one group per row).
MAX_GROUP = 2**20


def _int4_group(group: int) -> Format:
    return Format(
        f"int4-g{group}", 4, group, 16 + 4, False, 0, "int4", 3,
        f"4-bit integers, FP16 scale and packed 4-bit zero point per {group} inputs (GPTQ/AWQ)",
        "GPTQ/AWQ packed layout: scales [groups, N] fp16, qzeros [groups, N/8] int32; "
        "devices.md section 5 (4.156 bpw at g128) [D]",
    )


_BUILTIN = (
    _fixed("fp32", 32, "fp32", "IEEE single precision"),
    _fixed("bf16", 16, "bf16", "bfloat16"),
    _fixed("fp16", 16, "fp16", "IEEE half precision"),
    _fixed("fp8-e4m3", 8, "fp8", "FP8 E4M3 with one FP32 scale per tensor", tensor_meta_bits=32,
           dequant_ops=1, source="OCP FP8 / NVIDIA Transformer Engine; devices.md section 5 [V]"),
    _fixed("fp8-e5m2", 8, "fp8", "FP8 E5M2 with one FP32 scale per tensor", tensor_meta_bits=32,
           dequant_ops=1, source="OCP FP8 / NVIDIA Transformer Engine; devices.md section 5 [V]"),
    Format("fp8-e4m3-b128", 8, 128, 32, False, 0, "fp8", 2,
           "FP8 E4M3 with an FP32 scale per block of 128 inputs (1x128 tiles, as DeepSeek-V3)",
           "DeepSeek-V3 report (1x128 activation tiles); devices.md section 5 [V/D]"),
    Format("mxfp8", 8, 32, 8, True, 0, "fp8", 2,
           "OCP MXFP8 (E4M3): blocks of 32 with an E8M0 scale",
           "OCP Microscaling Formats v1.0 [V]"),
    Format("int8", 8, 0, 16, False, 0, "int8", 2,
           "8-bit integers with one FP16 scale per output channel",
           "per-channel weight quantization (SmoothQuant/LLM.int8 style); devices.md section 5 [D]"),
    _int4_group(128),
    Format("nvfp4", 4, 16, 8, True, 32, "fp4", 2,
           "NVFP4 (E2M1): blocks of 16 with an FP8 E4M3 scale, plus one FP32 scale per tensor",
           "NVIDIA Blackwell NVFP4 docs; devices.md section 5 (4.5 bpw) [V]"),
    Format("mxfp4", 4, 32, 8, True, 0, "fp4", 2,
           "OCP MXFP4 (E2M1): blocks of 32 with an E8M0 scale",
           "OCP Microscaling Formats v1.0; devices.md section 5 (4.25 bpw) [V]"),
    Format("q8_0", 8, 32, 16, True, 0, "int8", 2,
           "llama.cpp Q8_0: blocks of 32 int8 with an FP16 scale (34 B per block)",
           "ggml-common.h block_q8_0 [V]"),
    Format("q4_0", 4, 32, 16, True, 0, "int4", 3,
           "llama.cpp Q4_0: blocks of 32 4-bit values with an FP16 scale (18 B per block)",
           "ggml-common.h block_q4_0 [V]"),
    # 5- and 6-bit values have no matrix unit of their own: their compute class is int8, the
    # type llama.cpp's int8 kernels (mmq/mmvq) unpack them to. Dequantization operations per
    # element: unpack, merge the high bits, subtract the offset or minimum, scale [D].
    Format("q5_0", 5, 32, 16, True, 0, "int8", 4,
           "llama.cpp Q5_0: blocks of 32 5-bit values (4 low bits + 1 high bit) with an FP16 "
           "scale (22 B per block)", "ggml-common.h block_q5_0 [V]"),
    Format("q5_1", 5, 32, 32, True, 0, "int8", 4,
           "llama.cpp Q5_1: blocks of 32 5-bit values with an FP16 scale and minimum (24 B per "
           "block)", "ggml-common.h block_q5_1 [V]"),
    Format("q4_k", 4, 256, 16 * 8, True, 0, "int4", 3,
           "llama.cpp Q4_K: super-blocks of 256 4-bit values in 8 blocks of 32, 6-bit scales and "
           "minimums, FP16 super-scale and super-minimum (144 B per super-block)",
           "ggml-common.h block_q4_K (static_assert 2*2 + 12 + 128 = 144 B) [V]"),
    Format("q5_k", 5, 256, 16 * 8, True, 0, "int8", 4,
           "llama.cpp Q5_K: super-blocks of 256 5-bit values in 8 blocks of 32, 6-bit scales and "
           "minimums, FP16 super-scale and super-minimum (176 B per super-block)",
           "ggml-common.h block_q5_K (static_assert 2*2 + 12 + 128 + 32 = 176 B) [V]"),
    Format("q6_k", 6, 256, 18 * 8, True, 0, "int8", 4,
           "llama.cpp Q6_K: super-blocks of 256 6-bit values in 16 blocks of 16, int8 scales, "
           "FP16 super-scale (210 B per super-block)",
           "ggml-common.h block_q6_K (static_assert 2 + 16 + 3*256/4 = 210 B) [V]"),
)

FORMATS: dict[str, Format] = {f.name: f for f in _BUILTIN}
for _g in (32, 64):
    FORMATS[f"int4-g{_g}"] = _int4_group(_g)

_INT4_GROUP = re.compile(r"int4-g([1-9][0-9]*)")


def get_format(name: str, *, field: str = "format", file: str | None = None) -> Format:
    """Look up a format by name; ``int4-gN`` works for any group size 8 <= N <= ``MAX_GROUP``."""
    if isinstance(name, Format):
        return name
    if isinstance(name, str):
        if name in FORMATS:
            return FORMATS[name]
        match = _INT4_GROUP.fullmatch(name)
        if match:
            digits = match.group(1)
            # compare the digit count first: int() of a 5,000-digit string is itself an error
            if len(digits) > len(str(MAX_GROUP)) or int(digits) > MAX_GROUP:
                raise ConfigError(f"group size of {name[:40]!r} is out of range: int4-gN needs "
                                  f"8 <= N <= {MAX_GROUP} (2**20)", file=file, field=field)
            if int(digits) >= 8:
                return _int4_group(int(digits))
    known = ", ".join(sorted(FORMATS))
    shown = repr(name) if not isinstance(name, str) or len(name) <= 60 else repr(name[:60] + "...")
    raise ConfigError(f"unknown format {shown}; expected one of {known} (or int4-gN, "
                      f"8 <= N <= {MAX_GROUP})", file=file, field=field)


def bytes_for(shape: Sequence[int], fmt: str | Format) -> int:
    """Exact bytes to store a tensor of ``shape`` in ``fmt`` (last axis grouped), metadata included."""
    bits = get_format(fmt).tensor_bits(shape)
    return -(-bits // 8)
