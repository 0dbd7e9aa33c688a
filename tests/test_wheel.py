"""Install-level test: the built wheel carries the package, its data files and its CLI.

Slow (a wheel build and a venv); run with ``python -m pytest tests/test_wheel.py -m slow``.
The source tree is copied to a temporary folder first, so the build leaves no ``build/`` behind in
the repository and no stale file from an earlier build can reach the wheel.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
IGNORE = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__",
                                ".hypothesis", ".pytest_cache", "*.sqlite", ".venv*")


def _env(tmp: Path) -> dict[str, str]:
    """The test process's environment without Python path settings of its own."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env["NUMBA_CACHE_DIR"] = str(tmp / "nbcache")
    return env


def _run(args: list, *, cwd: Path, env: dict[str, str], timeout: int = 600):
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("wheel")
    env = _env(tmp)
    src = tmp / "src"
    shutil.copytree(REPO, src, ignore=IGNORE)
    dist = tmp / "dist"
    build = _run([sys.executable, "-m", "build", "--wheel", "--outdir", dist, src],
                 cwd=tmp, env=env)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    wheels = list(dist.glob("memsim-*.whl"))
    assert len(wheels) == 1, wheels

    # Install into a folder for the interpreter running the tests (a venv's own, when run from
    # one): a nested venv would be built on the base interpreter, which lacks the venv's numpy
    # and numba. The folder goes first on PYTHONPATH, ahead of any editable memsim.
    site = tmp / "site"
    inst = _run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
                 "--target", site, wheels[0]], cwd=tmp, env=env)
    assert inst.returncode == 0, inst.stdout[-3000:] + inst.stderr[-3000:]
    env["PYTHONPATH"] = str(site)
    outside = tmp / "elsewhere"
    outside.mkdir()
    return {"python": Path(sys.executable), "bin": site / "bin", "site": site.resolve(),
            "cwd": outside, "env": env}


def test_wheel_import_resolves_to_the_venv(venv):
    code = ("import importlib.resources as r, memsim; "
            "print(memsim.__file__); "
            "print(r.files('memsim.devices').joinpath('h100-sxm.toml')); "
            "import memsim.kernels; print(memsim.kernels.__file__); "
            "d = memsim.device('h100-sxm'); print(d.tier('hbm').bandwidth); "
            "print(memsim.model('llama-3-70b').total_params); "
            "print(d.with_tier('cxl-gen5-x16').tier_names)")
    out = _run([venv["python"], "-c", code], cwd=venv["cwd"], env=venv["env"])
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    site = venv["site"]
    for line in lines[:3]:
        path = Path(line).resolve()
        assert site in path.parents, f"{path} is not in the venv's {site}"
        assert REPO not in path.parents
    assert lines[3] == "3350000000000.0"
    assert lines[4] == "70553706496"
    assert lines[5] == "('sram', 'hbm', 'cxl')"


def test_console_script_lists_devices(venv):
    out = _run([venv["bin"] / "memsim", "devices"], cwd=venv["cwd"], env=venv["env"])
    assert out.returncode == 0, out.stderr
    assert "h100-sxm" in out.stdout
