"""Studies: grids, the results store, resuming after a kill, Dask, exports and plots."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import memsim
from memsim.cli import main
from memsim.store import Store
from memsim.study import Point, grid, load_study
from memsim.sweep import evaluate, sweep

STUDY = """
name = "demo"
[grid]
device = ["h100-sxm", "mi300x"]
model = "llama-3.2-1b"
batch = [1, 8]
context = [512, 2048]
[grid.set]
"tiers.sram.capacity" = ["32 MiB", "1 GiB"]
[[point]]
device = "h100-sxm"
model = "llama-3-70b"
[[point]]
device = "h100-sxm"
model = "llama-3-8b"
[point.speculative]
draft = "llama-3.2-1b"
gamma = [2, 4]
acceptance = 0.8
"""


@pytest.fixture()
def study_file(tmp_path) -> Path:
    path = tmp_path / "study.toml"
    path.write_text(STUDY)
    return path


def _figures(path: Path) -> dict[str, tuple]:
    with Store(path) as store:
        return {r["key"]: (r["figures"], r["error"]) for r in store.rows()}


def test_a_grid_is_every_combination_with_stable_keys(study_file):
    study = load_study(study_file)
    assert study.name == "demo" and len(study.points) == 2 * 2 * 2 * 2 + 1 + 2
    again = load_study(study_file)
    assert [p.key for p in study.points] == [p.key for p in again.points]
    assert len({p.key for p in study.points}) == len(study.points)
    points = grid(device="h100-sxm", model="llama-3-8b", batch=[1, 2], weights="int8")
    assert [dict(p.workload) for p in points] == [{"batch": 1, "weights": "int8"},
                                                 {"batch": 2, "weights": "int8"}]


@pytest.mark.parametrize("text, field", [
    ('[grid]\ndevice = "h100-sxm"\nmodel = "llama-3-8b"\nbatchsize = [1]\n', "grid.batchsize"),
    ('[grid]\nmodel = "llama-3-8b"\n', "grid.device"),
    ('name = "x"\n', "grid"),
    ('nmae = "x"\n', "nmae"),
])
def test_bad_study_files_name_the_field(tmp_path, text, field):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(memsim.ConfigError) as info:
        load_study(path)
    assert info.value.field == field and info.value.file == str(path)


def test_a_sweep_stores_one_row_per_point_and_resumes(study_file, tmp_path):
    store = tmp_path / "r.sqlite"
    study = load_study(study_file)
    first = sweep(study, store)
    assert first.computed == len(study.points) and first.errors == 1     # 70B on one H100
    again = sweep(study, store)
    assert again.computed == 0 and again.skipped == len(study.points)
    rows = Store(store).rows()
    assert len(rows) == len(study.points)
    failed = [r for r in rows if r["error"]]
    assert failed[0]["inputs"]["model"] == "llama-3-70b" and "CapacityError" in failed[0]["error"]
    spec = [r for r in rows if r["inputs"]["speculative"]]
    assert len(spec) == 2 and all(r["figures"]["speedup"] > 1 for r in spec)
    assert all(r["version"] == memsim.__version__ for r in rows)


def test_worker_processes_give_the_same_rows(study_file, tmp_path):
    study = load_study(study_file)
    sweep(study, tmp_path / "one.sqlite")
    sweep(study, tmp_path / "two.sqlite", jobs=2)
    assert _figures(tmp_path / "one.sqlite") == _figures(tmp_path / "two.sqlite")


def test_a_killed_sweep_resumes_to_exactly_one_row_per_point(tmp_path):
    """SIGKILL half way, rerun: every point once, figures as an uninterrupted run's."""
    study = tmp_path / "big.toml"
    study.write_text('name = "big"\n[grid]\ndevice = ["h100-sxm", "mi300x", "b200"]\n'
                     'model = "llama-3-70b"\nweights = "int8"\n'
                     'batch = [1, 2, 3, 4, 6, 8, 12, 16]\n'
                     'context = [128, 256, 512, 1024, 2048, 4096, 8192, 16384]\n')
    store = tmp_path / "killed.sqlite"
    command = [sys.executable, "-m", "memsim.cli", "sweep", str(study), "--store", str(store),
               "--jobs", "2", "--quiet"]
    process = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    total = len(load_study(study).points)
    deadline = time.time() + 120
    held = 0
    while time.time() < deadline and process.poll() is None:
        time.sleep(0.05)
        try:
            with sqlite3.connect(store, timeout=5) as db:
                held = db.execute("SELECT COUNT(*) FROM points").fetchone()[0]
        except sqlite3.OperationalError:
            continue
        if held >= total // 4:
            break
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert 0 < held < total, "the sweep ended before it could be killed half way"
    assert subprocess.run(command, check=False).returncode == 0
    with sqlite3.connect(store) as db:
        keys = [row[0] for row in db.execute("SELECT key FROM points")]
    assert len(keys) == len(set(keys)) == total
    sweep(load_study(study), tmp_path / "clean.sqlite", jobs=2)
    assert _figures(store) == _figures(tmp_path / "clean.sqlite")


def test_a_dask_local_cluster_gives_the_same_rows(study_file, tmp_path):
    pytest.importorskip("distributed")
    study = load_study(study_file)
    sweep(study, tmp_path / "local.sqlite")
    result = sweep(study, tmp_path / "dask.sqlite", jobs=2, scheduler="local")
    assert result.computed == len(study.points)
    assert _figures(tmp_path / "local.sqlite") == _figures(tmp_path / "dask.sqlite")


def test_exports(study_file, tmp_path, capsys):
    store = tmp_path / "r.sqlite"
    sweep(load_study(study_file), store)
    assert main(["export", str(store), "--format", "csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + 19 and "figures.time_per_token_s" in lines[0]
    assert main(["export", str(store), "--format", "json", "-o", str(tmp_path / "r.json")]) == 0
    assert len(json.loads((tmp_path / "r.json").read_text())) == 19
    assert main(["export", str(tmp_path / "nothing.sqlite")]) == 2


def test_an_invalid_point_is_a_row_not_a_crash():
    key, inputs, figures, error, _ = evaluate(Point("h100-sxm", "llama-3-8b",
                                                    (("weights", "int3"),)))
    assert figures is None and "weights" in error


@pytest.mark.parametrize("kind", ["latency", "devices", "sram", "roofline", "bytes"])
def test_every_plot_renders_from_a_stored_study(tmp_path, kind):
    pytest.importorskip("matplotlib")
    study = tmp_path / "s.toml"
    study.write_text('name = "p"\n[grid]\ndevice = ["h100-sxm", "mi300x"]\nmodel = "llama-3.2-1b"\n'
                     'batch = [1, 4]\ncontext = [256, 1024]\n[grid.set]\n'
                     '"tiers.sram.capacity" = ["8 MiB", "64 MiB"]\n')
    store = tmp_path / "p.sqlite"
    assert main(["sweep", str(study), "--store", str(store), "--quiet"]) == 0
    out = tmp_path / f"{kind}.png"
    one = ["--where", "device=h100-sxm", "--where", "batch=1", "--where", "context=256",
           "--where", "tiers.sram.capacity=8 MiB"] if kind in ("roofline", "bytes") else []
    assert main(["plot", kind, str(store), "-o", str(out), *one]) == 0
    from matplotlib import image
    pixels = image.imread(out)
    assert pixels.shape[0] >= 300 and pixels.shape[1] >= 500
    assert pixels[..., :3].std() > 0.05                 # not a blank canvas


def test_points_that_differ_in_timing_figures_reuse_one_plan_with_the_same_results():
    from memsim.emulate import emulate
    from memsim.sweep import _PLANS
    _PLANS.clear()
    points = grid(device="h100-sxm", model="llama-3.2-1b", context=512,
                  set={"tiers.hbm.bandwidth": ["2 TB/s", "5 TB/s", "8 TB/s"],
                       "compute.bf16": ["500 TFLOPS", "2000 TFLOPS"]})
    for point in points:
        _, _, figures, error, _ = evaluate(point)
        dev = memsim.device("h100-sxm").with_overrides(dict(point.overrides))
        fresh = emulate(dev, "llama-3.2-1b", context=512)
        assert error is None
        assert figures["time_per_token_s"] == pytest.approx(fresh.time_per_token, rel=1e-12)
        assert figures["bytes_read"] == fresh.bytes_read
    assert len(_PLANS) == 1


def test_a_store_exports_to_a_dataframe_and_parquet(study_file, tmp_path):
    """With the dataframe extra installed (memsim[dataframe])."""
    pandas = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    store = tmp_path / "r.sqlite"
    sweep(load_study(study_file), store)
    with Store(store) as results:
        frame = results.to_dataframe()
        results.to_parquet(tmp_path / "r.parquet")
    assert len(frame) == 19 and "figures.time_per_token_s" in frame.columns
    assert len(pandas.read_parquet(tmp_path / "r.parquet")) == 19


def test_memsim_sweep_takes_a_grid_as_keywords(tmp_path):
    result = memsim.sweep({"device": ["h100-sxm", "mi300x"], "model": "llama-3.2-1b",
                           "batch": [1, 4]}, tmp_path / "g.sqlite")
    assert result.points == result.computed == 4 and result.errors == 0


# Nothing lost, nothing silently wrong (issue 18) -------------------------------------------

def _rows(path) -> list[dict]:
    with Store(path) as store:
        return store.rows()


def test_placement_works_in_a_study(tmp_path):
    result = memsim.sweep({"device": "h100-sxm", "model": "llama-3.2-1b",
                           "placement": {"kv": "hbm"}}, tmp_path / "p.sqlite")
    assert result.errors == 0 and result.computed == 1
    if importlib.util.find_spec("matplotlib"):          # a stored placement runs again
        from memsim.plot import figure
        assert figure("bytes", tmp_path / "p.sqlite").axes
    study = tmp_path / "p.toml"
    study.write_text('[grid]\ndevice = "h100-sxm"\nmodel = "llama-3.2-1b"\ncontext = [256, 512]\n'
                     '[grid.placement]\nkv = "hbm"\n')
    assert sweep(load_study(study), tmp_path / "q.sqlite").errors == 0


def test_integer_what_ifs_from_a_study_are_parsed_by_type(tmp_path):
    result = memsim.sweep({"device": "h100-sxm", "model": "llama-3.2-1b", "context": 256,
                           "set": {"cores": [132, 66], "tile.k": ["64"]}}, tmp_path / "c.sqlite")
    assert result.computed == 2 and result.errors == 0


def test_a_failure_of_any_kind_is_that_points_row(tmp_path, monkeypatch):
    sweeping = sys.modules["memsim.sweep"]
    real = sweeping.run_system

    def flaky(system):
        if system.workload.batch == 4:
            raise ZeroDivisionError("division by zero")
        return real(system)

    monkeypatch.setattr(sweeping, "run_system", flaky)
    result = sweep(grid(device="h100-sxm", model="llama-3.2-1b", context=256, batch=[1, 4]),
                   tmp_path / "z.sqlite")
    rows = _rows(tmp_path / "z.sqlite")
    assert result.computed == 2 and result.errors == 1 and len(rows) == 2
    assert sorted(r["error"] or "" for r in rows)[1].startswith("ZeroDivisionError")


def test_a_sweep_whose_points_all_fail_exits_non_zero(tmp_path, capsys):
    study = tmp_path / "bad.toml"
    study.write_text('[grid]\ndevice = "h100-sxm"\nmodel = "llama-3.2-1b"\nweights = "int3"\n')
    assert main(["sweep", str(study), "--store", str(tmp_path / "b.sqlite"), "--quiet"]) == 1
    assert "every point" in capsys.readouterr().err


@pytest.mark.parametrize("path", ["", ":memory:", "file::memory:?cache=shared"])
def test_a_store_that_keeps_nothing_is_refused(tmp_path, capsys, path):
    study = tmp_path / "s.toml"
    study.write_text('[grid]\ndevice = "h100-sxm"\nmodel = "llama-3.2-1b"\n')
    assert main(["sweep", str(study), "--store", path, "--quiet"]) == 2
    assert "store" in capsys.readouterr().err


def test_export_never_overwrites_its_own_store(tmp_path, capsys):
    store = tmp_path / "r.sqlite"
    memsim.sweep({"device": "h100-sxm", "model": "llama-3.2-1b", "context": 256}, store)
    before = store.read_bytes()
    assert main(["export", str(store), "-o", str(store)]) == 2
    assert main(["export", str(store), "-o", str(tmp_path / "." / "r.sqlite")]) == 2
    (tmp_path / "hard.sqlite").hardlink_to(store)        # another name of the same file
    assert main(["export", str(store), "-o", str(tmp_path / "hard.sqlite")]) == 2
    assert store.read_bytes() == before and len(_rows(store)) == 1


@pytest.mark.parametrize("verb", ["export", "plot"])
def test_writing_onto_a_folder_is_one_line(tmp_path, capsys, verb):
    """An output that is a folder ended in an IsADirectoryError traceback."""
    store = tmp_path / "r.sqlite"
    memsim.sweep({"device": "h100-sxm", "model": "llama-3.2-1b", "context": 256}, store)
    (tmp_path / "out.png").mkdir()
    argv = (["export", str(store)] if verb == "export" else ["plot", "devices", str(store)])
    assert main(argv + ["-o", str(tmp_path / "out.png")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "folder" in err


@pytest.mark.parametrize("verb", ["export", "plot"])
def test_writing_into_a_missing_folder_is_one_line(tmp_path, capsys, verb):
    store = tmp_path / "r.sqlite"
    memsim.sweep({"device": "h100-sxm", "model": "llama-3.2-1b", "context": 256}, store)
    argv = (["export", str(store)] if verb == "export" else ["plot", "devices", str(store)])
    assert main(argv + ["-o", str(tmp_path / "nope" / "out.png")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "does not exist" in err


def test_a_corrupted_store_is_noticed_and_salvaged(tmp_path, capsys):
    store = tmp_path / "r.sqlite"
    memsim.sweep({"device": "h100-sxm", "model": "llama-3.2-1b", "context": list(range(1, 81)),
                  "batch": [1, 2, 3, 4, 5, 6]}, store)
    with sqlite3.connect(store) as db:          # fold the WAL in, so the damage hits the rows
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = store.stat().st_size
    with open(store, "r+b") as f:
        f.seek(size // 2 // 4096 * 4096)
        f.write(os.urandom(16384))
    study = tmp_path / "s.toml"
    study.write_text('[grid]\ndevice = "h100-sxm"\nmodel = "llama-3.2-1b"\ncontext = 1\n')
    assert main(["sweep", str(study), "--store", str(store), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "damaged" in err and "memsim salvage" in err and len(err.splitlines()) == 1
    assert main(["export", str(store)]) == 2
    new = tmp_path / "saved.sqlite"
    assert main(["salvage", str(store), "-o", str(new)]) == 0
    kept = _rows(new)
    assert 0 < len(kept) < 480 and all(r["figures"] for r in kept)


def test_a_points_table_of_another_shape_is_refused(tmp_path):
    path = tmp_path / "other.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE points (id INTEGER, value TEXT)")
    with pytest.raises(memsim.ConfigError, match="columns"):
        Store(path)


def _open_each(folder: str) -> list[str]:
    """Open (and so create) 300 new stores in turn; the errors met."""
    errors = []
    for i in range(300):
        try:
            Store(os.path.join(folder, f"new{i}.sqlite")).close()
        except memsim.ConfigError as exc:
            errors.append(str(exc))
    return errors


def test_a_checkpoint_puts_the_rows_written_so_far_in_the_database_file(tmp_path):
    """What a sweep does half way through while its workers run: the rows written so far are in
    the database file itself, which a copy of that file alone (no WAL beside it) shows."""
    store = Store(tmp_path / "r.sqlite")
    store.add("a", "s", {"n": 1}, {"x": 1.0}, None, "v", 0.1)
    store.checkpoint()
    store.add("b", "s", {"n": 2}, {"x": 2.0}, None, "v", 0.1)
    (tmp_path / "copy.sqlite").write_bytes((tmp_path / "r.sqlite").read_bytes())
    copied = sqlite3.connect(tmp_path / "copy.sqlite")
    assert [row[0] for row in copied.execute("SELECT key FROM points")] == ["a"]
    copied.close()
    store.close()
    assert [row["key"] for row in Store(tmp_path / "r.sqlite").rows()] == ["a", "b"]


def test_concurrent_first_opens_of_a_new_store_both_succeed(tmp_path):
    """Three processes create the same 300 stores, unsynchronized (the switch to WAL raced)."""
    import multiprocessing
    with multiprocessing.get_context("fork").Pool(3) as pool:
        assert pool.map(_open_each, [str(tmp_path)] * 3) == [[], [], []]


def test_an_unreachable_dask_scheduler_is_one_line(tmp_path, capsys, monkeypatch):
    pytest.importorskip("distributed")
    sweeping = sys.modules["memsim.sweep"]
    monkeypatch.setattr(sweeping, "DASK_CONNECT_TIMEOUT", "1s")
    study = tmp_path / "s.toml"
    study.write_text('[grid]\ndevice = "h100-sxm"\nmodel = "llama-3.2-1b"\n')
    assert main(["sweep", str(study), "--store", str(tmp_path / "d.sqlite"), "--quiet",
                 "--scheduler", "tcp://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert "--scheduler" in err and len(err.splitlines()) == 1


LONG_STUDY = ('name = "long"\n[grid]\ndevice = "h100-sxm"\nmodel = "llama-3.2-1b"\n'
              'context = [{}]\n'.format(", ".join(str(c) for c in range(1, 241))))


def _children(pid: int) -> set[int]:
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.add(int(stat.parent.name))
    return found


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.add(pid)
    return alive


def _sweep_process(study: Path, store: Path, *flags: str) -> subprocess.Popen:
    """``memsim sweep`` as a terminal starts it: with Ctrl-C's default disposition, which a
    test run started in the background (a shell's ``&``) hands its children as ignored."""
    return subprocess.Popen([sys.executable, "-m", "memsim", "sweep", str(study), "--store",
                             str(store), *flags], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=_default_ctrl_c)


def _default_ctrl_c() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for_rows(store: Path, rows: int, process: subprocess.Popen, limit_s: float = 120):
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with sqlite3.connect(store, timeout=1) as db:
                if db.execute("SELECT count(*) FROM points").fetchone()[0] >= rows:
                    return
        except sqlite3.DatabaseError:
            pass
        time.sleep(0.05)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_keeps_the_rows_says_how_to_resume_and_exits_130(tmp_path):
    study = tmp_path / "long.toml"
    study.write_text(LONG_STUDY)
    store = tmp_path / "r.sqlite"
    process = _sweep_process(study, store, "--quiet")
    _wait_for_rows(store, 1, process)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert len(err.strip().splitlines()) == 1 and "again" in err and "kept" in err
    kept = len(_rows(store))
    done = _sweep_process(study, store, "--quiet")
    out, _ = done.communicate(timeout=600)
    assert done.returncode == 0 and f"{kept} already in" in out


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigkill_of_a_parallel_sweep_leaves_no_process_and_loses_no_row(tmp_path):
    import random
    study = tmp_path / "long.toml"
    study.write_text(LONG_STUDY)
    store = tmp_path / "r.sqlite"
    chance = random.Random(18)
    for _ in range(5):
        process = _sweep_process(study, store, "--jobs", "2", "--quiet")
        have = len(_rows(store)) if store.exists() else 0
        _wait_for_rows(store, have + chance.randint(1, 20), process)
        workers = _children(process.pid)
        process.kill()
        process.wait()
        deadline = time.monotonic() + 10
        while _alive(workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(workers), "workers outlived their parent"
    done = _sweep_process(study, store, "--jobs", "2", "--quiet")
    done.communicate(timeout=900)
    assert done.returncode == 0
    rows = _rows(store)
    keys = [r["key"] for r in rows]
    assert len(keys) == len(set(keys)) == 240 and not any(r["error"] for r in rows)
    assert {p.key for p in load_study(study).points} == set(keys)


# Plots a reader understands (issue 15.3) ----------------------------------------------------

@pytest.fixture(scope="module")
def plotted(tmp_path_factory) -> Path:
    pytest.importorskip("matplotlib")
    store = tmp_path_factory.mktemp("plots") / "p.sqlite"
    memsim.sweep({"device": ["h100-sxm", "mi300x", "h200"],
                  "model": ["llama-3.2-1b", "llama-3-8b"], "batch": [1, 8],
                  "context": [256, 1024], "weights": "int8"}, store)
    return store


def _texts(fig) -> tuple[str, list[list[str]]]:
    title = fig.get_suptitle() + " ".join(
        ax.get_title() for ax in fig.axes)
    legends = [[t.get_text() for t in ax.get_legend().get_texts()] if ax.get_legend() else []
               for ax in fig.axes]
    return title, legends


def test_a_plot_titles_the_fixed_inputs_and_labels_the_varying_ones(plotted):
    from memsim.plot import figure
    fig = figure("latency", plotted, where={"model": "llama-3-8b", "context": "256"})
    title, legends = _texts(fig)
    assert "weights=int8" in title and "model=llama-3-8b" in title and "context=256" in title
    labels = [label for legend in legends for label in legend]
    assert sorted(labels) == ["h100-sxm", "h200", "mi300x"]
    assert all(len(ax.get_lines()) == 3 for ax in fig.axes)


def test_more_than_8_series_become_small_multiples(plotted):
    from memsim.plot import LEGEND_INSIDE, figure
    fig = figure("latency", plotted)
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == 3 and {ax.get_title() for ax in visible} == {"h100-sxm", "mi300x",
                                                                        "h200"}
    assert all(0 < len(ax.get_lines()) <= LEGEND_INSIDE for ax in visible)
    assert sum(len(ax.get_lines()) for ax in visible) == 12
    shared = [t.get_text() for t in fig.legends[0].get_texts()]
    assert len(shared) == 4 and all("device" not in label for label in shared)
    assert shared.index("context=256, llama-3-8b") < shared.index("context=1024, llama-3-8b")


def test_a_plot_of_one_point_needs_where_to_pick_it(plotted):
    from memsim.plot import figure
    with pytest.raises(memsim.ConfigError) as info:
        figure("roofline", plotted)
    assert info.value.field == "where" and "batch" in str(info.value) \
        and "device" in str(info.value) and "weights" not in str(info.value)
    one = {"device": "h100-sxm", "model": "llama-3-8b", "batch": "8", "context": "1024"}
    assert figure("roofline", plotted, where=one).axes


def test_plot_bytes_counts_each_tier_boundary_once(plotted):
    from memsim.plot import figure, rerun
    one = {"device": "h100-sxm", "model": "llama-3-8b", "batch": "8", "context": "1024"}
    fig = figure("bytes", plotted, where=one)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert not any("sram" in label for label in labels)
    drawn = sum(patch.get_height() for patch in ax.patches) * 1e9
    with Store(plotted) as store:
        row = next(r for r in store.rows() if r["inputs"]["device"] == "h100-sxm"
                   and r["inputs"]["model"] == "llama-3-8b"
                   and r["inputs"]["workload"]["batch"] == 8
                   and r["inputs"]["workload"]["context"] == 1024)
    _, report = rerun(row)
    assert drawn == pytest.approx(report.bytes_read["hbm"] + report.bytes_written["hbm"],
                                  rel=1e-9)
    assert report.bytes_read["hbm"] == row["figures"]["bytes_read"]["hbm"]
