"""Where one study point's time goes, in a warm process: resolve (catalog names to objects), plan
(``memsim.plan.plan_system``), walk (the Numba kernel, ``memsim.emulate.run_step`` on every
stage and step) and report (the rest of ``memsim.emulate.run_system``: summaries, the Report).

    python benchmarks/bench_point.py                  # H100: Llama 3 70B and Llama 3.2 1B, int8
    python benchmarks/bench_point.py --device b200 --weights int4-g128 --repeats 50
    python benchmarks/bench_point.py --tp 2           # tensor parallel: collectives in every layer
    python benchmarks/bench_point.py --memory         # peak RSS under a 160 GiB on-chip what-if
    python benchmarks/bench_point.py --profile        # where plan and run_system spend, by function

Each phase is timed on its own with ``time.perf_counter`` and its median over the repeats is
printed, with the median of the whole point (``memsim.emulate`` on catalog names) beside it and
the point's ratio to its walk, both measured in the same run.
The machine may be shared: compare figures from one run, not across runs.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import subprocess
import sys
import time

from host import HostWatch
from memsim.device import device
from memsim.emulate import Residency, run_step, run_system
from memsim.emulate import emulate
from memsim.model import model
from memsim.plan import plan_system
from memsim.workload import Decode

MODELS = ("llama-3-70b", "llama-3.2-1b")


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def walk(system) -> None:
    """The kernel calls of ``run_system`` alone: every stage, every step, fresh on-chip tiers."""
    residencies = [Residency(plan) for plan in system.stages]
    for step in range(system.workload.steps):
        for plan, residency in zip(system.stages, residencies):
            run_step(plan, residency, step)


def phases(device_name: str, model_name: str, workload: Decode, repeats: int) -> dict[str, float]:
    """Median seconds of each phase of one point, and of the whole point."""
    dev, mod = device(device_name), model(model_name)
    system = plan_system(dev, mod, workload)
    run_system(system)                                   # compile or load the kernels
    timings: dict[str, list[float]] = {name: [] for name in
                                       ("resolve", "plan", "walk", "run_system", "point")}
    for _ in range(repeats):
        timings["resolve"].append(_seconds(lambda: (device(device_name), model(model_name))))
        timings["plan"].append(_seconds(lambda: plan_system(dev, mod, workload)))
        timings["walk"].append(_seconds(lambda: walk(system)))
        timings["run_system"].append(_seconds(lambda: run_system(system)))
        timings["point"].append(_seconds(lambda: emulate(device_name, model_name, workload)))
    medians = {name: statistics.median(values) for name, values in timings.items()}
    medians["report"] = medians["run_system"] - medians["walk"]
    return medians


# Points whose on-chip LRU could hold the whole model: the arena grows with the runs of tiles
# the walk holds (memsim.emulate.Residency), not with what the tier could hold.
MEMORY_POINTS = (("llama-3-70b", 4096, 1), ("llama-3.1-405b", 131072, 8))
MEMORY_PROBE = """
import resource, sys
import memsim
from memsim.emulate import SystemRun, run_system
from memsim.kernels.step import arena_runs
from memsim.plan import plan_system
name, context, tp, weights = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
dev = memsim.device("h100-sxm").with_overrides({"tiers.sram.capacity": "160 GiB"})
run_system(plan_system(dev, memsim.model("llama-3.2-1b"), memsim.Decode(weights=weights)))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
system = plan_system(dev, memsim.model(name), memsim.Decode(batch=1, context=context, tp=tp,
                                                            weights=weights))
run = SystemRun(system)
for step in range(system.workload.steps):
    run.step(step)
run.report()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(base // 1024, peak // 1024, system.stages[0].max_lru_entries,
      arena_runs(run.residencies[0].arena))
"""


def memory(weights: str) -> None:
    """Peak RSS of one point in a new process (ru_maxrss), 160 GiB on-chip what-if."""
    print(f"h100-sxm with tiers.sram.capacity = 160 GiB, batch 1, weights {weights}: peak RSS "
          f"of a new process (MB), after a 1B warm-up and after the point")
    print(f"{'model':28s} {'context':>8s} {'tp':>3s} {'warm-up':>8s} {'peak':>8s} "
          f"{'LRU tiles max':>14s} {'arena runs':>11s}")
    for name, context, tp in MEMORY_POINTS:
        out = subprocess.run([sys.executable, "-c", MEMORY_PROBE, name, str(context), str(tp),
                              weights], capture_output=True, text=True, check=True).stdout
        base, peak, entries, runs = out.split()
        print(f"{name:28s} {context:8d} {tp:3d} {base:>8s} {peak:>8s} {int(entries):14,d} "
              f"{int(runs):11,d}")


def profile(device_name: str, workload: Decode, repeats: int, top: int = 12) -> None:
    """cProfile's top functions by own time of ``plan_system`` and of ``run_system`` (whose
    largest item is the kernel call), per model; times include the profiler's overhead."""
    for model_name in MODELS:
        dev, mod = device(device_name), model(model_name)
        system = plan_system(dev, mod, workload)
        run_system(system)
        for phase, fn in (("plan_system", lambda: plan_system(dev, mod, workload)),
                          ("run_system", lambda: run_system(system))):
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(repeats):
                fn()
            profiler.disable()
            print(f"== {model_name}: {phase}, {repeats} calls, by own time")
            pstats.Stats(profiler).sort_stats("tottime").print_stats(top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="h100-sxm")
    parser.add_argument("--weights", default="int8", help="int8: Llama 3 70B fits one H100")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel chips")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--memory", action="store_true",
                        help="peak memory of the 160 GiB on-chip what-if points instead")
    parser.add_argument("--profile", action="store_true",
                        help="cProfile's top functions of plan and run_system instead")
    args = parser.parse_args()
    if args.memory:
        memory(args.weights)
        return
    workload = Decode(batch=args.batch, context=args.context, weights=args.weights, tp=args.tp)
    if args.profile:
        profile(args.device, workload, args.repeats)
        return
    print(f"{args.device}, tp {args.tp}, batch {args.batch}, context {args.context}, weights "
          f"{args.weights}, median of {args.repeats} in a warm process (ms)")
    print(f"{'model':28s} {'resolve':>8s} {'plan':>8s} {'walk':>8s} {'report':>8s} "
          f"{'sum':>8s} {'emulate':>8s} {'/ walk':>7s}")
    with HostWatch() as host:
        for model_name in MODELS:
            m = phases(args.device, model_name, workload, args.repeats)
            total = m["resolve"] + m["plan"] + m["walk"] + m["report"]
            print(f"{model_name:28s} " + " ".join(
                f"{m[name] * 1e3:8.3f}" for name in ("resolve", "plan", "walk", "report"))
                + f" {total * 1e3:8.3f} {m['point'] * 1e3:8.3f} {m['point'] / m['walk']:6.1f}x")
    print("/ walk: the whole point over its kernel calls alone, both measured in this run "
          "(what the Python around the walk costs, whatever the machine's load)")
    print(host.describe())


if __name__ == "__main__":
    main()
