"""User input → validated values: the one way a what-if is built.

Flags of every CLI verb, rows of a study and Python calls go through here, so that a what-if
means the same thing wherever it is asked: a :class:`DeviceRequest` (a device name or file,
``--set`` overrides, added tier templates, a memory policy, a price) becomes a :class:`Device`,
a model name or file a :class:`Model`, and workload fields a :class:`Decode`.

Rules, the same from every entry point:

- ``--set PATH=VALUE`` values are parsed by the field's type: integer fields (``cores``,
  ``link.max_chips``, ``tile.k``, ``matrix_unit.m``) take ``64`` or ``"64"``, a price takes a
  number, a list or table is written as TOML (``[4, 8]``, ``{"2" = "1 kB"}``), everything else
  (quantities with units, names) is passed on as text for the device parser to check.
- A policy other than ``auto`` and the device's own is a what-if on the device: ``--policy
  hybrid`` means ``--set layout.policy=hybrid``, and the device parser accepts or refuses it
  the same way for both.
- A price (``usd_per_chip_hour``) is the what-if ``cost.usd_per_chip_hour``.

Example::

    >>> dev = device_from(DeviceRequest("h100-sxm", sets=(("cores", "66"),)))
    >>> dev.cores
    66
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from memsim.device import (TOP_LEVEL_KEYS, Device, Link, device as catalog_device, freeze,
                           thaw)
from memsim.datafile import file_stamp, tomllib
from memsim.errors import ConfigError
from memsim.model import (Model, check_model, is_model_path, model as catalog_model,
                          model_source)
from memsim.workload import Decode

DECODE_FIELDS = tuple(f.name for f in dataclasses.fields(Decode))
PRICE_PATH = "cost.usd_per_chip_hour"
POLICY_PATH = "layout.policy"


def _device_path(name: str) -> str:
    """Where a device file writes the integer Device field ``name``: a top-level key as itself,
    any other in ``[tile]``, the one table whose integer keys Device holds as its own fields
    (``tile_k`` → ``tile.k``, ``activation_width`` → ``tile.activation_width``)."""
    return name if name in TOP_LEVEL_KEYS else "tile." + name.removeprefix("tile_")


def _int_fields(cls: type, path: Callable[[str], str]) -> set[str]:
    """Dotted paths of the integer fields of a device dataclass, ``path`` giving a field's from
    its name; an integer triple (``matrix_unit``) gives one path per axis (``matrix_unit.m``)."""
    hints = typing.get_type_hints(cls)
    found = set()
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if hint is int:
            found.add(path(f.name))
        elif typing.get_origin(hint) is tuple and set(typing.get_args(hint)) == {int}:
            found.update(f"{path(f.name)}.{axis}" for axis in "mnk")
    return found


# Integer fields of a device file, found from the Device and Link dataclasses (a device file's
# ``tile.k`` is ``Device.tile_k``, its ``tile.activation_width`` ``Device.activation_width``;
# ``matrix_unit.m`` an element of ``Device.matrix_unit``).
INT_PATHS = frozenset(_int_fields(Device, _device_path)
                      | _int_fields(Link, lambda name: f"link.{name}")
                      | _int_fields(Link, lambda name: f"host_link.{name}")
                      | _int_fields(Link, lambda name: f"scale_out.{name}"))
FLOAT_PATHS = frozenset({PRICE_PATH})


def parse_pairs(pairs: Sequence[str] | Mapping[str, Any], *, field: str,
                example: str) -> tuple[tuple[str, Any], ...]:
    """``KEY=VALUE`` texts (or a mapping) as ordered ``(key, value)`` pairs; a later key wins."""
    if isinstance(pairs, Mapping):
        return tuple((str(k), v) for k, v in pairs.items())
    out: dict[str, Any] = {}
    for pair in pairs:
        if isinstance(pair, (tuple, list)) and len(pair) == 2:
            key, value = pair
        else:
            key, sep, value = str(pair).partition("=")
            if not sep:
                key = ""
        if not str(key).strip() or (isinstance(value, str) and not value.strip()):
            raise ConfigError(f"expected {example}, got {pair!r}", field=field)
        out.pop(str(key).strip(), None)
        out[str(key).strip()] = value.strip() if isinstance(value, str) else value
    return tuple(out.items())


def _raw(data: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path of a device file's data (``tiers.NAME.FIELD`` by name)."""
    parts = path.split(".")
    node: Any = data
    if parts[0] == "tiers" and len(parts) == 3:
        tables = [t for t in data.get("tiers", []) if isinstance(t, Mapping)]
        node = next((t for t in tables if t.get("name") == parts[1]), {})
        parts = parts[2:]
    for part in parts:
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def typed_value(path: str, value: Any, current: Any = None, *, file: str | None = None) -> Any:
    """A ``--set`` value parsed by its field's type; ``current`` is the value in the device
    ``file``, which an error names.

    An integer field (the file holds a plain integer, or the Device dataclass declares one)
    takes ``64`` or ``"64"``; the price takes a number or its text; anything else is passed on
    as given, for the device parser to check.
    """
    integer = (isinstance(current, int) and not isinstance(current, bool)) or (
        current is None and path in INT_PATHS)
    if integer:
        if isinstance(value, bool):
            raise ConfigError(f"expected an integer, got {value!r}", file=file, field=path)
        if isinstance(value, int):
            return value
        try:
            return int(str(value).strip().replace(",", ""))
        except ValueError:
            raise ConfigError(f"expected an integer, got {value!r}", file=file,
                              field=path) from None
    if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
        return _inline_value(value, path, file)
    if path in FLOAT_PATHS and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            raise ConfigError(f"expected a price in USD such as 2.99, got {value!r}",
                              file=file, field=path) from None
    return value


def _inline_value(text: str, path: str, file: str | None) -> Any:
    """A list or table written as TOML on the command line (``--set
    runtime.collective.custom_allreduce_chips=[4,8]``), as a study file would give it."""
    try:
        return tomllib.loads(f"value = {text.strip()}")["value"]
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"expected a TOML list or table such as [4, 8] or {{\"2\" = \"1 kB\"}}, "
                          f"got {text!r} ({exc})", file=file, field=path) from None


@dataclass(frozen=True)
class DeviceRequest:
    """A device as a user asks for it: plain, hashable data that a study row can store.

    Attributes
    ----------
    device : catalog name (``h100-sxm``) or a device ``.toml`` file.
    sets : ``(path, value)`` what-ifs in order, e.g. ``(("tiers.hbm.bandwidth", "5 TB/s"),)``;
        a mapping or ``"PATH=VALUE"`` texts are accepted and normalized.
    add_tiers : tier templates added outermost, in order (``cxl-gen5-x16``).
    policy : a memory policy; ``auto`` keeps the device's own, anything else sets
        ``layout.policy``.
    usd_per_chip_hour : a price per chip-hour (``None``: the device file's).
    runtime : the runtime the workload runs under (a name; ``auto``: the device's own), against
        which ``runtime.*`` what-ifs are checked.
    """

    device: str
    sets: tuple[tuple[str, Any], ...] = ()
    add_tiers: tuple[str, ...] = ()
    policy: str = "auto"
    usd_per_chip_hour: float | None = None
    runtime: str = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.device, str) or not self.device.strip():
            raise ConfigError(f"expected a device name or file, got {self.device!r}",
                              field="device")
        sets = parse_pairs(self.sets, field="--set",
                           example="KEY=VALUE such as tiers.hbm.bandwidth=5TB/s")
        object.__setattr__(self, "sets", tuple((k, freeze(v)) for k, v in sets))
        tiers = (self.add_tiers,) if isinstance(self.add_tiers, str) else self.add_tiers
        object.__setattr__(self, "add_tiers", tuple(str(t) for t in tiers))
        if self.usd_per_chip_hour is not None:
            price = typed_value(PRICE_PATH, self.usd_per_chip_hour)
            if isinstance(price, bool) or not isinstance(price, (int, float)) or not price > 0:
                raise ConfigError(f"expected a positive price, got {self.usd_per_chip_hour!r}",
                                  field="usd_per_chip_hour")
            object.__setattr__(self, "usd_per_chip_hour", float(price))

    def overrides(self, dev: Device) -> dict[str, Any]:
        """Every what-if this request makes of ``dev``, typed, as ``Device.with_overrides``
        takes them."""
        out = {path: typed_value(path, thaw(value), _raw(dev.data, path), file=dev.file)
               for path, value in self.sets}
        if self.policy not in ("auto", dev.layout.policy):
            asked = out.get(POLICY_PATH, self.policy)
            if asked != self.policy:
                raise ConfigError(f"--policy {self.policy} and --set layout.policy={asked} "
                                  "disagree; give one", field="policy")
            out[POLICY_PATH] = self.policy
        if self.usd_per_chip_hour is not None:
            out[PRICE_PATH] = self.usd_per_chip_hour
        return out



def device_from(request: DeviceRequest | Device | str, **what_ifs: Any) -> Device:
    """The validated device a request describes (tiers added, then fields set).

    ``request`` may be a name, or an existing Device (returned as is when no what-if is given);
    ``what_ifs`` are the :class:`DeviceRequest` fields (``sets``, ``add_tiers``, ``policy``,
    ``usd_per_chip_hour``).
    """
    if isinstance(request, Device):
        if not what_ifs:
            return request
        return _apply(request, DeviceRequest(request.name, **what_ifs))
    if isinstance(request, str):
        policy = what_ifs.get("policy", "auto")
        request = (_named_request(request, policy)
                   if what_ifs.keys() <= {"policy"} and isinstance(policy, str)
                   else DeviceRequest(request, **what_ifs))
    elif what_ifs:
        request = dataclasses.replace(request, **what_ifs)
    return _device_cached(request, device_stamp(request.device))


@lru_cache(maxsize=256)
def _named_request(name: str, policy: str) -> DeviceRequest:
    """``DeviceRequest(name, policy=policy)``, built once per name and policy (a study asks for
    the same few devices at every point)."""
    return DeviceRequest(name, policy=policy)


@lru_cache(maxsize=64)
def _device_cached(request: DeviceRequest, stamp: tuple[int, int, int] | None) -> Device:
    """The request's device; ``stamp`` (:func:`device_stamp`) keys the cache only."""
    return _apply(catalog_device(request.device), request)


def device_stamp(name: str) -> tuple[int, int, int] | None:
    """:func:`file_stamp` of a device named by path (a ``.toml``); None for a catalog name."""
    return file_stamp(name) if name.endswith(".toml") else None


def model_stamp(name: str) -> tuple[int, int, int] | None:
    """:func:`file_stamp` of a model named by path (a file or a HuggingFace folder's
    config.json); None for a catalog name."""
    return file_stamp(model_source(name)) if is_model_path(name) else None


def _apply(dev: Device, request: DeviceRequest) -> Device:
    for template in request.add_tiers:
        dev = dev.with_tier(template)
    overrides = request.overrides(dev)
    return (dev.with_overrides(overrides, runtime_name=request.runtime) if overrides else dev)


def model_from(name: Model | str) -> Model:
    """A catalog model by name, or a model file by path (cached until the file changes); a Model
    built in Python is held to a model file's limits (:func:`memsim.model.check_model`)."""
    if isinstance(name, Model):
        return check_model(name)
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"expected a model name or file, got {name!r}", field="model")
    return _model_cached(name, model_stamp(name))


@lru_cache(maxsize=32)
def _model_cached(name: str, stamp: tuple[int, int, int] | None) -> Model:
    """The model ``name``; ``stamp`` (:func:`model_stamp`) keys the cache only."""
    return catalog_model(name)


def decode_from(fields: Mapping[str, Any] | Decode | None = None, **more: Any) -> Decode:
    """A Decode from workload fields (a study row, parsed flags, keywords).

    Unknown fields are refused by name; a placement may be a mapping, ``(selector, tier)``
    pairs, ``"SELECTOR=TIER"`` texts or one such text; lists become tuples.
    """
    if isinstance(fields, Decode):
        return dataclasses.replace(fields, **more) if more else fields
    values = {**dict(fields or {}), **more}
    for name in values:
        if name not in DECODE_FIELDS:
            raise ConfigError(f"unknown workload field {name!r}; expected one of "
                              f"{', '.join(DECODE_FIELDS)}", field=name)
    if "placement" in values and not isinstance(values["placement"], Mapping):
        texts = values["placement"]
        values["placement"] = parse_pairs(
            [texts] if isinstance(texts, str) else texts, field="placement",
            example="SELECTOR=TIER[:FRACTION] such as kv=cxl or weights[40:80]=cxl")
    return Decode(**values)


def request_of(device: str, *, sets: Any = (), add_tiers: Any = (),
               workload: Mapping[str, Any] | None = None,
               usd_per_chip_hour: float | None = None) -> DeviceRequest:
    """The device request of a run whose workload names a policy (the one policy rule) and a
    runtime (its ``runtime.*`` what-ifs are checked against it)."""
    policy = (workload or {}).get("policy", "auto")
    stack = (workload or {}).get("runtime", "auto")
    return DeviceRequest(device, sets=sets, add_tiers=add_tiers,
                         policy=policy if isinstance(policy, str) else "auto",
                         usd_per_chip_hour=usd_per_chip_hour,
                         runtime=stack if isinstance(stack, str) else "auto")
