"""A runtime file derived from another: ``base = "vllm"`` names a catalog runtime whose data the
file's own keys replace, table by table and key by key, ``[sources]`` included.

A stack's older release differs from today's in a few figures (vLLM 0.6 on ROCm ran without its
custom all-reduce); a derived file states only those, each with its own source, and inherits the
rest with the base's citations. ``drop`` removes inherited figures the version does not have.
The merged data is then validated exactly as a whole file (:func:`memsim.runtime.parse_runtime`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memsim.datafile import catalog_names, read_catalog_entry, require_str, require_table
from memsim.errors import ConfigError

__all__ = ["Derived", "resolve_base", "figure_paths", "holds_figures", "HEADER_KEYS"]

#: Top-level keys that name a file rather than give a figure.
HEADER_KEYS = ("schema_version", "name", "description", "sources", "base", "drop")
_OWN_HEADER = ("schema_version", "name", "description")
_CATALOG = "memsim.runtimes"


@dataclass(frozen=True)
class Derived:
    """A runtime file's data with its base merged in.

    ``base`` is the catalog runtime it derives from (None for a whole file); ``dropped`` the
    dotted paths of the inherited figures removed on the way (each cited in ``sources``).
    """

    data: dict[str, Any]
    base: str | None
    dropped: tuple[str, ...]


def holds_figures(path: str) -> bool:
    """True when the table at dotted ``path`` holds figures (or tables of them) one by one.

    A custom all-reduce's ``one_shot_max_bytes`` and a format's GEMV table (``gemv.q4_0``) are
    each one figure with one source, replaced whole.
    """
    return path != "collective.one_shot_max_bytes" and not path.startswith("gemv.")


def figure_paths(data: Mapping[str, Any], prefix: str = "", *,
                 skip: tuple[str, ...] = HEADER_KEYS) -> list[str]:
    """Dotted paths of a runtime file's figures, in file order: every value outside its
    top-level ``skip`` keys (the header and ``[sources]``), one per figure as ``[sources]``
    cites them."""
    paths = []
    for key, value in data.items():
        path = prefix + key
        if not prefix and key in skip:
            continue
        if isinstance(value, Mapping) and holds_figures(path):
            paths += figure_paths(value, path + ".")
        else:
            paths.append(path)
    return paths


def resolve_base(data: Mapping[str, Any], *, file: str) -> Derived:
    """The file's data with its ``base`` (and the base's own base) merged in.

    A file without ``base`` comes back as it is. Every mistake (an unknown base, a file path as
    base, a cycle, a replaced or dropped figure without its own source, a source for no figure)
    is one ConfigError naming the file and field.
    """
    return _resolve(data, file=file, chain=(file,))


def _resolve(data: Mapping[str, Any], *, file: str, chain: tuple[str, ...]) -> Derived:
    data = require_table(data, file=file, field="(top level)")
    if "base" not in data:
        if "drop" in data:
            raise ConfigError("drop removes figures inherited from a base; this file has no "
                              "base", file=file, field="drop")
        return Derived(data=dict(data), base=None, dropped=())
    name = _base_name(data["base"], file=file)
    base_file = f"runtimes/{name}.toml"
    if base_file in chain:
        raise ConfigError(f"base cycle: {' -> '.join(chain + (base_file,))}", file=file,
                          field="base")
    raw, _ = read_catalog_entry(_CATALOG, name, kind="runtime", folder="runtimes")
    inherited = _resolve(raw, file=base_file, chain=chain + (base_file,))
    for key in _OWN_HEADER:
        if key not in data:
            raise ConfigError("a derived file states its own schema_version, name and "
                              "description", file=file, field=key)
    sources = require_table(data.get("sources", {}), file=file, field="sources")
    own = {k: v for k, v in data.items() if k not in ("base", "drop")}
    replaced = figure_paths(own)
    for path in replaced:
        if path not in sources:
            raise ConfigError(f"{path} replaces the figure of {name}; cite its own source",
                              file=file, field=f"sources.{path}")
    drop = _drop_paths(data, inherited.data, replaced, sources, file=file)
    base_data = copy.deepcopy(inherited.data)
    for path in drop:
        _delete(base_data, path)
    merged = _merged(base_data, own)
    dropped = tuple(p for p in inherited.dropped if p not in replaced) + drop
    known = set(figure_paths(merged)) | set(dropped)
    for key in sources:
        if key not in known:
            raise ConfigError("a source for no figure of the merged runtime", file=file,
                              field=f"sources.{key}")
    return Derived(data=merged, base=name, dropped=dropped)


def _base_name(value: Any, *, file: str) -> str:
    """The base must be a catalog runtime's name, not a path to a file."""
    name = require_str(value, file=file, field="base")
    names = catalog_names(_CATALOG)
    if "/" in name or "\\" in name or name.endswith(".toml"):
        raise ConfigError(f"base names a catalog runtime ({', '.join(names)}), not a file",
                          file=file, field="base")
    if name not in names:
        raise ConfigError(f"unknown base runtime {name!r}; catalog runtimes are "
                          f"{', '.join(names)}", file=file, field="base")
    return name


def _drop_paths(data: Mapping[str, Any], base_data: Mapping[str, Any], replaced: list[str],
                sources: Mapping[str, Any], *, file: str) -> tuple[str, ...]:
    """``drop``: inherited figures this version has not, each a figure of the base, not also
    replaced, and cited."""
    drop = data.get("drop", [])
    if not isinstance(drop, list):
        raise ConfigError("expected a list of dotted figure paths", file=file, field="drop")
    inherited = set(figure_paths(base_data))
    for path in drop:
        require_str(path, file=file, field="drop")
        if path not in inherited:
            raise ConfigError(f"{path!r} is no figure of the base", file=file, field="drop")
        if path in replaced:
            raise ConfigError(f"{path!r} is both dropped and replaced", file=file, field="drop")
        if path not in sources:
            raise ConfigError(f"dropping {path} needs a source saying why", file=file,
                              field=f"sources.{path}")
    return tuple(drop)


def _delete(data: dict, path: str) -> None:
    """Remove the figure at dotted ``path`` (it exists: :func:`_drop_paths` checked)."""
    *tables, last = path.split(".")
    node = data
    for part in tables:
        node = node[part]
    del node[last]


def _merged(base: Mapping[str, Any], own: Mapping[str, Any], prefix: str = "") -> dict:
    """``base`` with ``own``'s keys replacing its own, table by table (``[sources]`` too)."""
    out = copy.deepcopy(dict(base))
    for key, value in own.items():
        path = prefix + key
        if (isinstance(value, Mapping) and isinstance(out.get(key), Mapping)
                and holds_figures(path)):
            out[key] = _merged(out[key], value, path + ".")
        else:
            out[key] = copy.deepcopy(value)
    return out
