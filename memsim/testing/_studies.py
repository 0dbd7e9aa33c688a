"""One mistake in an otherwise valid study file, and the field the loader must name for it.

A valid study (a ``[grid]`` of catalog names and small workloads, sometimes ``[[point]]``
tables) is drawn as data, one mutation changes one thing in it, and the result is written as
TOML text: :func:`memsim.study.load_study` must refuse it with a ConfigError naming ``field``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, NamedTuple

from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from memsim.study import DECODE_FIELDS, SPEC_FIELDS


class InvalidStudy(NamedTuple):
    """A study file's text with one mistake: loading it must raise a ConfigError naming
    ``field``."""

    text: str
    field: str
    mistake: str


def _toml_string(text: str) -> str:
    """A TOML basic string: JSON's escapes, and DEL escaped too (TOML forbids it raw)."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_string(k)} = {_toml_value(v)}"
                               for k, v in value.items()) + "}"
    raise TypeError(value)


def study_text(data: dict[str, Any]) -> str:
    """A study's data as TOML text (every table inline, so any value may stand anywhere)."""
    return "".join(f"{_toml_string(key)} = {_toml_value(value)}\n" for key, value in data.items())


_JUNK = st.one_of(st.integers(-3, 10 ** 6), st.booleans(), st.floats(allow_nan=False,
                  allow_infinity=False), st.text(max_size=5), st.lists(st.integers(), max_size=2))


@st.composite
def _valid(draw: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"name": draw(st.sampled_from(["demo", "latency", "s 1"])),
                            "grid": {"device": draw(st.sampled_from(["h100-sxm",
                                                                     ["h100-sxm", "mi300x"]])),
                                     "model": "llama-3.2-1b",
                                     "batch": draw(st.sampled_from([1, [1, 4]]))}}
    if draw(st.booleans()):
        data["grid"]["set"] = {"tiers.hbm.bandwidth": ["2 TB/s", "4 TB/s"]}
    if draw(st.booleans()):
        data["point"] = [{"device": "mi300x", "model": "llama-3.2-1b"}]
    return data


def _name(draw: Any, data: dict[str, Any]) -> str:
    data["name"] = draw(st.sampled_from(["", "   ", 5, True, [], {}]))
    return "name"


def _grid_shape(draw: Any, data: dict[str, Any]) -> str:
    data["grid"] = draw(_JUNK)
    return "grid"


def _point_shape(draw: Any, data: dict[str, Any]) -> str:
    data["point"] = draw(st.sampled_from(["abc", 5, {"device": "h100-sxm"}]))
    return "point"


def _point_entry(draw: Any, data: dict[str, Any]) -> str:
    data["point"] = [draw(_JUNK.filter(lambda v: not isinstance(v, dict)))]
    return "point[0]"


def _table_shape(draw: Any, data: dict[str, Any]) -> str:
    table = draw(st.sampled_from(["set", "speculative"]))
    data["grid"][table] = draw(_JUNK)
    return f"grid.{table}"


def _unknown_field(draw: Any, data: dict[str, Any]) -> str:
    name = draw(st.sampled_from(["bacth", "contexts", "tiles", "Batch"]))
    assert name not in DECODE_FIELDS
    data["grid"][name] = 1
    return f"grid.{name}"


def _unknown_speculative(draw: Any, data: dict[str, Any]) -> str:
    name = draw(st.sampled_from(["gama", "drafts", "accept"]))
    assert name not in SPEC_FIELDS
    data["grid"]["speculative"] = {name: 1}
    return f"grid.speculative.{name}"


def _missing(draw: Any, data: dict[str, Any]) -> str:
    key = draw(st.sampled_from(["device", "model"]))
    del data["grid"][key]
    return f"grid.{key}"


def _bad_name(draw: Any, data: dict[str, Any]) -> str:
    key = draw(st.sampled_from(["device", "model"]))
    data["grid"][key] = draw(st.sampled_from(["", 7, True, ["h100-sxm", 3], [{}]]))
    return f"grid.{key}"


def _unknown_top(draw: Any, data: dict[str, Any]) -> str:
    key = draw(st.sampled_from(["grids", "points", "study", "Name"]))
    data[key] = draw(_JUNK)
    return key


MUTATIONS: dict[str, Callable[[Any, dict[str, Any]], str]] = {
    "empty or non-text name": _name, "grid not a table": _grid_shape,
    "point not an array of tables": _point_shape, "point entry not a table": _point_entry,
    "grid.set or grid.speculative not a table": _table_shape,
    "unknown workload field": _unknown_field, "unknown speculative field": _unknown_speculative,
    "grid without device or model": _missing, "device or model not a name": _bad_name,
    "unknown top-level key": _unknown_top,
}


@st.composite
def _invalid(draw: Any) -> InvalidStudy:
    data = draw(_valid())
    mistake = draw(st.sampled_from(sorted(MUTATIONS)))
    field = MUTATIONS[mistake](draw, data)
    return InvalidStudy(study_text(data), field, mistake)


def invalid_studies() -> SearchStrategy[InvalidStudy]:
    """Study files with one mistake, and the field the loader must name for it.

    Each example is an :class:`InvalidStudy` ``(text, field, mistake)``: written to a file,
    ``load_study`` of it must raise a :class:`memsim.ConfigError` whose ``field`` is
    ``example.field``, and ``memsim sweep`` of it must exit 2 with one line.
    """
    return _invalid()
