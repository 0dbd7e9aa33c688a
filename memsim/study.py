"""What-if studies: points over devices, device what-ifs, models and workloads.

A point is plain data (a device name or file, what-ifs, a model, Decode fields, optionally the
fields of a speculative-decoding run) with a stable key, so that a results store can tell which
points it already holds. A study is a name and its points, built in Python with :func:`grid` or
read from a TOML study file with :func:`load_study`:

    name = "latency"
    [grid]
    device = ["h100-sxm", "mi300x"]
    model = ["llama-3-70b"]
    batch = [1, 8, 64]
    context = [1024, 8192]
    weights = "int8"
    [grid.set]                               # device what-ifs, each a list of values
    "tiers.sram.capacity" = ["32 MiB", "256 MiB"]
    "runtime.collective.custom_allreduce_chips" = [[2, 4], [8]]   # a list value is a list
    [grid.speculative]                       # optional: speculative decoding points
    draft = "llama-3.2-1b"
    gamma = [2, 4]
    acceptance = 0.8
    [[point]]                                # and more tables, each a grid of its own
                                             # (a list sweeps here as in [grid])
    device = "groq-lpu"
    model = "llama-3-8b"
    tp = 16
    pp = 6
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

from memsim.datafile import file_digest, read_toml_file
from memsim.errors import ConfigError
from memsim.inputs import freeze
from memsim.model import is_model_path, model_source
from memsim.units import NUMBER
from memsim.workload import Decode

DECODE_FIELDS = tuple(f.name for f in fields(Decode))
#: Decode's defaults, as a point stores them (a placement as its pairs).
DECODE_DEFAULTS = {f.name: f.default for f in fields(Decode) if f.default is not MISSING}
SPEC_FIELDS = ("draft", "gamma", "acceptance", "method", "tree", "draft_device",
               "draft_weights", "samples")
POINT_KEYS = ("device", "model", "set", "add_tier")


@dataclass(frozen=True)
class Point:
    """One emulation of a study: everything needed to run it again, and nothing else."""

    device: str
    model: str
    workload: tuple[tuple[str, Any], ...] = ()
    overrides: tuple[tuple[str, str], ...] = ()
    add_tiers: tuple[str, ...] = ()
    speculative: tuple[tuple[str, Any], ...] = ()

    def inputs(self) -> dict[str, Any]:
        """Plain data, the store's record of the point; with ``files`` (each file the point
        names by path and a digest of its bytes, :meth:`file_digests`) when it names any."""
        data = self._asked()
        files = self.file_digests()
        if files:
            data["files"] = files
        return data

    def _asked(self) -> dict[str, Any]:
        """The point as it was asked for: what its key hashes."""
        return {"device": self.device, "model": self.model, "workload": dict(self.workload),
                "set": dict(self.overrides), "add_tier": list(self.add_tiers),
                "speculative": dict(self.speculative)}

    def named_files(self) -> tuple[str, ...]:
        """The device, model, runtime, draft model and draft device the point names by path
        (not by catalog name), in that order."""
        workload, spec = dict(self.workload), dict(self.speculative)
        candidates = ((self.device, _device_path), (self.model, is_model_path),
                      (workload.get("runtime"), _device_path),
                      (spec.get("draft"), is_model_path),
                      (spec.get("draft_device"), _device_path))
        return tuple(dict.fromkeys(name for name, is_path in candidates
                                   if isinstance(name, str) and is_path(name)))

    def file_digests(self) -> dict[str, str | None]:
        """Each named file with a digest of what it holds now (a model folder's: its config.json;
        None: it cannot be read): the store keeps them with the row, and a rerun computes the
        point again when one changed (the key does not change: the point is the same what-if
        of new figures)."""
        return {name: file_digest(model_source(name)) for name in self.named_files()}

    @functools.cached_property
    def key(self) -> str:
        """A stable identity: the hash of the canonical JSON of the inputs, in which a workload
        field given at its Decode default is left out (``batch = 1`` and no ``batch`` are one
        point, and one row), and a quantity's text is keyed with one space between its number and
        unit (``"5TB/s"`` and ``"5 TB/s"`` are one point; ``"5000 GB/s"`` is another text).
        Computed once per point: a sweep asks for it several times a point."""
        inputs = self._asked()
        inputs["workload"] = {k: v for k, v in inputs["workload"].items()
                              if not _is_default(k, v)}
        inputs["set"] = {k: _spaced_quantity(v) for k, v in inputs["set"].items()}
        text = json.dumps(inputs, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def shape_key(self) -> tuple:
        """Points with the same model, device and workload shape run one after another on a
        worker, which keeps the device, model and kernels it loaded."""
        return (self.model, self.device, self.add_tiers, self.overrides)


@dataclass(frozen=True)
class Study:
    """A named list of points."""

    name: str
    points: tuple[Point, ...]


def _device_path(name: str) -> bool:
    """A device (or runtime) named by its file rather than by catalog name."""
    return name.endswith(".toml")


def _is_default(name: str, value: Any) -> bool:
    """True when a workload field is given at Decode's default (of the same type: ``tp = 1.0``
    is a mistake to report, not the default)."""
    default = DECODE_DEFAULTS.get(name, MISSING)
    return type(value) is type(default) and value == default


_QUANTITY_TEXT = re.compile(rf"\s*({NUMBER.pattern})\s*([A-Za-z%/]\S*(?:\s+\S+)*)\s*")


def _spaced_quantity(value: Any) -> Any:
    """A what-if's text as its key reads it: ``"<number> <unit>"`` with one space."""
    if not isinstance(value, str):
        return value
    match = _QUANTITY_TEXT.fullmatch(value)
    return f"{match[1]} {match[2]}" if match else value


def _values(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _freeze(value: Any) -> Any:
    """A value a point can hash: lists become tuples, tables ``(key, value)`` pairs in order
    (a placement's later rule wins, so its order is kept)."""
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, Mapping):
        return tuple((str(k), _freeze(v)) for k, v in value.items())
    return value


def _what_if_value(value: Any) -> Any:
    """A device what-if's value as a point keeps it: a scalar as its text (``64`` and ``"64"``
    are one point), a list or table frozen as itself (``[4, 8]``, not the text ``"[4, 8]"``)."""
    return freeze(value) if isinstance(value, (list, tuple, Mapping)) else str(value)


def _table(value: Any, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"expected a table, got {value!r}", field=field)
    return value


def grid(*, device: Any, model: Any, set: Mapping[str, Any] | None = None,  # noqa: A002
         add_tier: Any = ((),), speculative: Mapping[str, Any] | None = None,
         **workload: Any) -> list[Point]:
    """Every combination of the values given (a list is swept, anything else fixed).

    ``set`` maps device what-if paths to values; ``add_tier`` lists tier-template lists;
    ``speculative`` (``draft``, ``gamma``, ``acceptance``, ...) makes speculative points;
    the other keywords are Decode fields.
    """
    set = _table({} if set is None else set, "grid.set")  # noqa: A001
    speculative = _table({} if speculative is None else speculative, "grid.speculative")
    for name in workload:
        if name not in DECODE_FIELDS:
            raise ConfigError(f"unknown workload field {name!r}; expected one of "
                              f"{', '.join(DECODE_FIELDS)}", field=f"grid.{name}")
    for name in speculative or {}:
        if name not in SPEC_FIELDS:
            raise ConfigError(f"unknown speculative field {name!r}; expected one of "
                              f"{', '.join(SPEC_FIELDS)}", field=f"grid.speculative.{name}")
    axes: list[tuple[str, str, list[Any]]] = []
    for name, values in (("device", device), ("model", model)):
        for value in _values(values):
            if not isinstance(value, str) or not value.strip():
                raise ConfigError(f"expected a name or file, got {value!r}", field=f"grid.{name}")
    axes.append(("point", "device", _values(device)))
    axes.append(("point", "model", _values(model)))
    tiers = ([tuple(str(x) for x in _values(t)) for t in _values(add_tier)]
             if add_tier != ((),) else [()])
    axes.append(("point", "add_tier", tiers))
    for path, values in set.items():
        axes.append(("set", path, _values(values)))
    for name, values in workload.items():
        axes.append(("workload", name, _values(values)))
    for name, values in speculative.items():
        # a per-position acceptance list is one value, not an axis
        swept = (_values(values) if name != "acceptance" or not isinstance(values, list)
                 or all(isinstance(v, list) for v in values) else [values])
        axes.append(("speculative", name, swept))
    points = []
    for combo in itertools.product(*(values for _, _, values in axes)):
        parts: dict[str, dict[str, Any]] = {"point": {}, "set": {}, "workload": {},
                                            "speculative": {}}
        for (group, name, _), value in zip(axes, combo):
            parts[group][name] = value
        points.append(Point(
            device=str(parts["point"]["device"]), model=str(parts["point"]["model"]),
            workload=tuple(sorted((k, _freeze(v)) for k, v in parts["workload"].items())),
            overrides=tuple(sorted((k, _what_if_value(v)) for k, v in parts["set"].items())),
            add_tiers=tuple(parts["point"]["add_tier"]),
            speculative=tuple(sorted((k, _freeze(v)) for k, v in parts["speculative"].items())),
        ))
    return points


def load_study(path: str | Path) -> Study:
    """Read a TOML study file (format in this module's docstring)."""
    data = read_toml_file(path)
    file = str(path)
    unknown = sorted(set(data) - {"name", "grid", "point"})
    if unknown:
        raise ConfigError(f"unknown key(s) {', '.join(unknown)}; a study has name, [grid] and "
                          "[[point]]", file=file, field=unknown[0])
    points: list[Point] = []
    try:
        name = data.get("name", Path(path).stem)
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"expected a non-empty study name, got {name!r}", field="name")
        tables = []
        if "grid" in data:
            tables.append(("grid", _table(data["grid"], "grid")))
        entries = data.get("point", [])
        if not isinstance(entries, list):
            raise ConfigError(f"expected [[point]] tables, got {entries!r}", field="point")
        tables += [(f"point[{i}]", _table(e, f"point[{i}]")) for i, e in enumerate(entries)]
        for where, table in tables:
            points += _grid_of(where, table)
    except ConfigError as exc:
        raise ConfigError(exc.reason, file=file, field=exc.field) from None
    if not points:
        raise ConfigError("the study has no points: give a [grid] or [[point]] tables",
                          file=file, field="grid")
    return Study(name=name, points=tuple(unique_points(points)))


def _grid_of(where: str, table: Mapping[str, Any]) -> list[Point]:
    """The points of a study file's ``[grid]`` or one ``[[point]]``, errors named by field."""
    for required in ("device", "model"):
        if required not in table:
            raise ConfigError(f"a {where.split('[')[0]} needs device and model",
                              field=f"{where}.{required}")
    try:
        return grid(**dict(table))
    except ConfigError as exc:
        field = exc.field or ""
        raise ConfigError(exc.reason, field=where + field.removeprefix("grid")) from None


def unique_points(points: Iterable[Point]) -> list[Point]:
    """The points in order, each key once (a point listed twice is one row)."""
    seen: dict[str, Point] = {}
    for point in points:
        seen.setdefault(point.key, point)
    return list(seen.values())
