"""memsim: a JIT-accelerated memory-hierarchy emulator of LLM decode on AI accelerators.

Importing memsim imports neither Numba nor numpy: each public name loads its module on first use
(PEP 562), so ``memsim.device("h100-sxm")`` reads a device file without the kernels, and the
Numba kernels compile (or load from Numba's on-disk cache) on their first call.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any

__version__ = "0.1.0"

#: Every public name and the module that defines it.
_HOMES = {
    "Device": "memsim.device", "Layout": "memsim.device", "Link": "memsim.device",
    "Tier": "memsim.device", "device": "memsim.device", "device_names": "memsim.device",
    "load_device": "memsim.device",
    "emulate": "memsim.emulate",
    "CapacityError": "memsim.errors", "ConfigError": "memsim.errors",
    "FORMATS": "memsim.formats", "Format": "memsim.formats", "bytes_for": "memsim.formats",
    "get_format": "memsim.formats",
    "Model": "memsim.model", "load_model": "memsim.model", "model": "memsim.model",
    "model_names": "memsim.model",
    "capacity_table": "memsim.capacity", "fewest_chips": "memsim.capacity",
    "BatchCapacity": "memsim.capacity", "max_batch": "memsim.capacity",
    "max_batch_table": "memsim.capacity",
    "WeightFormats": "memsim.checkpoints", "weight_formats": "memsim.checkpoints",
    "usual_activations": "memsim.checkpoints",
    "Runtime": "memsim.runtime", "runtime_names": "memsim.runtime",
    "load_runtime": "memsim.runtime", "collective_time": "memsim.runtime",
    "compare": "memsim.compare", "spill_cost": "memsim.compare",
    "Plan": "memsim.plan", "SystemPlan": "memsim.plan", "make_plan": "memsim.plan",
    "plan_system": "memsim.plan",
    "OpRow": "memsim.report", "Report": "memsim.report", "StepSummary": "memsim.report",
    "SpecReport": "memsim.speculative", "speculative": "memsim.speculative",
    "break_even_batch": "memsim.speculative",
    "sweep": "memsim.sweep",
    "format_quantity": "memsim.units", "parse_quantity": "memsim.units",
    "Decode": "memsim.workload", "Prefill": "memsim.workload",
    "Serving": "memsim.serving", "ServingStep": "memsim.serving", "serve": "memsim.serving",
}

__all__ = sorted(["__version__", *_HOMES])


def __getattr__(name: str) -> Any:
    """Load a public name's module on first use and keep the name; a submodule's name
    (``memsim.study``) imports it, as the eager import of every module used to."""
    home = _HOMES.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value
        return value
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'memsim' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """memsim itself. Importing a submodule binds it on its package, and six public functions
    share their module's name (``memsim.device`` is the function of ``memsim/device.py``): the
    function keeps the name, as it did when this file imported every name eagerly."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _HOMES and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
