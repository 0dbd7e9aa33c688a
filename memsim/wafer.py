"""The weight tile of a spatial machine whose cores each multiply only the weights they hold.

On a wafer-scale engine the weights stay where they are placed: each core's SRAM holds a slice
and its SIMD unit multiplies that slice by the activations the fabric brings (Cerebras WSE: 48 KB
of SRAM and an FMAC per core, devices/wse-3.toml). Spread evenly, one core holds
``total_params / (chips x cores)`` weights, and at batch 1 an op's time is that slice's work on
one core, whatever the op's size: the layer-pipelined map, each op on a region in proportion to
its bytes. A device says so with ``tile.per_core = "resident"``; the tile is then the square of
that many elements (a smaller model leaves cores idle, not slices smaller), unless the workload
sets one. Weights streamed from off-wafer memory (``weight-streaming``, ``tiered``) keep the
device's tile.
"""

from __future__ import annotations

import dataclasses
import math

from memsim.device import Device
from memsim.model import Model
from memsim.workload import Decode


def resident_tile_side(model: Model, cores: int, chips: int) -> int:
    """Side of the square tile of one core's share of the model's weights over ``chips`` chips
    of ``cores`` cores each (at least 1)."""
    return max(1, math.isqrt(model.total_params // (chips * cores)))


def with_resident_tile(device: Device, model: Model, workload: Decode, policy: str) -> Decode:
    """``workload`` with its tile set to one core's share of the weights when the device's cores
    multiply what they hold (``tile.per_core = "resident"``), the weights stay resident
    (``sram-resident``) and the workload sets no tile of its own."""
    if (device.tile_per_core != "resident" or policy != "sram-resident"
            or workload.tile_k or workload.tile_n):
        return workload
    side = resident_tile_side(model, device.cores, workload.chips)
    return dataclasses.replace(workload, tile_k=side, tile_n=side)
