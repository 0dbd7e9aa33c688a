"""`import memsim` is light: no Numba (nor numpy, matplotlib, dask, hypothesis) until a name that
needs the kernels is used, and every public name still works. Each check runs in a new process,
since this one has imported everything already."""

from __future__ import annotations

import subprocess
import sys

import pytest

import memsim

HEAVY = ("numba", "numpy", "matplotlib", "dask", "hypothesis")


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)


def _loaded(code: str) -> list[str]:
    """The heavy packages in sys.modules after running ``code`` in a new process."""
    done = _python(f"{code}\nimport sys\nprint([m for m in {HEAVY!r} if m in sys.modules])")
    assert done.returncode == 0, done.stderr
    return eval(done.stdout.strip().splitlines()[-1])


def test_import_memsim_loads_no_heavy_package():
    assert _loaded("import memsim") == []


def test_a_catalog_device_and_model_load_without_numba():
    assert "numba" not in _loaded("import memsim\nmemsim.device('h100-sxm')\n"
                                  "memsim.model('llama-3-70b')\nmemsim.device_names()\n"
                                  "memsim.format_quantity(8e10, 'capacity')")


def test_the_device_catalog_verb_loads_no_numba():
    assert "numba" not in _loaded("from memsim.cli import main\nmain(['devices'])")


def test_every_public_name_resolves_and_is_listed():
    for name in memsim.__all__:
        assert getattr(memsim, name) is not None
    assert set(memsim.__all__) <= set(dir(memsim))
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        memsim.nonsense  # noqa: B018


def test_a_submodule_loads_on_first_use():
    done = _python("import memsim\n"
                   "print(len(memsim.study.grid(device='h100-sxm', model='llama-3-8b', "
                   "batch=[1, 2])))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2"


def test_functions_keep_the_names_their_modules_share():
    done = _python("import memsim.emulate, memsim.device, memsim.sweep\n"
                   "from memsim.speculative import SpecReport\nimport memsim\n"
                   "from memsim.compare import compare\nimport memsim.model\n"
                   "for name in ('device', 'model', 'emulate', 'compare', 'speculative', 'sweep'):"
                   "\n    assert callable(getattr(memsim, name)), name\n"
                   "print(memsim.device('h100-sxm').name)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "h100-sxm"
