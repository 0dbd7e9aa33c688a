"""memsim.inputs: one way to build a what-if, the same from the CLI, studies and Python."""

from __future__ import annotations

import dataclasses
from importlib import resources

import pytest

import memsim
from memsim.errors import ConfigError
from memsim.inputs import (INT_PATHS, DeviceRequest, decode_from, device_from, model_from,
                           request_of, typed_value)


@pytest.mark.parametrize("path, value, read", [
    ("cores", "64", lambda d: d.cores),
    ("cores", 64, lambda d: d.cores),
    ("link.max_chips", "4", lambda d: d.link.max_chips),
    ("tile.k", "64", lambda d: d.tile_k),
    ("matrix_unit.m", "32", lambda d: d.matrix_unit[0]),
])
def test_integer_fields_take_text_and_numbers(path, value, read):
    dev = device_from(DeviceRequest("h100-sxm", sets=((path, value),)))
    assert read(dev) == int(value)


#: Every integer field a device file writes that a what-if can change, a value other than mi300x's,
#: and how the Device reads it (``matrix_unit.k`` and ``core_memory`` no figure reads).
INTEGER_FIELDS = {
    "cores": (256, lambda d: d.cores),
    "tile.k": (64, lambda d: d.tile_k),
    "tile.n": (64, lambda d: d.tile_n),
    "tile.activation_width": (128, lambda d: d.activation_width),
    "matrix_unit.m": (16, lambda d: d.matrix_unit[0]),
    "matrix_unit.n": (64, lambda d: d.matrix_unit[1]),
    "link.max_chips": (4, lambda d: d.link.max_chips),
    "link.ranks_per_chip": (2, lambda d: d.link.ranks_per_chip),
}


def test_mi300x_leaves_the_optional_integer_fields_unset():
    """What the next test relies on: the type comes from the field, not the file's value."""
    data = memsim.device("mi300x").data
    assert "activation_width" not in data["tile"] and "ranks_per_chip" not in data["link"]


@pytest.mark.parametrize("path", INTEGER_FIELDS)
def test_every_integer_field_takes_text_as_the_api_takes_an_int(path):
    """``--set tile.activation_width=128`` (a study's value is text too) on a device whose file
    does not set it was refused as 'expected an integer', while the API took the int."""
    value, read = INTEGER_FIELDS[path]
    by_text = device_from(DeviceRequest("mi300x", sets=((path, str(value)),)))
    assert path in INT_PATHS
    assert read(by_text) == value and by_text == memsim.device("mi300x").with_overrides(
        {path: value})


@pytest.mark.parametrize("value", ["6.5", "sixty", True])
def test_an_integer_field_refuses_what_is_not_one(value):
    with pytest.raises(ConfigError, match="expected an integer") as info:
        device_from("h100-sxm", sets=(("cores", value),))
    assert info.value.field == "cores"


def test_quantities_are_passed_on_as_text():
    assert typed_value("tiers.hbm.bandwidth", "5 TB/s", "3.35 TB/s") == "5 TB/s"
    assert typed_value("tiers.sram.capacity", "100 KiB", "50 MB") == "100 KiB"
    assert device_from("h100-sxm", sets=("tiers.sram.capacity=100 KiB",)).tier("sram").capacity \
        == 100 * 1024


def test_a_price_is_the_cost_what_if():
    a = device_from("mtia-v2", usd_per_chip_hour=3.5)
    b = device_from("mtia-v2", sets=("cost.usd_per_chip_hour=3.5",))
    assert a.usd_per_chip_hour == b.usd_per_chip_hour == 3.5


def test_policy_flag_and_layout_set_are_one_rule():
    by_flag = device_from(DeviceRequest("h100-sxm", policy="hybrid"))
    by_set = device_from(DeviceRequest("h100-sxm", sets=(("layout.policy", "hybrid"),)))
    assert by_flag.layout == by_set.layout and by_flag.layout.policy == "hybrid"
    assert device_from(DeviceRequest("h100-sxm", policy="auto")).layout.policy == "hbm-centric"
    with pytest.raises(ConfigError, match="disagree"):
        device_from(DeviceRequest("h100-sxm", sets=(("layout.policy", "hybrid"),),
                                  policy="tiered"))
    with pytest.raises(ConfigError) as info:          # refused the same way by both routes
        device_from(DeviceRequest("h100-sxm", policy="tiered"))
    with pytest.raises(ConfigError) as again:
        device_from(DeviceRequest("h100-sxm", sets=(("layout.policy", "tiered"),)))
    assert info.value.field == again.value.field == "layout.policy"


def test_requests_are_hashable_plain_data():
    a = DeviceRequest("h100-sxm", sets={"tiers.hbm.bandwidth": "5 TB/s"}, add_tiers="cxl-gen5-x16")
    b = DeviceRequest("h100-sxm", sets=("tiers.hbm.bandwidth=5 TB/s",),
                      add_tiers=("cxl-gen5-x16",))
    assert a == b and hash(a) == hash(b) and a.add_tiers == ("cxl-gen5-x16",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.device = "mi300x"
    assert device_from(a) is device_from(b)                # built once


@pytest.mark.parametrize("sets, field", [
    (("nonsense.key=banana",), "nonsense.key"), (("novalue",), "--set"), (("k=",), "--set")])
def test_bad_sets_are_config_errors(sets, field):
    with pytest.raises(ConfigError) as info:
        device_from("h100-sxm", sets=sets)
    assert field in str(info.value)


def test_decode_from_takes_placement_in_every_form_and_names_unknown_fields():
    want = (("kv", "hbm"),)
    for placement in ({"kv": "hbm"}, [("kv", "hbm")], ["kv=hbm"], (("kv", "hbm"),),
                      [["kv", "hbm"]],                 # as a store's JSON keeps it
                      "kv=hbm"):                       # one text, as --place takes it
        assert decode_from({"placement": placement}).placement == want
    with pytest.raises(ConfigError) as info:
        decode_from({"bacth": 4})
    assert info.value.field == "bacth"
    assert decode_from(memsim.Decode(batch=2), context=8).context == 8


def test_request_of_takes_the_workload_policy():
    assert request_of("h100-sxm", workload={"policy": "hybrid"}).policy == "hybrid"
    assert model_from("llama-3.2-1b") is model_from("llama-3.2-1b")


@pytest.mark.parametrize("change, field", [
    ({"kv_heads": 3}, "kv_heads"),               # 32 heads: ran, silently, before the check
    ({"experts_per_token": 4}, "experts_per_token"),   # a dense model: ran as if 1
    ({"heads": 0}, "heads"),                     # was a ZeroDivisionError
    ({"layers": 2000}, "layers"),                # a file is refused above 1,024 layers
    ({"hidden": -5}, "hidden"),
])
def test_a_model_built_in_python_meets_a_model_files_limits(change, field):
    """One path: emulate, the planner and model_from refuse a Model a file could not state."""
    bad = dataclasses.replace(memsim.model("llama-3.2-1b"), **change)
    for call in (lambda: model_from(bad), lambda: memsim.emulate("h100-sxm", bad, context=128)):
        with pytest.raises(ConfigError) as info:
            call()
        assert info.value.field == field and "memsim.Model 'llama-3.2-1b'" in str(info.value)


def test_a_valid_model_built_in_python_runs_as_given():
    small = dataclasses.replace(memsim.model("llama-3.2-1b"), layers=4)
    assert model_from(small) is small
    assert memsim.emulate("h100-sxm", small, context=128).time_per_token > 0


def _catalog_text(package: str, name: str) -> str:
    return (resources.files(package) / f"{name}.toml").read_text(encoding="utf-8")


def _rewrite(path, old: str, new: str) -> None:
    """Edit a file so that its size changes too (the caches key on size and modification time)."""
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_a_device_file_edited_in_a_running_process_is_read_again(tmp_path):
    """The what-if workflow: copy a device file, run, edit a figure, run again. The second run
    answers with the edited figure (it answered with the first file's before); an unchanged
    file is still read once."""
    path = tmp_path / "my-h100.toml"
    path.write_text(_catalog_text("memsim.devices", "h100-sxm"))
    first = device_from(str(path))
    assert device_from(str(path)) is first
    before = memsim.emulate(str(path), "llama-3.2-1b", context=256).time_per_token
    _rewrite(path, 'sustained_bandwidth = "2.8 TB/s"', 'sustained_bandwidth = "1.4 TB/s"')
    assert device_from(str(path)).main_memory.sustained_bandwidth == 1.4e12
    after = memsim.emulate(str(path), "llama-3.2-1b", context=256).time_per_token
    assert after > before


def test_a_model_file_edited_in_a_running_process_is_read_again(tmp_path):
    path = tmp_path / "my-model.toml"
    path.write_text(_catalog_text("memsim.models", "llama-3.2-1b"))
    layers = model_from(str(path)).layers
    assert model_from(str(path)) is model_from(str(path))
    _rewrite(path, f"layers = {layers}", f"layers = {layers // 2}")
    assert model_from(str(path)).layers == layers // 2


def test_a_sweep_plans_an_edited_device_file_again(tmp_path):
    """A study point names its device by path: a point run after the file changed is planned
    from the new file (the per-process plan cache keyed on the path alone reused the old plan),
    here a capacity that no longer holds the model."""
    from memsim.sweep import evaluate
    from memsim.study import Point
    path = tmp_path / "my-h100.toml"
    path.write_text(_catalog_text("memsim.devices", "h100-sxm"))
    point = Point(device=str(path), model="llama-3-8b")
    assert evaluate(point)[3] is None
    _rewrite(path, 'capacity = "80 GB"', 'capacity = "8 GB"')
    assert "8,000,000,000 B" in (evaluate(point)[3] or "")


def test_a_sweep_computes_again_the_points_of_an_edited_device_file(tmp_path):
    """A rerun of a study whose device file was edited computes its points again (it kept the
    rows of the old file's figures, 'already in the store'), replaces them in place (one row per
    point, same key) and records the file's digest with each row; an unchanged file is skipped."""
    from memsim.store import Store
    from memsim.study import grid
    path = tmp_path / "my-h100.toml"
    path.write_text(_catalog_text("memsim.devices", "h100-sxm"))
    store = tmp_path / "s.sqlite"
    points = grid(device=str(path), model="llama-3.2-1b", batch=[1, 2], context=256)
    first = memsim.sweep(points, store)
    assert (first.computed, first.skipped) == (2, 0)
    assert memsim.sweep(points, store).skipped == 2
    keys = {p.key for p in points}
    _rewrite(path, 'sustained_bandwidth = "2.8 TB/s"', 'sustained_bandwidth = "1.4 TB/s"')
    again = memsim.sweep(points, store)
    assert (again.computed, again.skipped) == (2, 0)
    with Store(store) as results:
        rows = results.rows()
    assert {row["key"] for row in rows} == keys and len(rows) == 2
    assert all(row["inputs"]["files"] == {str(path): points[0].file_digests()[str(path)]}
               for row in rows)
    slow = memsim.emulate(str(path), "llama-3.2-1b", context=256).time_per_token
    assert sorted(row["figures"]["time_per_token_s"] for row in rows)[0] == pytest.approx(
        slow, rel=1e-12)


def test_a_catalog_point_records_no_files():
    point = memsim.study.grid(device="h100-sxm", model="llama-3-8b")[0]
    assert point.named_files() == () and "files" not in point.inputs()


@pytest.mark.parametrize("what_if", ["cores=1e3", "tile.k=64.5",
                                     "runtime.collective.custom_allreduce_chips=[4,"])
def test_a_what_if_that_cannot_be_read_names_the_device_file(what_if):
    """`--set cores=1e3` printed its field but not the file it is a what-if of."""
    path, value = what_if.split("=", 1)
    with pytest.raises(ConfigError) as info:
        device_from(request_of("h100-sxm", sets=((path, value),)))
    assert info.value.file == "devices/h100-sxm.toml" and info.value.field == path
