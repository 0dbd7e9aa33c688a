"""A 1,000-point study of Llama 3 70B (devices x batch x context) through `memsim.sweep` with one
and with two worker processes, against the same points run one by one in a Python loop, in the
same run (the ratios are what to read on a shared machine). Each sweep's CPU time (this process
and its workers) bounds what ``--jobs N`` can gain on N idle cores: N x the CPU of ``--jobs 1``
over its own. The points' own time (the sum of the rows' ``seconds``) splits a sweep's wall time
into its points and what memsim spends around them (store, forks, pipes, the last chunks'
imbalance): ``--jobs N``'s ratio had its points run as fast as ``--jobs 1``'s is what memsim's
own overhead allows; the rest of the gap is the points running slower on a shared host. How
much slower the host alone makes them is measured beside the sweeps: ``N`` processes forked from
this warm one, each evaluating its share of the same chunks with nothing of a sweep around them
(no store, pipes or feeding), against one such process. That ratio is what this machine gives
``N`` processes running these points at once, and a sweep's ratio is read against it.

    python benchmarks/bench_sweep.py                 # 1,000 points; sweep --jobs 1 and --jobs 2
    python benchmarks/bench_sweep.py --jobs 2        # only --jobs 2
    python benchmarks/bench_sweep.py --quick         # 100 points
    python benchmarks/bench_sweep.py --repeats 9     # medians of 9 sweeps of each (default 5)
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
from pathlib import Path

from host import HostWatch
from memsim.store import Store
from memsim.study import grid
from memsim.sweep import chunk_size, chunks, evaluate_encoded, run_points, sweep

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


def bare_forks(points: list, jobs: int) -> float:
    """Wall seconds of ``jobs`` processes forked from this warm one, each evaluating every
    ``jobs``-th of the sweep's chunks as a worker does, with nothing of a sweep around them: no
    store, no pipes, no chunks fed or rows sent back. With ``jobs`` 1 it is the same work in one
    forked process, so the ratio of the two is what this host gives ``jobs`` processes."""
    work = chunks(points, chunk_size(len(points), jobs), jobs)
    start = time.perf_counter()
    gc.freeze()
    children = []
    for k in range(jobs):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                for chunk in work[k::jobs]:
                    evaluate_encoded(chunk)
                code = 0
            finally:
                os._exit(code)
        children.append(pid)
    gc.unfreeze()
    failed = [pid for pid in children if os.waitpid(pid, 0)[1] != 0]
    if failed:
        raise RuntimeError(f"{len(failed)} of {jobs} bare forked processes failed")
    return time.perf_counter() - start


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
    bare: dict[int, list[float]] = {jobs: [] for jobs in {1, *all_jobs}}
    with HostWatch() as host:
        for _ in range(max(1, args.repeats)):
            for jobs in all_jobs:
                runs[jobs].append(timed_sweep(points, jobs))
            for jobs in bare:
                bare[jobs].append(bare_forks(points, jobs))
    bare_wall = {jobs: statistics.median(walls) for jobs, walls in bare.items()}
    medians = {jobs: tuple(statistics.median(run[i] for run in r) for i in range(3))
               for jobs, r in runs.items()}
    for jobs, (wall, cpu, points_s) in medians.items():
        print(f"  memsim sweep --jobs {jobs:<4d} {wall:7.2f} s   {len(points) / wall:7.1f} "
              f"points/s   {loop_s / wall:5.2f} x the loop;  CPU {cpu:5.2f} s;  points "
              f"{points_s:5.2f} s, around them {wall - points_s / jobs:5.3f} s")
        if 1 in medians and jobs > 1:
            one_wall, one_cpu, one_points_s = medians[1]
            same_speed = one_wall / (wall - (points_s - one_points_s) / jobs)
            bare_ratio = bare_wall[1] / bare_wall[jobs]
            print(f"      {one_wall / wall:4.2f} x --jobs 1;  at most {jobs * one_cpu / cpu:4.2f} "
                  f"by CPU;  {same_speed:4.2f} had its points run as fast as --jobs 1's")
            print(f"      this host: {jobs} bare forked processes {bare_wall[jobs]:.2f} s, "
                  f"{bare_ratio:4.2f} x one ({bare_wall[1]:.2f} s); the sweep takes "
                  f"{wall / bare_wall[jobs]:4.2f} x their time, its ratio "
                  f"{one_wall / wall / bare_ratio:4.2f} x theirs")
    print(f"medians of {max(1, args.repeats)} sweeps each, taken in turn. CPU: this process's "
          "and its finished workers' (os.times). points: the sum of the rows' seconds; around "
          "them: wall minus points / jobs (store, forks, pipes, the last chunks). Bare forked "
          "processes: the sweep's chunks evaluated with nothing around them, taken in turn with "
          "the sweeps; their ratio is what this machine gives that many processes at once")
    print(host.describe())

if __name__ == "__main__":
    main()
