"""Points per second of memsim beside the analytic calculators installed here, on one grid.

    python benchmarks/bench_peers.py            # 27 points per tool, best of 3 passes
    python benchmarks/bench_peers.py --quick    # 3 points, one pass

The grid: Llama 3 70B on H100 SXM, int8 weights (llm-analysis: ``w8a16e16``), tensor parallel 2,
batch 1, 4 and 16, context 1,024, 4,096 and 8,192, repeated three times. Each tool is timed in
this warm process (imports, catalog loading and first compilation are left out); a point is one
call that answers one decode step's time (memsim: ``memsim.emulate``, plan and walk and report;
llm-analysis: ``LLMAnalysis.inference`` with one generated token). The peers count no tile and
hold no state: they are the speed a what-if user compares against, not the same answer.

Peers not installed are skipped; none is a dependency of memsim:
- llm-analysis (PyPI ``llm-analysis``, 0.2.2), needs transformers and huggingface-hub < 0.15;
- GenZ (PyPI ``genz-llm``, module ``GenZ``) and LLM-Viewer (a repository, not a package) are
  reported as found or not; no timing adapter is written for them yet.

The machine may be shared: read the ratio printed from one run, not the absolute figures.
"""

from __future__ import annotations

import importlib.util
import itertools
import logging
import sys
import time
from collections.abc import Callable

import memsim

BATCHES = (1, 4, 16)
CONTEXTS = (1024, 4096, 8192)
TP = 2
REPEATS = 3


def grid(quick: bool) -> list[tuple[int, int]]:
    points = list(itertools.product(BATCHES, CONTEXTS))
    return points[::3] if quick else points * REPEATS


def memsim_point() -> Callable[[int, int], object]:
    dev, mod = memsim.device("h100-sxm"), memsim.model("llama-3-70b")

    def point(batch: int, context: int) -> object:
        return memsim.emulate(dev, mod, memsim.Decode(batch=batch, context=context,
                                                      weights="int8", tp=TP))
    return point


def llm_analysis_point() -> Callable[[int, int], object] | None:
    if importlib.util.find_spec("llm_analysis") is None:
        return None
    from llm_analysis.analysis import LLMAnalysis
    from llm_analysis.config import (ModelConfig, ParallelismConfig, get_dtype_config_by_name,
                                     get_gpu_config_by_name)
    logging.disable(logging.WARNING)
    m = memsim.model("llama-3-70b")
    # expansion_ratio given, since 28,672 / 8,192 is not an integer (its check wants one)
    config = ModelConfig(name=m.name, num_layers=m.layers, n_head=m.heads, hidden_dim=m.hidden,
                         vocab_size=m.vocab, num_key_value_heads=m.kv_heads, ffn_embed_dim=m.ffn,
                         expansion_ratio=m.ffn / m.hidden, model_type="llama")
    analysis = LLMAnalysis(config, get_gpu_config_by_name("h100-sxm-80gb"),
                           get_dtype_config_by_name("w8a16e16"), ParallelismConfig(tp_size=TP))

    def point(batch: int, context: int) -> object:
        return analysis.inference(batch_size_per_gpu=batch, seq_len=context,
                                  num_tokens_to_generate=1)
    return point


def points_per_s(point: Callable[[int, int], object], points: list[tuple[int, int]],
                 passes: int) -> float:
    """Best points per second over ``passes`` runs of the grid, after one warm-up point."""
    point(*points[0])
    best = float("inf")
    for _ in range(passes):
        start = time.perf_counter()
        for batch, context in points:
            point(batch, context)
        best = min(best, time.perf_counter() - start)
    return len(points) / best


def main() -> None:
    quick = "--quick" in sys.argv
    points, passes = grid(quick), 1 if quick else 3
    print(f"Llama 3 70B, H100 SXM, int8, tp {TP}: {len(points)} points (batch {BATCHES} x "
          f"context {CONTEXTS}), best of {passes} passes, in one process")
    ours = points_per_s(memsim_point(), points, passes)
    print(f"  memsim        {ours:9.1f} points/s  {1e3 / ours:8.3f} ms per point")
    peers = {"llm-analysis": llm_analysis_point()}
    for name, point in peers.items():
        if point is None:
            print(f"  {name:13s} not installed, skipped")
            continue
        theirs = points_per_s(point, points, passes)
        print(f"  {name:13s} {theirs:9.1f} points/s  {1e3 / theirs:8.3f} ms per point  "
              f"(memsim takes {theirs / ours:.1f} x as long per point)")
    for name, module in (("GenZ", "GenZ"), ("LLM-Viewer", "model_analyzer")):
        found = importlib.util.find_spec(module) is not None
        print(f"  {name:13s} {'installed, no timing adapter yet' if found else 'not installed'}"
              ", skipped")


if __name__ == "__main__":
    main()
