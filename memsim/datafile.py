"""Reading memsim's TOML data files and checking their keys, with errors that name file and field."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from memsim.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib


def read_toml_text(text: str, *, file: str) -> dict[str, Any]:
    """Parse TOML text, turning a syntax error into a ConfigError naming the file."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"malformed TOML: {exc}", file=file) from None


def read_toml_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML file from disk; a missing or unreadable file is a ConfigError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read file: {exc.strerror}", file=str(path)) from None
    return read_toml_text(text, file=str(path))


def catalog_names(package: str) -> list[str]:
    """Stems of the TOML files shipped in a catalog package (``memsim.devices``)."""
    folder = resources.files(package)
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def read_catalog_entry(package: str, name: str, *, kind: str, folder: str) -> tuple[dict, str]:
    """The parsed data of catalog entry ``name`` and the file name errors should show."""
    resource = resources.files(package) / f"{name}.toml"
    if not resource.is_file():
        raise ConfigError(f"unknown {kind} {name!r}; catalog {kind}s are "
                          f"{', '.join(catalog_names(package))}", field=kind)
    file = f"{folder}/{name}.toml"
    return read_toml_text(resource.read_text(encoding="utf-8"), file=file), file


def check_keys(table: Mapping[str, Any], *, required: Iterable[str], optional: Iterable[str] = (),
               file: str, prefix: str = "") -> None:
    """Reject unknown keys (listing the valid ones) and report the first missing required key."""
    required = tuple(required)
    allowed = set(required) | set(optional)
    for key in table:
        if key not in allowed:
            raise ConfigError(f"unknown key; valid keys are {', '.join(sorted(allowed))}",
                              file=file, field=prefix + key)
    for key in required:
        if key not in table:
            raise ConfigError("missing required key", file=file, field=prefix + key)


def require_table(value: Any, *, file: str, field: str) -> Mapping[str, Any]:
    """The value must be a TOML table."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"expected a table, got {type(value).__name__}", file=file, field=field)
    return value


def require_str(value: Any, *, file: str, field: str, choices: Iterable[str] | None = None) -> str:
    """The value must be a non-empty string, from ``choices`` when given."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"expected a non-empty string, got {value!r}", file=file, field=field)
    if choices is not None:
        choices = tuple(choices)
        if value not in choices:
            raise ConfigError(f"expected one of {', '.join(choices)}, got {value!r}",
                              file=file, field=field)
    return value


def require_int(value: Any, *, file: str, field: str, minimum: int = 1) -> int:
    """The value must be an integer (not a bool) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"expected an integer, got {value!r}", file=file, field=field)
    if value < minimum:
        raise ConfigError(f"expected an integer >= {minimum}, got {value}", file=file, field=field)
    return value


def require_bool(value: Any, *, file: str, field: str) -> bool:
    """The value must be true or false."""
    if not isinstance(value, bool):
        raise ConfigError(f"expected true or false, got {value!r}", file=file, field=field)
    return value
