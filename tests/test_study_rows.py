"""Every point of a study ends as exactly one row of its store: figures, or the error that
stopped it. Each test here is a way a row used to be lost, doubled or silently wrong."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import signal
import sys

import pytest

import memsim
from memsim.store import Store
from memsim.study import grid, load_study
from memsim.sweep import WORKER_DIED, sweep

SMALL = {"device": "h100-sxm", "model": "llama-3.2-1b", "context": 256}


def _rows(path, study=None):
    with Store(path) as store:
        return store.rows(study)


def test_a_point_two_studies_share_is_in_both_exports(tmp_path):
    path = tmp_path / "s.sqlite"
    sweep({**SMALL, "batch": [1, 2]}, path, name="A")
    second = sweep({**SMALL, "batch": [2, 4]}, path, name="B")
    assert second.computed == 1 and second.skipped == 1        # batch 2 is computed once
    batches = sorted(r["inputs"]["workload"]["batch"] for r in _rows(path, "B"))
    assert batches == [2, 4]                                     # was [4]: batch 2 lost
    assert {r["study"] for r in _rows(path, "B")} == {"B"}
    assert sorted(r["inputs"]["workload"]["batch"] for r in _rows(path, "A")) == [1, 2]
    with Store(path) as store:
        assert len(store.rows()) == 3 and "B" in store.to_csv("B")


def test_a_point_listed_twice_is_one_point_and_one_row(tmp_path):
    result = sweep({**SMALL, "batch": [8, 8]}, tmp_path / "d.sqlite")
    assert (result.points, result.computed) == (1, 1)             # was 2 points, 2 computed
    assert len(_rows(tmp_path / "d.sqlite")) == 1


def test_a_row_of_another_memsim_version_is_computed_again_and_replaced(tmp_path):
    path = tmp_path / "v.sqlite"
    point = grid(**SMALL)[0]
    with Store(path) as store:
        store.add(point.key, "old", point.inputs(), {"time_per_token_s": 1.0}, None, "0.0.1",
                  0.0)
    result = sweep([point], path)
    assert result.computed == 1                                   # was skipped: stale figures
    (row,) = _rows(path)
    assert row["version"] == memsim.__version__
    assert row["figures"]["time_per_token_s"] != 1.0


def test_a_rerun_at_the_same_version_keeps_the_first_row(tmp_path):
    path = tmp_path / "r.sqlite"
    sweep({**SMALL, "batch": [1]}, path)
    first = _rows(path)
    again = sweep({**SMALL, "batch": [1, 2]}, path)
    assert (again.computed, again.skipped) == (1, 1)
    assert [r for r in _rows(path) if r["key"] == first[0]["key"]] == first


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork and SIGKILL")
def test_a_point_that_kills_its_worker_is_an_error_row_the_rest_have_figures_none_lingers(tmp_path, monkeypatch):
    sweeping = sys.modules["memsim.sweep"]
    real = sweeping.run_system

    def deadly(system):
        if system.workload.batch == 13:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(system)

    monkeypatch.setattr(sweeping, "run_system", deadly)
    path = tmp_path / "k.sqlite"
    batches = list(range(1, 41))        # five chunks: the dead worker's next ones go on
    result = sweep({**SMALL, "batch": batches}, path, jobs=2)
    rows = {r["inputs"]["workload"]["batch"]: r for r in _rows(path)}
    assert sorted(rows) == batches and result.errors == 1
    assert rows[13]["error"] == WORKER_DIED and rows[13]["figures"] is None
    assert all(rows[b]["figures"] is not None and rows[b]["error"] is None
               for b in batches if b != 13)
    assert multiprocessing.active_children() == []


def test_a_point_that_calls_exit_is_an_error_row(tmp_path, monkeypatch):
    sweeping = sys.modules["memsim.sweep"]
    real = sweeping.run_system

    def exits(system):
        if system.workload.batch == 2:
            sys.exit(3)
        return real(system)

    monkeypatch.setattr(sweeping, "run_system", exits)
    result = sweep({**SMALL, "batch": [1, 2]}, tmp_path / "e.sqlite")   # was SystemExit
    assert result.errors == 1 and len(_rows(tmp_path / "e.sqlite")) == 2
    assert result.first_error == "SystemExit: 3"


def test_a_nan_figure_is_an_error_naming_it_not_a_number_in_the_store(tmp_path, monkeypatch):
    sweeping = sys.modules["memsim.sweep"]
    real = sweeping.figures_of
    monkeypatch.setattr(sweeping, "figures_of",
                        lambda report: {**real(report), "energy_per_token_j": math.nan})
    path = tmp_path / "n.sqlite"
    result = sweep(SMALL, path)
    (row,) = _rows(path)
    assert result.errors == 1 and row["figures"] is None           # was NaN stored as a number
    assert "energy_per_token_j" in row["error"] and "nan" in row["error"]
    with Store(path) as store:
        assert "NaN" not in store.to_json()


def test_points_that_differ_only_in_a_what_if_are_two_rows_with_their_own_figures(tmp_path):
    path = tmp_path / "w.sqlite"
    study = tmp_path / "w.toml"
    study.write_text('name = "w"\n[grid]\ndevice = "h100-sxm"\nmodel = "llama-3.2-1b"\n'
                     'context = 256\n[grid.set]\n"tiers.hbm.bandwidth" = ["3.35 TB/s", "1 TB/s"]\n'
                     '[[point]]\ndevice = "h100-sxm"\nmodel = "llama-3.2-1b"\ncontext = 256\n'
                     '[point.set]\n"tiers.hbm.bandwidth" = "1 TB/s"\n'
                     '[[point]]\ndevice = "h100-sxm"\nmodel = "llama-3.2-1b"\ncontext = 256\n')
    loaded = load_study(study)
    assert len(loaded.points) == 3           # the [[point]] with 1 TB/s is the grid's; the other
    result = sweep(loaded, path)             # differs from the 3.35 TB/s one in a what-if only
    rows = _rows(path)
    assert result.points == 3 and len(rows) == 3 and all(r["error"] is None for r in rows)
    by_set = {json.dumps(r["inputs"]["set"]): r["figures"]["time_per_token_s"] for r in rows}
    plain, same, slow = (by_set["{}"], by_set['{"tiers.hbm.bandwidth": "3.35 TB/s"}'],
                         by_set['{"tiers.hbm.bandwidth": "1 TB/s"}'])
    assert plain == pytest.approx(same, rel=1e-12) and same < slow   # the file's peak: 3.35 TB/s


def test_error_rows_survive_every_export(tmp_path):
    path = tmp_path / "x.sqlite"
    sweep({**SMALL, "weights": ["bf16", "int3"]}, path)
    with Store(path) as store:
        csv_rows = store.to_csv().splitlines()
        data = json.loads(store.to_json())
    assert len(csv_rows) == 3 and len(data) == 2
    assert sum(r["error"] is not None for r in data) == 1


def test_a_workload_field_at_its_default_is_the_same_point(tmp_path):
    # a [[point]] spelling out batch = 1 and a grid leaving it out asked for one point: it was
    # two points and two rows of the same figures
    study = tmp_path / "d.toml"
    study.write_text('[grid]\ndevice = "h100-sxm"\nmodel = "llama-3.2-1b"\ncontext = 256\n'
                     '[[point]]\ndevice = "h100-sxm"\nmodel = "llama-3.2-1b"\ncontext = 256\n'
                     'batch = 1\nkv = "bf16"\n'
                     '[[point]]\ndevice = "h100-sxm"\nmodel = "llama-3.2-1b"\ncontext = 256\n'
                     'tp = 1.0\n')
    points = load_study(study).points
    assert len(points) == 2                   # tp = 1.0 is a mistake, its own (error) row
    result = sweep(load_study(study), tmp_path / "d.sqlite")
    assert result.points == 2 and result.errors == 1


def test_counts_stay_exact_in_a_dataframe_with_error_rows(tmp_path):
    pytest.importorskip("pandas")
    path = tmp_path / "p.sqlite"
    with Store(path) as store:
        store.add("a", "s", {"workload": {}}, {"flops": 2**60 + 1, "link_bytes": 2**64 + 1,
                                               "time_per_token_s": 0.5}, None, "v", 0.0)
        store.add("b", "s", {"workload": {}}, None, "ConfigError: no", "v", 0.0)
        frame = store.to_dataframe()
    # an error row made the column float64: 2^60 + 1 came back as 1.152921504606847e18
    assert int(frame["figures.flops"][0]) == 2**60 + 1
    assert frame["figures.link_bytes"][0] == 2**64 + 1
    assert frame["figures.flops"].isna()[1] and frame["figures.time_per_token_s"][0] == 0.5


def test_a_chunk_is_one_transaction(tmp_path):
    """Store.add_many commits a chunk's rows at once; a refused row (NaN) writes none of them,
    and a key already held at this version is not added twice."""
    path = tmp_path / "c.sqlite"
    good = ("k1", {"device": "x"}, {"time_per_token_s": 1.0}, None, 0.1)
    with Store(path) as store:
        assert store.add_many("s", [good, ("k2", {}, None, "an error", 0.1)], "v") == 2
        with pytest.raises(ValueError):
            store.add_many("s", [("k3", {}, {"a": 1.0}, None, 0.1),
                                 ("k4", {}, {"a": float("nan")}, None, 0.1)], "v")
        assert store.keys() == {"k1", "k2"}
        assert store.add_many("s", [good], "v") == 0


def test_a_quantity_with_or_without_its_space_is_one_point():
    """'5TB/s' and '5 TB/s' are one what-if (units.parse_quantity reads both alike): one key,
    one row; another spelling of the same value ('5000 GB/s') stays its own point."""
    points = grid(device="h100-sxm", model="llama-3.2-1b",
                  set={"tiers.hbm.bandwidth": ["5TB/s", "5 TB/s", " 5  TB/s", "5000 GB/s"]})
    assert len({p.key for p in points}) == 2
    assert len({p.key for p in grid(device="h100-sxm", model="llama-3.2-1b",
                                    set={"link.kind": ["nvlink", "pcie"]})}) == 2
