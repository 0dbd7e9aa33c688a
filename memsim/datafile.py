"""Reading memsim's TOML data files and checking their keys, with errors that name file and field."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterable, Mapping
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from memsim.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib


#: Deepest nesting of tables and arrays a data file may have; memsim's own files use 3.
MAX_NESTING = 32


def read_toml_text(text: str, *, file: str) -> dict[str, Any]:
    """Parse TOML text, turning a syntax error or absurd nesting into a ConfigError naming the
    file."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"malformed TOML: {exc}", file=file) from None
    except RecursionError:
        raise ConfigError(f"malformed TOML: nested deeper than memsim reads (at most "
                          f"{MAX_NESTING} levels)", file=file) from None
    if _depth(data) > MAX_NESTING:
        raise ConfigError(f"tables and arrays nested deeper than {MAX_NESTING} levels",
                          file=file)
    return data


def _depth(value: Any) -> int:
    """Nesting depth of tables and arrays, counted without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, level + 1)
            if deepest > MAX_NESTING:
                return deepest
            stack.extend((child, level + 1)
                         for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def decode_text(raw: bytes, *, file: str) -> str:
    """The UTF-8 text of a data file; a byte-order mark, UTF-16, binary or other encodings are
    one ConfigError saying which."""
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise ConfigError("the file is UTF-16 text; save it as UTF-8 (TOML files are UTF-8)",
                          file=file)
    if raw.startswith(b"\xef\xbb\xbf"):
        raise ConfigError("the file starts with a UTF-8 byte-order mark; save it as UTF-8 "
                          "without BOM", file=file)
    if b"\x00" in raw:
        raise ConfigError("a binary file, not TOML text (it contains NUL bytes)", file=file)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset {exc.start}; "
                          f"save the file as UTF-8", file=file) from None


def read_toml_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML file from disk; a missing, unreadable or non-UTF-8 file is a ConfigError."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read file: {exc.strerror}", file=str(path)) from None
    return read_toml_text(decode_text(raw, file=str(path)), file=str(path))


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


def check_what_if_path(path: str, *, file: str) -> None:
    """A what-if may label one figure's citation (``sources.FIELD``), not replace the table of
    them: ``sources`` itself is no figure."""
    if path == "sources":
        raise ConfigError("sources is the table of the figures' citations, not a figure: set one "
                          "citation as sources.FIELD", file=file, field=path)


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


def require_schema_version(value: Any, *, file: str, supported: int = 1) -> int:
    """``schema_version`` must be the integer ``supported`` (not ``true``, ``1.0`` or ``"1"``)."""
    if isinstance(value, bool) or not isinstance(value, int) or value != supported:
        raise ConfigError(f"unsupported schema_version {value!r}; expected the integer "
                          f"{supported}", file=file, field="schema_version")
    return value


def require_bool(value: Any, *, file: str, field: str) -> bool:
    """The value must be true or false."""
    if not isinstance(value, bool):
        raise ConfigError(f"expected true or false, got {value!r}", file=file, field=field)
    return value


def file_stamp(path: str | Path) -> tuple[int, int, int] | None:
    """What a file holds now, as the caches of files named by path key it: its inode, size and
    modification time, so that a device, model or runtime file edited in a running process is
    read again instead of answering with the figures it held before. None when it cannot be
    read (its loader then says why)."""
    try:
        stat = Path(path).stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


def file_digest(path: str | Path) -> str | None:
    """A digest of what a file holds now (the first 16 hex digits of its SHA-256), read again
    only when its :func:`file_stamp` changes; None when it cannot be read."""
    stamp = file_stamp(path)
    return None if stamp is None else _digest(str(path), stamp)


@lru_cache(maxsize=256)
def _digest(path: str, stamp: tuple[int, int, int]) -> str | None:
    """``stamp`` keys the cache only."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    except OSError:
        return None
