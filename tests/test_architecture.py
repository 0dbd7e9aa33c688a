"""The house's floors (STYLE.md pattern 1): imports only go down, and nothing imports the CLI."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import memsim

PACKAGE = Path(memsim.__file__).parent
FLOORS = (
    ("errors", "units", "formats", "checkpoints", "datafile", "limits", "device", "model",
     "hf_config", "workload", "runtime"),
    ("inputs",),
    ("lower", "layout", "routing", "precision", "plan"),
    ("emulate", "counts", "report"),
    ("capacity", "compare", "speculative", "serving", "validate"),
    ("study", "sweep", "store"),
    ("cli", "plot", "render", "bench"),
)
FLOOR = {name: i for i, names in enumerate(FLOORS) for name in names}
# known exceptions today, each for its owner to remove
EXCEPTIONS: set[tuple[str, str]] = set()


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "kernels" not in p.parts)


def _imports(path: Path) -> set[tuple[str, str]]:
    """``(memsim submodule, name)`` pairs a module imports (name ``""`` for a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] == "memsim":
            parts = node.module.split(".")
            for alias in node.names:
                found.add((parts[1], alias.name) if len(parts) > 1 else (alias.name, ""))
        elif isinstance(node, ast.Import):
            found |= {(a.name.split(".")[1], "") for a in node.names
                      if a.name.startswith("memsim.")}
    return found


def _name(path: Path) -> str:
    return path.relative_to(PACKAGE).with_suffix("").parts[0]


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_the_cli(path):
    if path.name == "__main__.py":          # the entry point is the CLI's caller
        return
    assert "cli" not in {module for module, _ in _imports(path)}


@pytest.mark.parametrize("path", [p for p in _modules() if _name(p) in FLOOR],
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_only_go_down_the_floors(path):
    here = _name(path)
    up = sorted(module for module, _ in _imports(path)
                if FLOOR.get(module, -1) > FLOOR[here] and (here, module) not in EXCEPTIONS)
    assert not up, f"{here} (floor {FLOOR[here]}) imports {up} from above"


@pytest.mark.parametrize("path", [PACKAGE / f"{n}.py" for n in
                                  ("inputs", "cli", "sweep", "store", "study", "plot",
                                   "compare", "render")],
                         ids=lambda p: p.name)
def test_no_private_name_crosses_a_module(path):
    private = sorted(f"{m}.{n}" for m, n in _imports(path) if n.startswith("_")
                     and n != "__version__")
    assert not private
