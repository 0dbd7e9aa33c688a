"""Importing memsim compiles nothing; a second process loads the kernels from Numba's cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = """
import json, memsim
from memsim.kernels import step
compiled_at_import = len(step.walk_step.signatures)
memsim.emulate("h100-sxm", "llama-3.2-1b", batch=1, context=64)
stats = step.walk_step.stats
print(json.dumps({"compiled_at_import": compiled_at_import,
                  "cache_hits": sum(stats.cache_hits.values()),
                  "cache_misses": sum(stats.cache_misses.values())}))
"""


def _probe() -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_compiles_nothing_and_a_second_process_hits_the_cache():
    """Both processes use this run's Numba cache: the first compiles into it what it lacks
    (nothing once earlier tests wrote it), the second compiles nothing. Compiling the kernels
    into a fresh cache a second time would take minutes of CI; that a fresh cache is written
    and then hit is shown on a tiny kernel below."""
    first = _probe()
    assert first["compiled_at_import"] == 0
    second = _probe()
    assert second["compiled_at_import"] == 0
    assert second["cache_misses"] == 0 and second["cache_hits"] >= 1


TINY = """
from memsim.kernels.jit import jit

@jit
def add_one(x):
    return x + 1

print(add_one(41), sum(add_one.stats.cache_hits.values()), sum(add_one.stats.cache_misses.values()))
"""


def _tiny(tmp_path, cache_dir) -> subprocess.CompletedProcess:
    script = tmp_path / "tiny_kernel.py"
    script.write_text(TINY)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir))
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                          timeout=300)


def _truncate(cache_dir, suffix: str) -> int:
    files = [p for p in cache_dir.rglob(f"*{suffix}") if "tiny_kernel" in p.name]
    for path in files:
        path.write_bytes(path.read_bytes()[:10])
    return len(files)


def test_a_corrupted_cache_file_is_reported_in_one_line_and_recompiled(tmp_path):
    """Issue 18 item 17: a truncated .nbi or .nbc makes one line on stderr, not a traceback,
    and the next process hits the rewritten cache again."""
    cache = tmp_path / "cache"
    assert _tiny(tmp_path, cache).stdout.split() == ["42", "0", "1"]
    assert _tiny(tmp_path, cache).stdout.split() == ["42", "1", "0"]
    for suffix in (".nbi", ".nbc"):
        assert _truncate(cache, suffix) >= 1
        damaged = _tiny(tmp_path, cache)
        assert damaged.returncode == 0, damaged.stderr
        assert damaged.stdout.split() == ["42", "0", "1"]
        lines = damaged.stderr.strip().splitlines()
        assert len(lines) == 1 and "unreadable" in lines[0] and "recompiling" in lines[0]
        healed = _tiny(tmp_path, cache)
        assert healed.stdout.split() == ["42", "1", "0"] and healed.stderr == ""
