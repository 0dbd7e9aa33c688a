"""The results store: one SQLite row per study point, written as each point completes.

A row holds the point's key, its study, its inputs, its figures (or the error that stopped it),
memsim's version and how long it took. Rows are inserted once per memsim version (the first write
of a key wins; a row another version wrote is replaced when this one computes the point again, as
is a row computed from other contents of a device, model or runtime file the point names by path,
which its inputs' ``files`` record) and
each chunk a worker returns is committed as it arrives, so a study killed at any moment keeps every
chunk it wrote, and a rerun computes only the points the store does not hold at this version.

A point belongs to every study that asked for it (the ``members`` table): two studies sharing a
point in one store compute it once, and each study's export holds it.

Opening checks the file: a store path that keeps nothing (``""``, ``:memory:``) is refused, a
damaged file (``PRAGMA quick_check``) or a ``points`` table of another shape is refused with
what is wrong, and :func:`salvage` copies the readable rows of a damaged store into a new one.
"""

from __future__ import annotations

import csv
import io
import json
import sqlite3
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from memsim.errors import ConfigError

SCHEMA = """
CREATE TABLE IF NOT EXISTS points (
    key TEXT PRIMARY KEY,
    study TEXT NOT NULL,
    inputs TEXT NOT NULL,
    figures TEXT,
    error TEXT,
    version TEXT NOT NULL,
    seconds REAL NOT NULL,
    written REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS members (
    study TEXT NOT NULL,
    key TEXT NOT NULL,
    PRIMARY KEY (study, key)
)
"""
COLUMNS = ("key", "study", "inputs", "figures", "error", "version", "seconds", "written")
OPEN_TIMEOUT_S = 30.0
LOCK_RETRY_S = 0.05
NOT_A_FILE = ("", ":memory:")


def _locked(exc: sqlite3.DatabaseError) -> bool:
    return "locked" in str(exc) or "busy" in str(exc)


class Store:
    """A SQLite file of study results."""

    def __init__(self, path: str | Path, *, create: bool = True) -> None:
        self.path = str(path)
        if self.path.strip() in NOT_A_FILE or self.path.startswith("file:"):
            raise ConfigError(f"a results store is a file; {self.path!r} would keep nothing",
                              field="store")
        if not create and not Path(self.path).exists():
            raise ConfigError("no such results store", file=self.path, field="store")
        try:
            self.db = sqlite3.connect(self.path, timeout=OPEN_TIMEOUT_S)
            self._setup()
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"not a memsim results store: {exc}", file=self.path,
                              field="store") from None

    def _setup(self) -> None:
        """WAL mode and the table, retried while another process does the same on a new file
        (the switch to WAL takes a lock that the busy timeout does not wait for)."""
        deadline = time.monotonic() + OPEN_TIMEOUT_S
        while True:
            try:
                if self.db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                    self.db.execute("PRAGMA journal_mode=WAL")
                # a committed row survives the process being killed; only a power cut could
                # lose the last commits, which a rerun then computes again
                self.db.execute("PRAGMA synchronous=NORMAL")
                self.db.executescript(SCHEMA)
                self.db.commit()
                break
            except sqlite3.OperationalError as exc:
                if not _locked(exc) or time.monotonic() > deadline:
                    raise
                self.db.rollback()
                time.sleep(LOCK_RETRY_S)
        self._check()

    def _check(self) -> None:
        columns = tuple(row[1] for row in self.db.execute("PRAGMA table_info(points)"))
        if columns != COLUMNS:
            raise ConfigError(f"its points table has columns {', '.join(columns)}, not a memsim "
                              f"store's ({', '.join(COLUMNS)})", file=self.path, field="store")
        problems = [row[0] for row in self.db.execute("PRAGMA quick_check(3)")]
        if problems != ["ok"]:
            first = " ".join(problems[0].split())
            raise ConfigError(f"the store is damaged ({first}); copy its readable rows "
                              f"into a new store with `memsim salvage {self.path} -o NEW.sqlite`",
                              file=self.path, field="store")

    def close(self) -> None:
        """Close the database (the last connection copies the WAL into the file and syncs it)."""
        self.db.close()

    def checkpoint(self) -> None:
        """Copy the rows committed so far from the WAL into the database file and sync it
        (SQLite's passive checkpoint), so that closing later syncs only the rows after them."""
        self.db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def keys(self, version: str | None = None) -> set[str]:
        """Keys of the points the store holds (written by memsim ``version``, if given)."""
        if version is None:
            return {row[0] for row in self.db.execute("SELECT key FROM points")}
        return {row[0] for row in self.db.execute("SELECT key FROM points WHERE version = ?",
                                                  (version,))}

    def files_of(self, keys: Iterable[str]) -> dict[str, Any]:
        """The ``files`` the stored rows of ``keys`` record (each named file's digest when the
        row was computed; None for a row that names none)."""
        out = {}
        for key in keys:
            row = self.db.execute("SELECT json_extract(inputs, '$.files') FROM points "
                                  "WHERE key = ?", (key,)).fetchone()
            if row is not None:
                out[key] = None if row[0] is None else json.loads(row[0])
        return out

    def claim(self, study: str, keys: Iterable[str]) -> None:
        """Record that ``study`` asked for the held points ``keys`` (a point written for it
        becomes its member as its row is written, :meth:`add_many`)."""
        self.db.executemany("INSERT OR IGNORE INTO members VALUES (?, ?)",
                            ((study, key) for key in keys))
        self.db.commit()

    def add(self, key: str, study: str, inputs: dict[str, Any], figures: dict[str, Any] | None,
            error: str | None, version: str, seconds: float) -> bool:
        """Insert one point's row and commit it; False when the key was already there at this
        version (a row of another version is replaced). Figures must be finite: NaN and
        infinity have no JSON spelling and are refused (ValueError)."""
        return self.add_many(study, [(key, inputs, figures, error, seconds)], version) == 1

    def add_many(self, study: str, rows: Iterable[tuple], version: str) -> int:
        """Insert points ``(key, inputs, figures, error, seconds)`` in one transaction, committed
        once (a chunk of a sweep arrives whole; a commit per row cost 70-170 us of the parent's
        time at a millisecond a point), as two executemany calls; returns the rows added (inserted,
        or replacing a row of another version or of other contents of the files the point names,
        its inputs' ``files``). Inputs and figures are data, or the texts
        :func:`encoded` made of them (a sweep's workers encode their own rows). A refused row
        (non-finite figures: ValueError) writes none of them."""
        written = time.time()
        with self.db:
            encoded_rows = [(key, study, *encoded(inputs, figures), error, version, seconds,
                             written) for key, inputs, figures, error, seconds in rows]
            cursor = self.db.executemany(
                "INSERT INTO points VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (key) DO "
                "UPDATE SET study = excluded.study, inputs = excluded.inputs, "
                "figures = excluded.figures, error = excluded.error, "
                "version = excluded.version, seconds = excluded.seconds, "
                "written = excluded.written WHERE points.version != excluded.version OR "
                "json_extract(points.inputs, '$.files') IS NOT "
                "json_extract(excluded.inputs, '$.files')",
                encoded_rows)
            added = cursor.rowcount
            self.db.executemany("INSERT OR IGNORE INTO members VALUES (?, ?)",
                                [(study, row[0]) for row in encoded_rows])
        return added

    def rows(self, study: str | None = None) -> list[dict[str, Any]]:
        """Every row (of one study: every point it asked for, whichever study computed it
        first), inputs and figures decoded, in key order."""
        query = "SELECT key, study, inputs, figures, error, version, seconds FROM points"
        args: tuple = ()
        if study is not None:
            query += " WHERE study = ? OR key IN (SELECT key FROM members WHERE study = ?)"
            args = (study, study)
        out = []
        for key, name, inputs, figures, error, version, seconds in self.db.execute(
                query + " ORDER BY key", args):
            out.append({"key": key, "study": study or name, "inputs": json.loads(inputs),
                        "figures": None if figures is None else json.loads(figures),
                        "error": error, "version": version, "seconds": seconds})
        return out

    def flat_rows(self, study: str | None = None) -> list[dict[str, Any]]:
        """One flat dict per row: inputs and figures as dotted columns."""
        return [_flatten({"key": r["key"], "study": r["study"], "error": r["error"],
                          "version": r["version"], "seconds": r["seconds"],
                          "inputs": r["inputs"], "figures": r["figures"] or {}})
                for r in self.rows(study)]

    def to_csv(self, study: str | None = None) -> str:
        """The flat rows as CSV text (columns: the union over rows, sorted)."""
        rows = self.flat_rows(study)
        columns = sorted({c for row in rows for c in row})
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return out.getvalue()

    def to_json(self, study: str | None = None) -> str:
        """The rows as JSON text."""
        return json.dumps(self.rows(study), indent=1, sort_keys=True)

    def to_dataframe(self, study: str | None = None) -> Any:
        """The flat rows as a pandas DataFrame (``pip install memsim[dataframe]``)."""
        try:
            import pandas
        except ImportError:
            raise ConfigError("exporting to a DataFrame needs pandas: pip install "
                              "'memsim[dataframe]'", field="export") from None
        rows = self.flat_rows(study)
        columns = list(dict.fromkeys(c for row in rows for c in row))
        return pandas.DataFrame({c: _column([row.get(c) for row in rows], pandas)
                                 for c in columns})

    def to_parquet(self, path: str | Path, study: str | None = None) -> None:
        """Write the flat rows to a Parquet file (``pip install memsim[dataframe]``)."""
        self.to_dataframe(study).to_parquet(path)


def _column(values: list[Any], pandas: Any) -> Any:
    """A column of counts stays exact: integers with a missing value (an error row) are
    pandas' nullable Int64 (or Python integers past int64), not floats that round above 2^53."""
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        if all(-2**63 <= v < 2**63 for v in present):
            return pandas.array(values, dtype="Int64")
        return pandas.array(values, dtype=object)
    return values


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, f"{name}."))
        elif isinstance(value, (list, tuple)):
            out[name] = json.dumps(value)
        else:
            out[name] = value
    return out


def encoded(inputs: dict[str, Any] | str,
            figures: dict[str, Any] | str | None) -> tuple[str, str | None]:
    """A row's inputs and figures as the JSON texts the store keeps (texts pass as they are);
    figures must be finite: NaN and infinity have no JSON spelling (ValueError)."""
    if not isinstance(inputs, str):
        inputs = json.dumps(inputs, sort_keys=True, default=str)
    if figures is not None and not isinstance(figures, str):
        figures = json.dumps(figures, sort_keys=True, allow_nan=False)
    return inputs, figures


def write_rows(store: Store, study: str, results: Iterable[tuple]) -> int:
    """Insert evaluated points ``(key, inputs, figures, error, seconds)``; returns rows added."""
    from memsim import __version__
    return store.add_many(study, results, __version__)


def _readable(db: sqlite3.Connection) -> Iterator[tuple | None]:
    """Each row of a possibly damaged ``points`` table (``None`` for one that cannot be read)."""
    try:
        last = db.execute("SELECT max(rowid) FROM points").fetchone()[0] or 0
    except sqlite3.DatabaseError:
        last = db.execute("PRAGMA page_count").fetchone()[0] * 64
    for rowid in range(1, last + 1):
        try:
            row = db.execute(f"SELECT {', '.join(COLUMNS)} FROM points WHERE rowid = ?",
                             (rowid,)).fetchone()
        except sqlite3.DatabaseError:
            yield None
            continue
        if row is not None:
            yield row


def salvage(damaged: str | Path, new: str | Path) -> tuple[int, int]:
    """Copy the readable rows of a damaged store into a new store: ``(kept, unreadable)``.

    Rows whose inputs or figures are not valid JSON are counted unreadable; a rerun of the
    study computes them again.
    """
    if Path(new).exists():
        raise ConfigError("the new store must not exist yet", file=str(new), field="--output")
    if not Path(damaged).exists():
        raise ConfigError("no such results store", file=str(damaged), field="store")
    db = sqlite3.connect(f"file:{Path(damaged).resolve()}?mode=ro", uri=True)
    kept = lost = 0
    try:
        with Store(new) as out:
            for row in _readable(db):
                try:
                    if row is None:
                        raise ValueError("unreadable")
                    json.loads(row[2])
                    if row[3] is not None:
                        json.loads(row[3])
                except (ValueError, TypeError):
                    lost += 1
                    continue
                out.db.execute("INSERT OR IGNORE INTO points VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                               row)
                kept += 1
            out.db.commit()
    except sqlite3.DatabaseError as exc:
        raise ConfigError(f"cannot read the damaged store: {exc}", file=str(damaged),
                          field="store") from None
    finally:
        db.close()
    return kept, lost
