"""A 1,000-point study of Llama 3 70B (devices x batch x context) through `memsim.sweep` with one
and with two worker processes, against the same points run one by one in a Python loop, in the
same run (the ratios are what to read on a shared machine).

    python benchmarks/bench_sweep.py                 # 1,000 points; sweep --jobs 1 and --jobs 2
    python benchmarks/bench_sweep.py --jobs 2        # only --jobs 2
    python benchmarks/bench_sweep.py --quick         # 100 points
"""

from __future__ import annotations

import argparse
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 points")
    parser.add_argument("--jobs", type=int, action="append",
                        help="worker processes of a sweep (repeatable; default: 1 and 2)")
    args = parser.parse_args()
    points = study(args.quick)
    run_points(points[:2])                      # load the kernels' cache before timing
    start = time.perf_counter()
    rows = run_points(points)
    loop_s = time.perf_counter() - start
    errors = sum(1 for row in rows if row[3] is not None)
    print(f"{len(points)} Llama 3 70B points ({len(DEVICES)} devices x {len(BATCHES)} batches x "
          f"{len(CONTEXTS)} contexts, int8), {errors} of them over capacity (rows with an error)")
    print(f"  one by one, one process  {loop_s:7.1f} s   {len(points) / loop_s:7.1f} points/s")
    for jobs in args.jobs or [1, 2]:
        with tempfile.TemporaryDirectory() as folder:
            result = sweep(points, Path(folder) / "bench.sqlite", jobs=jobs, name="bench")
        print(f"  memsim sweep --jobs {jobs:<4d} {result.seconds:7.1f} s   "
              f"{result.points_per_s:7.1f} points/s   {loop_s / result.seconds:5.2f} x the loop")


if __name__ == "__main__":
    main()
