"""A 1,000-point study of Llama 3 70B (devices x batch x context) through `memsim.sweep` with one
and with two worker processes, against the same points run one by one in a Python loop, in the
same run (the ratios are what to read on a shared machine). Each sweep's CPU time (this process
and its workers) bounds what ``--jobs N`` can gain on N idle cores: N x the CPU of ``--jobs 1``
over its own. The points' own time (the sum of the rows' ``seconds``) splits a sweep's wall time
into its points and what memsim spends around them (store, forks, pipes, the last chunks'
imbalance): ``--jobs N``'s ratio had its points run as fast as ``--jobs 1``'s is what memsim's
own overhead allows; the rest of the gap is the points running slower on a shared host.

    python benchmarks/bench_sweep.py                 # 1,000 points; sweep --jobs 1 and --jobs 2
    python benchmarks/bench_sweep.py --jobs 2        # only --jobs 2
    python benchmarks/bench_sweep.py --quick         # 100 points
    python benchmarks/bench_sweep.py --repeats 9     # medians of 9 sweeps of each (default 5)
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from memsim.store import Store
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


def timed_sweep(points: list, jobs: int) -> tuple[float, float, float]:
    """One sweep into a new store: wall seconds, CPU seconds (with its workers) and the sum of
    its points' own seconds (each row's)."""
    before = _cpu_s()
    with tempfile.TemporaryDirectory() as folder:
        result = sweep(points, Path(folder) / "bench.sqlite", jobs=jobs, name="bench")
        cpu = _cpu_s() - before
        with Store(Path(folder) / "bench.sqlite", create=False) as store:
            points_s = sum(row["seconds"] for row in store.rows("bench"))
    return result.seconds, cpu, points_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 points")
    parser.add_argument("--jobs", type=int, action="append",
                        help="worker processes of a sweep (repeatable; default: 1 and 2)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="sweeps of each --jobs, taken in turn; medians are printed")
    args = parser.parse_args()
    points = study(args.quick)
    run_points(points[:2])                      # load the kernels' cache before timing
    start = time.perf_counter()
    rows = run_points(points)
    loop_s = time.perf_counter() - start
    errors = sum(1 for row in rows if row[3] is not None)
    print(f"{len(points)} Llama 3 70B points ({len(DEVICES)} devices x {len(BATCHES)} batches x "
          f"{len(CONTEXTS)} contexts, int8), {errors} of them over capacity (rows with an error)")
    print(f"  one by one, one process  {loop_s:7.2f} s   {len(points) / loop_s:7.1f} points/s")
    all_jobs = args.jobs or [1, 2]
    runs: dict[int, list[tuple[float, float, float]]] = {jobs: [] for jobs in all_jobs}
    for _ in range(max(1, args.repeats)):
        for jobs in all_jobs:
            runs[jobs].append(timed_sweep(points, jobs))
    medians = {jobs: tuple(statistics.median(run[i] for run in r) for i in range(3))
               for jobs, r in runs.items()}
    for jobs, (wall, cpu, points_s) in medians.items():
        print(f"  memsim sweep --jobs {jobs:<4d} {wall:7.2f} s   {len(points) / wall:7.1f} "
              f"points/s   {loop_s / wall:5.2f} x the loop;  CPU {cpu:5.2f} s;  points "
              f"{points_s:5.2f} s, around them {wall - points_s / jobs:5.3f} s")
        if 1 in medians and jobs > 1:
            one_wall, one_cpu, one_points_s = medians[1]
            same_speed = one_wall / (wall - (points_s - one_points_s) / jobs)
            print(f"      {one_wall / wall:4.2f} x --jobs 1;  at most {jobs * one_cpu / cpu:4.2f} "
                  f"by CPU;  {same_speed:4.2f} had its points run as fast as --jobs 1's")
    print(f"medians of {max(1, args.repeats)} sweeps each, taken in turn. CPU: this process's "
          "and its finished workers' (os.times). points: the sum of the rows' seconds; around "
          "them: wall minus points / jobs (store, forks, pipes, the last chunks). On a shared "
          "machine the wall-clock ratio of --jobs 2 follows the others' load")

if __name__ == "__main__":
    main()
