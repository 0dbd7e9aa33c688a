"""The walk of one decode point per weight format, in one run: the walk should cost the same
whatever the format (issue 16 item 3), since every format has the same tiles.

    python benchmarks/bench_formats.py                        # B200, Llama 3 70B, batch 1, 4K
    python benchmarks/bench_formats.py --model llama-3.2-1b --repeats 60

A B200 holds Llama 3 70B in bf16 on one chip, so every format has the same ops and tiles.
A layer whose ops and on-chip state repeat the layer before's is copied, not walked: a smaller
format keeps more layers in the on-chip tier, so the state takes more layers to settle and more
are walked (Llama 3.2 1B on a B200's 126 MB L2). ``--walk-every-layer`` walks them all: the
per-tile cost alone. The
walk is ``memsim.emulate.run_step`` over the point's steps from a fresh on-chip tier; the on-chip
tier's allocation (``Residency``, at most 4 MiB at the start) is timed apart. Formats
are interleaved pass after pass and the best pass is kept, so a busy neighbour weighs alike on
all of them.
"""

from __future__ import annotations

import argparse
import time

from memsim.device import device
from memsim.emulate import Residency, run_step
from memsim.model import model
from memsim.plan import plan_system
from memsim.workload import Decode

FORMATS = ("bf16", "fp8-e4m3-b128", "int8", "int4-g128", "nvfp4")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="b200")
    parser.add_argument("--model", default="llama-3-70b")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--walk-every-layer", action="store_true",
                        help="walk every layer tile by tile (no layer is copied)")
    args = parser.parse_args()
    plans = {name: plan_system(device(args.device), model(args.model),
                               Decode(batch=1, context=4096, weights=name)).stages[0]
             for name in FORMATS}
    walk_s = dict.fromkeys(FORMATS, float("inf"))
    arena_s = dict.fromkeys(FORMATS, float("inf"))
    for _ in range(args.repeats + 1):
        for name, plan in plans.items():
            start = time.perf_counter()
            residency = Residency(plan)
            allocated = time.perf_counter()
            for step in range(plan.workload.steps):
                run_step(plan, residency, step, copy_layers=not args.walk_every_layer)
            done = time.perf_counter()
            arena_s[name] = min(arena_s[name], allocated - start)
            walk_s[name] = min(walk_s[name], done - allocated)
    how = "every layer walked" if args.walk_every_layer else "repeating layers copied"
    print(f"{args.device} {args.model}, batch 1, context 4096, {plans['bf16'].workload.steps} "
          f"steps, {how}: best of {args.repeats} (ms)")
    for name in FORMATS:
        print(f"  {name:14s} walk {walk_s[name] * 1e3:7.3f}  ({walk_s[name] / walk_s['bf16']:4.2f}"
              f" x bf16)   on-chip tier allocation {arena_s[name] * 1e3:6.3f}")


if __name__ == "__main__":
    main()
