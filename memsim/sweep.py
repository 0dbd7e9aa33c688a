"""Running a study: every point the store lacks, on local worker processes or a Dask cluster.

Points are cut into chunks of points that share a model and device (a worker keeps what it
loaded), and the chunks run in parallel; only this process writes the store, one committed row
per point as its chunk comes back. Invalid points become rows with their error.
"""

from __future__ import annotations

import multiprocessing
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, TextIO

from memsim.cli import build_device
from memsim.emulate import run_system
from memsim.errors import ConfigError
from memsim.model import model as catalog_model
from memsim.plan import is_timing_path, plan_system, retarget
from memsim.speculative import speculative
from memsim.store import Store, write_rows
from memsim.study import Point, Study, grid
from memsim.workload import Decode

CHUNK_POINTS = 8


@dataclass(frozen=True)
class SweepResult:
    """What a sweep did."""

    store: str
    study: str
    points: int            # in the study
    computed: int          # this run
    skipped: int           # already in the store
    errors: int            # rows of this run with an error
    seconds: float

    @property
    def points_per_s(self) -> float:
        """Points computed per second of this run."""
        return self.computed / self.seconds if self.seconds else 0.0


@lru_cache(maxsize=64)
def _device(name: str, overrides: tuple[tuple[str, str], ...], add_tiers: tuple[str, ...]):
    return build_device(name, [f"{k}={v}" for k, v in overrides], list(add_tiers))


@lru_cache(maxsize=32)
def _model(name: str):
    return catalog_model(name)


def figures_of(report: Any) -> dict[str, Any]:
    """The figures a study keeps of one decode run."""
    return {
        "time_per_token_s": report.time_per_token, "tokens_per_s": report.tokens_per_s,
        "tokens_per_s_total": report.tokens_per_s_total, "cycles": report.cycles,
        "energy_per_token_j": report.energy_per_token, "bottleneck": report.bottleneck,
        "arithmetic_intensity": (None if report.arithmetic_intensity == float("inf")
                                 else report.arithmetic_intensity),
        "bytes_read": dict(report.bytes_read), "bytes_written": dict(report.bytes_written),
        "weight_bytes_read": report.weight_bytes_read, "weights_held": report.weights_held,
        "link_bytes": report.link_bytes, "chips": report.chips, "policy": report.policy,
        "off_chip_bytes": report.off_chip_bytes, "flops": report.flops,
        "cold_time_s": report.cold.time_s, "hits": report.hits, "misses": report.misses,
    }


_PLANS: dict[tuple, Any] = {}
PLAN_CACHE = 16


def _plan(point: Point, dev: Any, mod: Any) -> Any:
    """The point's system plan; a plan made for a point that differs only in timing figures
    (bandwidths, latencies, energies, peaks) is reused with the figures swapped."""
    shape = (point.device, point.model, point.add_tiers, point.workload,
             tuple(kv for kv in point.overrides if not is_timing_path(kv[0])))
    cached = _PLANS.get(shape)
    if cached is not None:
        return retarget(cached, dev)
    system = plan_system(dev, mod, Decode(**dict(point.workload)))
    if len(_PLANS) >= PLAN_CACHE:
        _PLANS.pop(next(iter(_PLANS)))
    _PLANS[shape] = system
    return system


def evaluate(point: Point) -> tuple[str, dict[str, Any], dict[str, Any] | None, str | None, float]:
    """Run one point: ``(key, inputs, figures, error, seconds)``; a bad point's error is kept."""
    start = time.perf_counter()
    try:
        dev = _device(point.device, point.overrides, point.add_tiers)
        mod = _model(point.model)
        if point.speculative:
            spec = dict(point.speculative)
            draft = spec.pop("draft", None)
            gamma = spec.pop("gamma", 4)
            acceptance = spec.pop("acceptance", 0.8)
            tree = spec.pop("tree", None)
            report = speculative(dev, mod, _model(draft) if draft else None, gamma,
                                 list(acceptance) if isinstance(acceptance, tuple) else acceptance,
                                 tree=list(tree) if tree else None, **spec,
                                 **dict(point.workload))
            figures = {k: v for k, v in report.to_dict().items()
                       if k not in ("monte_carlo", "verify_time_by_bound")}
        else:
            figures = figures_of(run_system(_plan(point, dev, mod)))
        error = None
    except ConfigError as exc:
        figures, error = None, f"{type(exc).__name__}: {exc}"
    except (TypeError, ValueError) as exc:
        figures, error = None, f"{type(exc).__name__}: {exc}"
    return point.key, point.inputs(), figures, error, time.perf_counter() - start


def evaluate_chunk(points: Sequence[Point]) -> list[tuple]:
    """Run a chunk of points in order (a worker's unit of work)."""
    return [evaluate(point) for point in points]


def chunks(points: Sequence[Point], size: int = CHUNK_POINTS) -> list[list[Point]]:
    """Points grouped by model and device, cut into chunks of at most ``size``."""
    ordered = sorted(points, key=lambda p: (p.shape_key(), p.key))
    return [ordered[i:i + size] for i in range(0, len(ordered), size)]


class Progress:
    """One line on a terminal: points done, rate and time left."""

    def __init__(self, total: int, stream: TextIO | None) -> None:
        self.total = total
        self.done = 0
        self.stream = stream
        self.start = time.perf_counter()

    def advance(self, count: int) -> None:
        self.done += count
        if self.stream is None:
            return
        elapsed = time.perf_counter() - self.start
        rate = self.done / elapsed if elapsed else 0.0
        left = (self.total - self.done) / rate if rate else 0.0
        self.stream.write(f"\r{self.done}/{self.total} points, {rate:.1f} points/s, "
                          f"{left:.0f} s left   ")
        if self.done >= self.total:
            self.stream.write("\n")
        self.stream.flush()


def sweep(study: Study | Sequence[Point] | Mapping[str, Any],
          store: str | Path = "results.sqlite", *, jobs: int = 1, scheduler: str | None = None,
          progress: bool = False, name: str | None = None) -> SweepResult:
    """Run every point of ``study`` the store lacks and write one row per point.

    ``study`` is a Study, a list of points, or the keywords of :func:`memsim.study.grid`
    (``{"device": [...], "model": "llama-3-70b", "batch": [1, 8]}``). ``jobs`` local worker
    processes (1: in this process); ``scheduler`` ``"local"`` starts a Dask LocalCluster of
    ``jobs`` workers, ``"tcp://HOST:PORT"`` uses a running Dask scheduler.
    """
    if isinstance(study, Mapping):
        study = list(grid(**study))
    if isinstance(study, Study):
        points, study_name = list(study.points), name or study.name
    else:
        points, study_name = list(study), name or "study"
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(f"expected at least one job, got {jobs!r}", field="jobs")
    start = time.perf_counter()
    with Store(store) as results:
        held = results.keys()
        todo = [p for p in points if p.key not in held]
        bar = Progress(len(todo), sys.stderr if progress else None)
        errors = 0

        def record(rows: list[tuple]) -> None:
            nonlocal errors
            write_rows(results, study_name, rows)
            errors += sum(1 for row in rows if row[3] is not None)
            bar.advance(len(rows))

        work = chunks(todo)
        if scheduler is not None:
            _run_dask(work, scheduler, jobs, record)
        elif jobs == 1:
            for chunk in work:
                record(evaluate_chunk(chunk))
        else:
            _run_local(work, jobs, record)
    return SweepResult(store=str(store), study=study_name, points=len(points),
                       computed=len(todo), skipped=len(points) - len(todo), errors=errors,
                       seconds=time.perf_counter() - start)


def _run_local(work: list[list[Point]], jobs: int,
               record: Callable[[list[tuple]], None]) -> None:
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    with ProcessPoolExecutor(max_workers=jobs,
                             mp_context=multiprocessing.get_context(method)) as pool:
        futures = [pool.submit(evaluate_chunk, chunk) for chunk in work]
        for future in as_completed(futures):
            record(future.result())


def _run_dask(work: list[list[Point]], scheduler: str, jobs: int,
              record: Callable[[list[tuple]], None]) -> None:
    try:
        from distributed import Client, LocalCluster, as_completed as dask_completed
    except ImportError:
        raise ConfigError("a Dask scheduler needs dask: pip install 'memsim[dask]'",
                          field="--scheduler") from None
    cluster = None
    if scheduler == "local":
        cluster = LocalCluster(n_workers=jobs, threads_per_worker=1, processes=True,
                               dashboard_address=None)
        client = Client(cluster)
    elif scheduler.startswith("tcp://"):
        client = Client(scheduler)
    else:
        raise ConfigError(f"expected 'local' or tcp://HOST:PORT, got {scheduler!r}",
                          field="--scheduler")
    try:
        futures = client.map(evaluate_chunk, work, pure=False)
        for future in dask_completed(futures):
            record(future.result())
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def run_points(points: Iterable[Point]) -> list[tuple]:
    """Evaluate points one by one in this process (the benchmark's baseline)."""
    return [evaluate(point) for point in points]
