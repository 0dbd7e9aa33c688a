"""How a software stack hands a pipeline stage's activations to the next stage.

A runtime file's optional ``[pipeline]`` table says three things about a step split into
pipeline stages (one chip, or one tensor-parallel group, per stage):

- ``handoff``: the path the hidden state takes. ``"link"`` (the default) is a direct copy over
  the device's chip-to-chip link. ``"host"`` is a copy staged through host memory: device to
  host, then host to device, each over the chips' ``host_link``. A CUDA peer copy between two
  GPUs without peer access enabled takes that path (CUDA C Programming Guide, "Peer-to-Peer
  Memory Copy"), and llama.cpp's layer split never enables peer access.
- ``handoff_bits``: the width of one handed-off element, when the stack's hidden state is
  wider than the workload's activation type (llama.cpp keeps its residual stream in F32).
- ``graph``: whether a stack that replays a captured graph still does so when the step spans
  more than one stage.

A stack without the table hands off over the link, at the activation width, and keeps its graph.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memsim.datafile import check_keys, require_bool, require_int, require_str, require_table
from memsim.errors import ConfigError

if TYPE_CHECKING:       # memsim.device imports memsim.runtime, which reads this module
    from memsim.device import Device, Link

__all__ = ["Pipeline", "HANDOFFS", "parse_pipeline", "pipeline_of", "handoff_bytes",
           "handoff_seconds"]

HANDOFFS = ("link", "host")


@dataclass(frozen=True)
class Pipeline:
    """A stack's pipeline hand-off: its path, element width (0: the activations') and graph."""

    handoff: str = "link"
    handoff_bits: int = 0
    graph: bool = True


def parse_pipeline(table: Any, *, file: str) -> Pipeline:
    """Validate a runtime file's ``[pipeline]`` table."""
    table = require_table(table, file=file, field="pipeline")
    check_keys(table, required=(), optional=("handoff", "handoff_bits", "graph"), file=file,
               prefix="pipeline.")
    bits = 0
    if "handoff_bits" in table:
        bits = require_int(table["handoff_bits"], file=file, field="pipeline.handoff_bits")
        if bits % 8:
            raise ConfigError(f"expected a whole number of bytes per element (8, 16, 32), got "
                              f"{bits}", file=file, field="pipeline.handoff_bits")
    return Pipeline(
        handoff=require_str(table.get("handoff", "link"), file=file, field="pipeline.handoff",
                            choices=HANDOFFS),
        handoff_bits=bits,
        graph=require_bool(table.get("graph", True), file=file, field="pipeline.graph"))


def handoff_bytes(rows: int, width: int, element_bits: int) -> int:
    """Bytes of one hand-off: ``rows`` token rows of ``width`` elements (exact)."""
    return rows * width * element_bits // 8


def handoff_seconds(device: Device, pipeline: Pipeline, link: Link,
                    sent_bytes: float) -> tuple[float, float]:
    """Bandwidth and latency time of one hand-off of ``sent_bytes``: over ``link`` (the link
    the boundary crosses), or staged through the host, two copies over ``host_link`` one after
    the other (each pays its bandwidth and its latency)."""
    if pipeline.handoff == "host":
        host = device.host_link
        return 2.0 * sent_bytes / host.bandwidth, 2.0 * host.latency_s
    return sent_bytes / link.bandwidth, link.latency_s


def pipeline_of(data: Mapping[str, Any], *, file: str) -> Pipeline:
    """The ``[pipeline]`` of a runtime file's data, or the default when it has none."""
    return parse_pipeline(data["pipeline"], file=file) if "pipeline" in data else Pipeline()
