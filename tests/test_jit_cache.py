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


def _probe(cache_dir) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir))
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                         check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_compiles_nothing_and_a_second_process_hits_the_cache(tmp_path):
    first = _probe(tmp_path)
    assert first["compiled_at_import"] == 0
    assert first["cache_misses"] >= 1
    second = _probe(tmp_path)
    assert second["compiled_at_import"] == 0
    assert second["cache_misses"] == 0 and second["cache_hits"] >= 1
