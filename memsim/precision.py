"""Which arithmetic a matmul runs in on a device: load-time casts, weights x activations, dequantization.

A checkpoint's plain floating weights (bf16, fp16) on a chip without that type are converted once
when the model is loaded to the chip's own type of the same width (Groq, Cerebras WSE-3 and the IPU
have FP16 but no BF16: their compilers cast BF16 checkpoints to FP16 at load, e.g. GroqFlow and
PopTorch's ``half()``); the stored bits are unchanged and no step pays a conversion.

A matmul's multiply-accumulate type is its activations' (W8A8 and FP8 run at the low-precision
peak, W4A16 and W8A16 at the 16-bit peak): weights of another type are dequantized to it on the
vector units, element by element, every step (Marlin, Frantar et al. 2024; TRT-LLM's fpA_intB
GEMM). Quantized activations pay their quantization (a scale, a round and a convert per element)
before each matmul that reads them. When the device has no matrix path for the activations' type
the matmul runs at the device's 16-bit type, weights and activations converted to it.

A small-batch GEMV (a runtime with ``small_batch_gemv``) whose runtime counts the instructions of
its kernel for the weights' format (``[gemv.FORMAT]``, :mod:`memsim.instructions`) is timed from
them and the device's pipe rates: ``gemv_s_per_weight``. Without a count it falls back to
``(2 x rows + dequant_ops_per_weight)`` vector operations per weight at the vector rate.

Example::

    >>> path = matmul_path(device("h100-sxm"), get_format("int4-g128"), get_format("bf16"))
    >>> path.mma_type, path.dequant_ops_per_weight
    ('bf16', 3.0)
"""

from __future__ import annotations

from dataclasses import dataclass

from memsim.device import Device
from memsim.formats import Format
from memsim.instructions import MAX_PIPES, MLP_COLUMNS, gemv_seconds, mix_for, mlp_columns
from memsim.runtime import Runtime

FLOAT16_TYPES = ("bf16", "fp16")
ACTIVATION_QUANT_OPS = 3.0   # per element: multiply by the inverse scale, round, convert


@dataclass(frozen=True)
class MatmulPath:
    """How one matmul's weights meet its activations on a device.

    Attributes
    ----------
    mma_type : compute class the multiply-accumulate runs in (a key of the device's ``compute``).
    ops_per_s : the rate a large matmul of that class achieves (:meth:`Device.matmul_rate`:
        the device file's measured sustained rate, else the peak), operations/s.
    dequant_ops_per_weight : vector operations per stored weight element each step (0: native).
    act_quant_ops_per_element : vector operations per activation element read (0: 16-bit).
    cast_at_load : the weights' type converted once at load (e.g. ``"bf16->fp16"``), or ``""``.
    gemv_s_per_weight : seconds per weight on one core of the runtime's GEMV kernel, per pipe:
        ``MAX_PIPES`` fixed parts then ``MAX_PIPES`` per-activation-row parts
        (:func:`memsim.instructions.gemv_seconds`), then the kernel's in-flight columns
        (:func:`memsim.instructions.mlp_columns`); all zero when the runtime counts none.
    """

    mma_type: str
    ops_per_s: float
    dequant_ops_per_weight: float
    act_quant_ops_per_element: float
    cast_at_load: str = ""
    gemv_s_per_weight: tuple[float, ...] = (0.0,) * (2 * MAX_PIPES + MLP_COLUMNS)


def runtime_type(device: Device, compute: str) -> tuple[str, str]:
    """The type a plain 16-bit float runs in on ``device`` and the load-time cast, if any."""
    if compute in FLOAT16_TYPES and device.peak(compute) is None:
        for other in FLOAT16_TYPES:
            if device.peak(other) is not None:
                return other, f"{compute}->{other}"
    return compute, ""


def _sixteen_bit(device: Device) -> str:
    return "bf16" if device.peak("bf16") is not None else "fp16"


def matmul_path(device: Device, weights: Format, activations: Format,
                stack: Runtime | None = None) -> MatmulPath:
    """The arithmetic of a matmul with ``weights`` and ``activations`` on ``device``, and the
    issue time of ``stack``'s GEMV kernel for the weights' format where it counts one."""
    weight_type, cast = runtime_type(device, weights.compute)
    act_type, _ = runtime_type(device, activations.compute)
    quantized_act = act_type not in FLOAT16_TYPES and act_type != "fp32"
    mma_type = act_type if device.peak(act_type) is not None else _sixteen_bit(device)
    if mma_type != act_type:
        quantized_act = False          # the device upcasts: nothing to quantize
    dequant = 0.0 if weight_type == mma_type else float(max(weights.dequant_ops, 1))
    mix = mix_for(dict(stack.gemv), weights.name) if stack is not None else None
    gemv_s = ((0.0,) * (2 * MAX_PIPES) if mix is None
              else gemv_seconds(device.pipes, device.clock_hz, mix))
    gemv_s += mlp_columns(device.occupancy, mix)
    return MatmulPath(mma_type=mma_type, ops_per_s=float(device.matmul_rate(mma_type)),
                      dequant_ops_per_weight=dequant,
                      act_quant_ops_per_element=ACTIVATION_QUANT_OPS if quantized_act else 0.0,
                      cast_at_load=cast, gemv_s_per_weight=gemv_s)
