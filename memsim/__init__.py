"""memsim: a JIT-accelerated memory-hierarchy emulator of LLM decode on AI accelerators.

Importing memsim compiles nothing: the Numba kernels compile (or load from Numba's on-disk cache)
on their first call.
"""

from memsim.device import Device, Layout, Link, Tier, device, device_names, load_device
from memsim.emulate import emulate
from memsim.errors import CapacityError, ConfigError
from memsim.formats import FORMATS, Format, bytes_for, get_format
from memsim.model import Model, load_model, model, model_names
from memsim.capacity import capacity_table, fewest_chips
from memsim.compare import compare, spill_cost
from memsim.plan import Plan, SystemPlan, make_plan, plan_system
from memsim.report import OpRow, Report, StepSummary
from memsim.speculative import SpecReport, speculative
from memsim.sweep import sweep
from memsim.units import format_quantity, parse_quantity
from memsim.workload import Decode

__version__ = "0.1.0"

__all__ = [
    "FORMATS", "CapacityError", "ConfigError", "Decode", "Device", "Format", "Layout", "Link",
    "Model", "OpRow", "Plan", "Report", "SpecReport", "StepSummary", "SystemPlan", "Tier",
    "__version__", "bytes_for", "capacity_table", "compare", "device", "device_names", "emulate",
    "fewest_chips", "format_quantity", "get_format", "load_device", "load_model", "make_plan",
    "model", "model_names", "parse_quantity", "plan_system", "speculative", "spill_cost", "sweep",
]
