"""Running a study: every point the store lacks, on local worker processes or a Dask cluster.

Points are cut into chunks of points that share a model and device (a worker keeps what it
loaded), and the chunks run in parallel; only this process writes the store, one committed row
per point as its chunk comes back. A point that fails, in whatever way, becomes a row with its
error, and the sweep goes on: a worker that dies (killed, or crashed in native code) takes down
the chunk it was running, whose points run again one a chunk on new workers, so that the point
that kills its worker gets an error row and every other point its figures. Workers die
with the process that started them, and Ctrl-C stops the sweep with every finished row kept
(:class:`SweepInterrupted`).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import math
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, TextIO

from memsim.emulate import run_system
from memsim.errors import ConfigError
from memsim.inputs import (decode_from, device_from, device_stamp, model_from, model_stamp,
                           request_of)
from memsim.plan import is_timing_path, plan_system, retarget
from memsim.speculative import speculative
from memsim.store import Store, encoded, write_rows
from memsim.study import Point, Study, grid, unique_points

CHUNK_POINTS = 8               # the fewest points of a chunk ...
MAX_CHUNK_POINTS = 32          # ... and the most, when a study has many points per worker
CHUNKS_PER_WORKER = 16         # enough chunks that the last ones balance the workers' loads
PR_SET_PDEATHSIG = 1            # prctl(2) option: a signal for the child when its parent dies
PARENT_POLL_S = 1.0
DASK_CONNECT_TIMEOUT = "10s"


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
    first_error: str | None = None   # the first of them, to say what went wrong

    @property
    def points_per_s(self) -> float:
        """Points computed per second of this run."""
        return self.computed / self.seconds if self.seconds else 0.0


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C during a sweep: the rows written so far are kept; a rerun computes the rest."""

    def __init__(self, store: str, written: int) -> None:
        super().__init__(f"{written} rows kept in {store}")
        self.store = store
        self.written = written


def point_device(point: Point) -> Any:
    """The device a stored point describes, built as every what-if is (:mod:`memsim.inputs`)."""
    return device_from(request_of(point.device, sets=point.overrides, add_tiers=point.add_tiers,
                                  workload=dict(point.workload)))


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
    (bandwidths, latencies, energies, peaks) is reused with the figures swapped, unless the
    swap would change a count (:func:`memsim.plan.retarget`)."""
    shape = (point.device, device_stamp(point.device), point.model, model_stamp(point.model),
             point.add_tiers, point.workload,
             tuple(kv for kv in point.overrides if not is_timing_path(kv[0])))
    cached = _PLANS.get(shape)
    if cached is not None:
        reused = retarget(cached, dev)
        if reused is not None:
            return reused
    system = plan_system(dev, mod, decode_from(dict(point.workload)))
    if cached is None:
        if len(_PLANS) >= PLAN_CACHE:
            _PLANS.pop(next(iter(_PLANS)))
        _PLANS[shape] = system
    return system


def evaluate(point: Point) -> tuple[str, dict[str, Any], dict[str, Any] | None, str | None, float]:
    """Run one point: ``(key, inputs, figures, error, seconds)``; a bad point's error is kept."""
    start = time.perf_counter()
    try:
        dev = point_device(point)
        mod = model_from(point.model)
        if point.speculative:
            spec = dict(point.speculative)
            draft = spec.pop("draft", None)
            gamma = spec.pop("gamma", 4)
            acceptance = spec.pop("acceptance", 0.8)
            tree = spec.pop("tree", None)
            report = speculative(dev, mod, model_from(draft) if draft else None, gamma,
                                 list(acceptance) if isinstance(acceptance, tuple) else acceptance,
                                 tree=list(tree) if tree else None, **spec,
                                 **dict(point.workload))
            figures = {k: v for k, v in report.to_dict().items()
                       if k not in ("monte_carlo", "verify_time_by_bound")}
        else:
            figures = figures_of(run_system(_plan(point, dev, mod)))
        figures = plain_figures(figures)
        error = None
    except (Exception, SystemExit) as exc:   # noqa: BLE001 - any failure is this point's row
        figures, error = None, f"{type(exc).__name__}: {exc}"
    return point.key, point.inputs(), figures, error, time.perf_counter() - start


class NonFiniteFigure(ValueError):
    """A figure came out NaN or infinite: the point's row says which, instead of a number."""


def plain_figures(value: Any, path: str = "") -> Any:
    """Figures as plain JSON data (numpy scalars as Python numbers); a NaN or infinite figure
    raises :class:`NonFiniteFigure` naming it, so that no row stores one as a number."""
    if isinstance(value, Mapping):
        return {str(k): plain_figures(v, f"{path}{k}.") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_figures(v, f"{path}{i}.") for i, v in enumerate(value)]
    if hasattr(value, "item") and callable(value.item):     # a numpy scalar
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        raise NonFiniteFigure(f"figure {path.rstrip('.')} is {value!r}, not a finite number")
    return value


def evaluate_chunk(points: Sequence[Point]) -> list[tuple]:
    """Run a chunk of points in order (a worker's unit of work)."""
    return [evaluate(point) for point in points]


def evaluate_encoded(points: Sequence[Point]) -> list[tuple]:
    """:func:`evaluate_chunk` as a worker answers: each row without its key, which the process
    that sent the points holds (:func:`with_keys`), and its inputs and figures already the
    store's JSON texts (:func:`memsim.store.encoded`), so that the one process writing the
    store neither encodes them nor unpickles their dictionaries."""
    return [(*encoded(inputs, figures), error, seconds)
            for _key, inputs, figures, error, seconds in evaluate_chunk(points)]


def with_keys(points: Sequence[Point], answer: Sequence[tuple]) -> list[tuple]:
    """The store's rows of ``points`` from :func:`evaluate_encoded`'s answer for them."""
    return [(point.key, *rest) for point, rest in zip(points, answer)]


def chunk_size(points: int, jobs: int) -> int:
    """Points per chunk: :data:`CHUNKS_PER_WORKER` chunks per worker, of at least
    :data:`CHUNK_POINTS` and at most :data:`MAX_CHUNK_POINTS` points (at a millisecond a point
    each chunk's round trip to its worker shows, and the last chunks must still balance)."""
    return max(CHUNK_POINTS, min(MAX_CHUNK_POINTS, points // (CHUNKS_PER_WORKER * jobs)))


def chunks(points: Sequence[Point], size: int = CHUNK_POINTS,
           jobs: int = 1) -> list[list[Point]]:
    """Points grouped by model and device, cut into chunks of at most ``size``; the points of
    the last ``jobs`` such chunks (the ones the workers take last) in chunks of at most
    :data:`CHUNK_POINTS`, so that the workers finish within a small chunk of each other."""
    ordered = sorted(points, key=lambda p: (p.shape_key(), p.key))
    work = [ordered[i:i + size] for i in range(0, len(ordered), size)]
    if jobs < 2:
        return work
    last = [point for chunk in work[-jobs:] for point in chunk]
    return work[:-jobs] + [last[i:i + CHUNK_POINTS] for i in range(0, len(last), CHUNK_POINTS)]


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
    ``jobs`` workers, ``"tcp://HOST:PORT"`` uses a running Dask scheduler. A point's failure is
    its row's error; Ctrl-C raises :class:`SweepInterrupted` with the finished rows kept.
    """
    if isinstance(study, Mapping):
        study = list(grid(**study))
    if isinstance(study, Study):
        points, study_name = unique_points(study.points), name or study.name
    else:
        points, study_name = unique_points(study), name or "study"
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(f"expected at least one job, got {jobs!r}", field="jobs")
    start = time.perf_counter()
    from memsim import __version__
    with LocalWorkers(jobs) as workers, Store(store) as results:
        held = results.keys(version=__version__)
        held -= _edited(results, [p for p in points if p.key in held])
        # a held point joins the study now, a computed one as its row is written
        results.claim(study_name, (p.key for p in points if p.key in held))
        todo = [p for p in points if p.key not in held]
        bar = Progress(len(todo), sys.stderr if progress else None)
        errors: list[str] = []
        written = 0
        # with workers, the rows written so far are synced into the file when half, three
        # quarters and seven eighths are in, while the workers run the rest: the close syncs
        # the last eighth
        checkpoints = ([len(todo) - len(todo) // 2 ** k for k in (1, 2, 3)]
                       if jobs > 1 or scheduler is not None else [])

        def record(rows: list[tuple]) -> None:
            nonlocal written
            written += write_rows(results, study_name, rows)
            errors.extend(row[3] for row in rows if row[3] is not None)
            before = bar.done
            bar.advance(len(rows))
            if any(before < mark <= bar.done for mark in checkpoints):
                results.checkpoint()

        work = chunks(todo, chunk_size(len(todo), jobs), jobs)
        try:
            if scheduler is not None:
                _run_dask(work, scheduler, jobs, workers, record)
            elif jobs == 1:
                for chunk in work:
                    record(evaluate_chunk(chunk))
            else:
                _isolate(workers.run(work, record), workers, record)
        except KeyboardInterrupt:
            if bar.stream is not None:
                bar.stream.write("\n")         # end the progress line
            raise SweepInterrupted(str(store), written) from None
    return SweepResult(store=str(store), study=study_name, points=len(points),
                       computed=len(todo), skipped=len(points) - len(todo), errors=len(errors),
                       seconds=time.perf_counter() - start,
                       first_error=errors[0] if errors else None)


def _edited(results: Store, held: Sequence[Point]) -> set[str]:
    """Keys of the held points whose named files (:meth:`Point.named_files`) hold other
    contents than when their rows were computed: the rows are computed again, not reused."""
    named = [p for p in held if p.named_files()]
    stored = results.files_of(p.key for p in named)
    return {p.key for p in named if p.key in stored and stored[p.key] != p.file_digests()}


def _die_with_parent(parent: int) -> None:
    """A worker's start: ignore Ctrl-C (the parent decides) and end when the parent ends.

    On Linux the kernel sends SIGKILL when the parent dies (``prctl(PR_SET_PDEATHSIG)``);
    elsewhere a daemon thread watches the parent's pid.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:          # the parent died before the signal was asked for
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


WORKER_DIED = ("WorkerDied: the worker process running this point ended abruptly (killed, out "
               "of memory, or crashed in native code)")
PREFETCH_CHUNKS = 2     # chunks a worker holds: the one it runs and the next, so it never waits


def _start_method() -> str:
    return "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


def _serve_chunks(conn: Connection, work: Sequence[Sequence[Point]], parent: int) -> None:
    """A worker: answer each chunk index that arrives (:func:`evaluate_encoded` of that chunk
    of ``work``, which a forked worker holds from its parent) in turn, until None."""
    _die_with_parent(parent)
    while (index := conn.recv()) is not None:
        conn.send(evaluate_encoded(work[index]))


class LocalWorkers:
    """Worker processes on this machine, forked when :meth:`run` is given work and joined when
    the ``with`` block ends (after the store's last write, so that their exits overlap it).

    Each worker holds :data:`PREFETCH_CHUNKS` chunk indices and answers them in order, so the
    first index it holds is the chunk it is running: a worker that dies loses that chunk alone,
    its other chunks go to the next worker, and a new worker takes its place.
    """

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self.started: list[Any] = []

    def __enter__(self) -> LocalWorkers:
        return self

    def __exit__(self, *exc: object) -> None:
        for process in self.started:
            process.join()
        self.started.clear()

    def run(self, work: Sequence[Sequence[Point]],
            record: Callable[[list[tuple]], None]) -> list[Sequence[Point]]:
        """Run the chunks; the chunks whose worker died running them, not recorded."""
        context = multiprocessing.get_context(_start_method())
        queue = deque(range(len(work)))
        held: dict[Connection, deque[int]] = {}
        lost: list[Sequence[Point]] = []

        def feed(conn: Connection) -> None:
            mine = held[conn]
            depth = PREFETCH_CHUNKS if len(queue) > self.jobs else 1   # the last: one each
            while queue and len(mine) < depth:
                mine.append(queue.popleft())
                _send(conn, mine[-1])
            if not mine:
                _send(conn, None)
                del held[conn]
                conn.close()

        def start() -> None:
            here, there = context.Pipe()
            process = context.Process(target=_serve_chunks, args=(there, work, os.getpid()),
                                      daemon=True)
            with _frozen_heap():
                process.start()
            there.close()
            self.started.append(process)
            held[here] = deque()
            feed(here)

        try:
            for _ in range(min(self.jobs, len(work))):
                start()
            while held:
                for conn in wait(list(held)):
                    try:
                        answer = conn.recv()
                    except (EOFError, OSError):         # the worker died
                        mine = held.pop(conn)
                        conn.close()
                        lost.append(work[mine.popleft()])
                        queue.extendleft(reversed(mine))
                        if queue:
                            start()
                        continue
                    record(with_keys(work[held[conn].popleft()], answer))
                    feed(conn)
        except BaseException:
            for process in self.started:
                process.kill()
            raise
        return lost


def _send(conn: Connection, message: int | None) -> None:
    """Send to a worker; one that died meanwhile is noticed when its answer cannot be read."""
    with contextlib.suppress(OSError):
        conn.send(message)


@contextlib.contextmanager
def _frozen_heap():
    """This process's objects kept out of the garbage collector's passes while a worker forks
    from it (``gc.freeze``): a collection in a worker would touch every inherited object and
    so copy each page of the parent's heap (the Python docs' advice for a pre-fork server).
    Objects frozen before stay frozen."""
    frozen = gc.get_freeze_count() == 0
    if frozen:
        gc.freeze()
    try:
        yield
    finally:
        if frozen:
            gc.unfreeze()


def _isolate(lost: list[Sequence[Point]], workers: LocalWorkers,
             record: Callable[[list[tuple]], None]) -> None:
    """The points of chunks whose worker died, run again one a chunk: a worker that dies now
    names the point that killed it (an error row), and every other point gets its figures."""
    if lost:
        for (culprit,) in workers.run([[p] for chunk in lost for p in chunk], record):
            record([(culprit.key, culprit.inputs(), None, WORKER_DIED, 0.0)])


def _run_dask(work: list[list[Point]], scheduler: str, jobs: int, workers: LocalWorkers,
              record: Callable[[list[tuple]], None]) -> None:
    try:
        from distributed import Client, LocalCluster, as_completed as dask_completed
    except ImportError:
        raise ConfigError("a Dask scheduler needs dask: pip install 'memsim[dask]'",
                          field="--scheduler") from None
    if scheduler != "local" and not scheduler.startswith("tcp://"):
        raise ConfigError(f"expected 'local' or tcp://HOST:PORT, got {scheduler!r}",
                          field="--scheduler")
    cluster = None
    try:
        if scheduler == "local":
            cluster = LocalCluster(n_workers=jobs, threads_per_worker=1, processes=True,
                                   dashboard_address=None)
            client = Client(cluster)
        else:
            client = Client(scheduler, timeout=DASK_CONNECT_TIMEOUT)
    except (OSError, TimeoutError) as exc:
        if cluster is not None:
            cluster.close()
        raise ConfigError(f"cannot reach the Dask scheduler ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else 'no answer'}); is it "
                          "running?", field="--scheduler") from None
    lost: list[Point] = []
    try:
        futures = client.map(evaluate_chunk, work, pure=False)
        chunk_of = {future.key: chunk for future, chunk in zip(futures, work)}
        for future in dask_completed(futures):
            try:
                rows = future.result()
            except Exception:       # noqa: BLE001 - a killed worker (KilledWorker) or worse
                lost += chunk_of[future.key]
                continue
            record(rows)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    _isolate(lost, workers, record)


def run_points(points: Iterable[Point]) -> list[tuple]:
    """Evaluate points one by one in this process (the benchmark's baseline)."""
    return [evaluate(point) for point in points]
