"""A 1,000-point study of Llama 3 70B (devices x batch x context) through `memsim.sweep` with one
and with two worker processes, against the same points run one by one in a Python loop, in the
same run (the ratios are what to read on a shared machine). Each sweep's CPU time (this process
and its workers) bounds what ``--jobs N`` can gain on N idle cores: N x the CPU of ``--jobs 1``
over its own.

    python benchmarks/bench_sweep.py                 # 1,000 points; sweep --jobs 1 and --jobs 2
    python benchmarks/bench_sweep.py --jobs 2        # only --jobs 2
    python benchmarks/bench_sweep.py --quick         # 100 points
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from memsim.study import grid
from memsim.sweep import run_points, sweep

DEVICES = ["h100-sxm", "h200", "b200", "mi300x", "gaudi-3"]
BATCHES = [1, 2, 4, 8, 16, 24, 32, 48, 64, 128]
CONTEXTS = [256 * 2 ** (i // 2) * (3 if i % 2 else 2) // 2 for i in range(20)]


def _cpu_s() -> float:
    """CPU seconds of this process and of its reaped children (a sweep's workers)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


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
    cpu_one = None
    for jobs in args.jobs or [1, 2]:
        before = _cpu_s()
        with tempfile.TemporaryDirectory() as folder:
            result = sweep(points, Path(folder) / "bench.sqlite", jobs=jobs, name="bench")
        cpu = _cpu_s() - before
        cpu_one = cpu if jobs == 1 else cpu_one
        bound = (f";  at most {jobs * cpu_one / cpu:4.2f} x --jobs 1 on {jobs} idle cores"
                 if cpu_one and jobs > 1 else "")
        print(f"  memsim sweep --jobs {jobs:<4d} {result.seconds:7.1f} s   "
              f"{result.points_per_s:7.1f} points/s   {loop_s / result.seconds:5.2f} x the loop;"
              f"  CPU {cpu:5.2f} s{bound}")
    print("CPU: this process's and its finished workers' (os.times); on a shared machine the "
          "wall-clock ratio of --jobs 2 follows the others' load, the CPU bound far less")


if __name__ == "__main__":
    main()
