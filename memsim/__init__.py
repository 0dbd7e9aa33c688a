"""memsim: a JIT-accelerated memory-hierarchy emulator of LLM decode on AI accelerators.

Importing memsim compiles nothing: the Numba kernels compile (or load from Numba's on-disk cache)
on their first call.
"""

from memsim.device import Device, Layout, Link, Tier, device, device_names, load_device
from memsim.emulate import emulate
from memsim.errors import CapacityError, ConfigError
from memsim.formats import FORMATS, Format, bytes_for, get_format
from memsim.model import Model, load_model, model, model_names
from memsim.plan import Plan, make_plan
from memsim.report import OpRow, Report, StepSummary
from memsim.units import format_quantity, parse_quantity
from memsim.workload import Decode

__version__ = "0.1.0"

__all__ = [
    "FORMATS", "CapacityError", "ConfigError", "Decode", "Device", "Format", "Layout", "Link",
    "Model", "OpRow", "Plan", "Report", "StepSummary", "Tier", "__version__", "bytes_for",
    "device", "device_names", "emulate", "format_quantity", "get_format", "load_device",
    "load_model", "make_plan", "model", "model_names", "parse_quantity",
]
