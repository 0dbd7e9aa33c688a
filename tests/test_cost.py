"""Tests of the optional [cost] table: a price per chip-hour in US dollars, how it loads, how a
what-if sets it, how a wrong one is refused, and that every catalog price cites a source.

Broken files are made from the text of a catalog file with a [cost] table put in front of its
[sources], so that the TOML parser sees exactly what a user would write.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from importlib import resources
from pathlib import Path

import pytest

import memsim
from memsim.device import parse_device
from memsim import ConfigError, load_device

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEVICES = memsim.device_names()

# a confidence tag, as in test_catalog.py: [V], [I], [D], [E], [?], or a combination such as [V/D]
TAG = re.compile(r"\[(?:V|I|D|E|\?)(?:/(?:V|I|D|E|\?))*\]")

# not rented per chip: these must carry a "cost" source entry that says why, and no price
NOT_RENTED = ("groq-lpu", "wse-3", "ipu-gc200", "mtia-v2", "maia-100")


def catalog_text(name: str) -> str:
    return (resources.files("memsim.devices") / f"{name}.toml").read_text(encoding="utf-8")


def raw_device(name: str) -> dict:
    return tomllib.loads(catalog_text(name))


def with_cost(cost_table: str, name: str = "mtia-v2") -> str:
    """The catalog file ``name`` (which has no [cost]) with ``cost_table`` put before [sources]."""
    text = catalog_text(name)
    assert "\n[cost]\n" not in text and "\n[sources]\n" in text
    return text.replace("\n[sources]\n", f"\n{cost_table}\n\n[sources]\n", 1)


def write(tmp_path: Path, text: str, stem: str = "priced") -> Path:
    path = tmp_path / f"{stem}.toml"
    path.write_text(text, encoding="utf-8")
    return path


def load_error(tmp_path: Path, cost_table: str) -> ConfigError:
    path = write(tmp_path, with_cost(cost_table))
    with pytest.raises(ConfigError) as info:
        load_device(path)
    assert info.value.file == str(path)
    assert str(path) in str(info.value)
    return info.value


# --- parsing ----------------------------------------------------------------------------------

def test_present_float(tmp_path):
    dev = load_device(write(tmp_path, with_cost("[cost]\nusd_per_chip_hour = 2.99")))
    assert dev.usd_per_chip_hour == 2.99


def test_present_integer_becomes_a_float(tmp_path):
    dev = load_device(write(tmp_path, with_cost("[cost]\nusd_per_chip_hour = 3")))
    assert dev.usd_per_chip_hour == 3.0
    assert isinstance(dev.usd_per_chip_hour, float)


def test_absent_is_none(tmp_path):
    assert "cost" not in raw_device("mtia-v2")
    assert memsim.device("mtia-v2").usd_per_chip_hour is None
    assert load_device(write(tmp_path, catalog_text("mtia-v2"))).usd_per_chip_hour is None


def test_catalog_h100_price():
    assert memsim.device("h100-sxm").usd_per_chip_hour == 12.29


def test_device_stays_frozen():
    dev = memsim.device("h100-sxm")
    with pytest.raises(dataclasses.FrozenInstanceError):
        dev.usd_per_chip_hour = 1.0  # type: ignore[misc]


# --- bad type, bad value, unknown key: a ConfigError naming the file and the field ------------

@pytest.mark.parametrize("value", ['"2.99"', '"2.99 USD"', "true", "[2.99]", "{ usd = 2.99 }"])
def test_bad_type(tmp_path, value):
    err = load_error(tmp_path, f"[cost]\nusd_per_chip_hour = {value}")
    assert err.field == "cost.usd_per_chip_hour"
    assert "cost.usd_per_chip_hour" in str(err)
    assert "US dollars per chip per hour" in err.reason


@pytest.mark.parametrize("value", ["0", "0.0", "-1.5", "-3", "nan", "inf", "-inf"])
def test_bad_value(tmp_path, value):
    err = load_error(tmp_path, f"[cost]\nusd_per_chip_hour = {value}")
    assert err.field == "cost.usd_per_chip_hour"
    assert "positive number of US dollars per chip per hour" in err.reason


@pytest.mark.parametrize("table", [
    "[cost]\nusd_per_hour = 2.99",
    "[cost]\nusd_per_chip_hour = 2.99\ncurrency = \"EUR\"",
])
def test_unknown_key(tmp_path, table):
    err = load_error(tmp_path, table)
    unknown = re.search(r"^(\w+) =", table.splitlines()[-1]).group(1)
    assert err.field == f"cost.{unknown}"
    assert "unknown key" in err.reason and "usd_per_chip_hour" in err.reason


def test_empty_cost_table(tmp_path):
    err = load_error(tmp_path, "[cost]")
    assert err.field == "cost.usd_per_chip_hour"
    assert "missing" in err.reason


def test_cost_not_a_table(tmp_path):
    text = catalog_text("mtia-v2").replace('\nvendor = "Meta"\n', '\nvendor = "Meta"\ncost = 3\n', 1)
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_device(path)
    assert info.value.field == "cost"


# --- what-if overrides --------------------------------------------------------------------------

def test_override_replaces_a_price():
    dev = memsim.device("h100-sxm")
    new = dev.with_overrides({"cost.usd_per_chip_hour": 3.5})
    assert new.usd_per_chip_hour == 3.5
    assert new.source("cost.usd_per_chip_hour") == "what-if override: 3.5"
    assert dev.usd_per_chip_hour == 12.29
    assert dev.data["cost"] == {"usd_per_chip_hour": 12.29}


def test_override_creates_the_table_on_a_device_without_one():
    dev = memsim.device("mtia-v2")
    new = dev.with_overrides({"cost.usd_per_chip_hour": 3.5})
    assert new.usd_per_chip_hour == 3.5
    assert dev.usd_per_chip_hour is None
    assert "cost" not in dev.data
    assert memsim.device("mtia-v2").usd_per_chip_hour is None


def test_override_from_the_command_line_text():
    """--set gives every value as text; a plain number is taken as the price."""
    new = memsim.device("mtia-v2").with_overrides({"cost.usd_per_chip_hour": "3.5"})
    assert new.usd_per_chip_hour == 3.5


@pytest.mark.parametrize("value", ["cheap", "3.5 USD", True, 0, -2.0, None])
def test_bad_override(value):
    for name in ("h100-sxm", "mtia-v2"):
        with pytest.raises(ConfigError) as info:
            memsim.device(name).with_overrides({"cost.usd_per_chip_hour": value})
        assert info.value.field == "cost.usd_per_chip_hour"


def test_override_of_an_unknown_cost_key():
    with pytest.raises(ConfigError) as info:
        memsim.device("mtia-v2").with_overrides({"cost.usd_per_hour": 3.5})
    assert info.value.field == "cost.usd_per_hour"


def test_other_missing_tables_are_still_an_error():
    data = dict(memsim.device("h100-sxm").data)
    del data["link"]
    without_link = parse_device(data, file="no-link.toml")
    with pytest.raises(ConfigError) as info:
        without_link.with_overrides({"link.bandwidth": "100 GB/s"})
    assert info.value.field == "link.bandwidth"
    assert "no table 'link'" in str(info.value)


# --- the catalog --------------------------------------------------------------------------------

PRICED = [name for name in DEVICES if "cost" in raw_device(name)]
UNPRICED = [name for name in DEVICES if "cost" not in raw_device(name)]


def test_some_catalog_devices_have_a_price():
    assert {"h100-sxm", "tpu-v5e", "tpu-v5p", "inferentia2", "trainium2"} <= set(PRICED)


@pytest.mark.parametrize("name", PRICED)
def test_every_price_has_a_tagged_source_and_a_sane_value(name):
    data = raw_device(name)
    value = data["cost"]["usd_per_chip_hour"]
    assert 0.1 <= value <= 100, f"{name}: {value} USD per chip-hour is implausible"
    source = data.get("sources", {}).get("cost.usd_per_chip_hour")
    assert source, f"{name}: no [sources] entry for cost.usd_per_chip_hour"
    assert TAG.search(source), f"{name}: cost source has no confidence tag"
    assert memsim.device(name).usd_per_chip_hour == pytest.approx(value)


@pytest.mark.parametrize("name", PRICED)
def test_a_derived_price_shows_its_arithmetic(name):
    """A [D] price says which instance price it divides by how many chips, and the result holds."""
    data = raw_device(name)
    source = data["sources"]["cost.usd_per_chip_hour"]
    if not source.startswith("[D"):
        pytest.skip("a published per-chip-hour price, not derived")
    match = re.match(r"\[D[/\]].*?([\d,.]+) / ([\d,]+) = ([\d.]+)", source)
    assert match, f"{name}: a derived price must show 'instance price / chips = price'"
    price, chips, result = (float(g.replace(",", "")) for g in match.groups())
    assert math.isclose(price / chips, result, rel_tol=1e-3)
    assert math.isclose(result, data["cost"]["usd_per_chip_hour"], rel_tol=1e-3)


@pytest.mark.parametrize("name", UNPRICED)
def test_a_device_without_a_price_says_why(name):
    source = raw_device(name).get("sources", {}).get("cost")
    assert source, f"{name}: no [cost] and no [sources] entry 'cost' saying why"
    assert TAG.search(source)
    assert memsim.device(name).usd_per_chip_hour is None


@pytest.mark.parametrize("name", NOT_RENTED)
def test_chips_not_rented_per_chip_have_no_price(name):
    assert name in UNPRICED
