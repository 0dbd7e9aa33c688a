"""A 1,000-point study of Llama 3 70B (devices x batch x context) through `memsim.sweep` with two
worker processes, against the same points run one by one in a Python loop, in the same run.

    python benchmarks/bench_sweep.py            # 1,000 points
    python benchmarks/bench_sweep.py --quick    # 100 points
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from memsim.study import grid
from memsim.sweep import run_points, sweep

DEVICES = ["h100-sxm", "h200", "b200", "mi300x", "gaudi-3"]
BATCHES = [1, 2, 4, 8, 16, 24, 32, 48, 64, 128]
CONTEXTS = [256 * 2 ** (i // 2) * (3 if i % 2 else 2) // 2 for i in range(20)]


def study(quick: bool) -> list:
    points = grid(device=DEVICES, model="llama-3-70b", batch=BATCHES, context=CONTEXTS,
                  weights="int8")
    return points[::10] if quick else points


def main() -> None:
    points = study("--quick" in sys.argv)
    run_points(points[:2])                      # load the kernels' cache before timing
    with tempfile.TemporaryDirectory() as folder:
        result = sweep(points, Path(folder) / "bench.sqlite", jobs=2, name="bench")
    start = time.perf_counter()
    rows = run_points(points)
    loop_s = time.perf_counter() - start
    errors = sum(1 for row in rows if row[3] is not None)
    print(f"{len(points)} Llama 3 70B points ({len(DEVICES)} devices x {len(BATCHES)} batches x "
          f"{len(CONTEXTS)} contexts, int8), {errors} of them over capacity (rows with an error)")
    print(f"  memsim sweep --jobs 2   {result.seconds:7.1f} s   {result.points_per_s:7.1f} points/s")
    print(f"  one by one, one process {loop_s:7.1f} s   {len(points) / loop_s:7.1f} points/s")
    print(f"  ratio                   {loop_s / result.seconds:7.2f} x")


if __name__ == "__main__":
    main()
