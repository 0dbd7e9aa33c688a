"""Speed of the walkers, as ratios against a floor measured in the same run.

The floor is a bare Numba loop that only sums tile sizes; the walker does everything a decode
step needs (tiling, exact bits, the LRU, counters, waves). A tensor the on-chip tier holds none
of misses every tile, so the walker counts it per work unit and sets the LRU's state run by run;
a tensor the tier may hold part of goes through the LRU tile by tile. The cases cover both: an
H100 (50 MB of L2 against gigabytes of weights: streamed) and an H100 whose on-chip tier is
grown to hold all of Llama 3 8B (every tile a hit, looked up in the LRU). Timings are the best of a few
repetitions after a warm-up, so compile time and a busy neighbour weigh as little as possible.
"""

from __future__ import annotations

import time

from memsim.device import device
from memsim.emulate import Residency, run_step
from memsim.kernels import step as k
from memsim.model import model
from memsim.plan import make_plan
from memsim.workload import Decode


def _best_of(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def floor_ns_per_tile(n_tiles: int = 20_000_000, repeats: int = 5) -> float:
    """Nanoseconds per tile of the bare loop that only sums tile sizes (128 x 128 tiles)."""
    side = int(n_tiles ** 0.5) * 128 + 64          # ragged last tiles, as in a real matrix
    k.sum_tile_bits(1000, 1000, 128, 128, 16)
    tiles = (-(-side // 128)) ** 2
    return _best_of(lambda: k.sum_tile_bits(side, side, 128, 128, 16), repeats) / tiles * 1e9


def warm_step(model_name: str, context: int, repeats: int,
              on_chip: str | None = None) -> tuple[float, int]:
    """Seconds of one warm decode step at batch 1 on an H100 with room for the model, and tiles."""
    overrides = {"tiers.hbm.capacity": "1 TB"}
    if on_chip:
        overrides["tiers.sram.capacity"] = on_chip
    dev = device("h100-sxm").with_overrides(overrides)
    plan = make_plan(dev, model(model_name), Decode(batch=1, context=context, tile_k=128,
                                                    tile_n=128, residency="lru"))
    residency = Residency(plan)
    counts = run_step(plan, residency, 0)
    events = int(counts.results[:, k.R_HITS].sum() + counts.results[:, k.R_MISSES].sum())
    steps = iter(range(1, 10_000))
    return _best_of(lambda: run_step(plan, residency, next(steps)), repeats), events


def run_benchmarks(quick: bool = False) -> str:
    """Measure and format the benchmark figures."""
    floor = floor_ns_per_tile(n_tiles=2_000_000 if quick else 20_000_000)
    lines = [f"floor: bare loop summing tile sizes        {floor:8.3f} ns per tile"]
    cases = [("llama-3-8b", 4096, None), ("llama-3-8b", 4096, "32 GiB")]
    if not quick:
        cases.append(("llama-3-70b", 8192, None))
    for name, context, on_chip in cases:
        seconds, events = warm_step(name, context, repeats=3, on_chip=on_chip)
        per_event = seconds / events * 1e9
        tier = f"{on_chip} on chip, every tile an LRU hit" if on_chip else "50 MB L2"
        lines.append(f"{name} warm step, batch 1, context {context}, 128x128 tiles, {tier}:")
        lines.append(f"  {seconds * 1e3:9.2f} ms per step, {events:,} tile events, "
                     f"{events / seconds / 1e6:7.1f} M events/s, {per_event:6.2f} ns per event, "
                     f"{per_event / floor:6.1f} x the floor")
    return "\n".join(lines)


if __name__ == "__main__":
    print(run_benchmarks())
