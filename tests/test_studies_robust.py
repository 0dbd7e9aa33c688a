"""Study files with a mistake in their shape: one ConfigError naming the field, never a
traceback (issue 18: items 13 and 16)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from memsim.cli import main
from memsim.errors import ConfigError
from memsim.study import load_study
from memsim.testing import examples
from memsim.testing._studies import InvalidStudy, invalid_studies


@pytest.mark.parametrize("text, field", [
    ('point = "abc"\n', "point"),
    ('name = "s"\n[grid]\ndevice = "h100-sxm"\nmodel = "llama-3.2-1b"\nset = 5\n', "grid.set"),
    ('name = ""\n[grid]\ndevice = "h100-sxm"\nmodel = "llama-3.2-1b"\n', "name"),
    ('grid = [1]\n', "grid"),
    ('[[point]]\ndevice = "h100-sxm"\n', "point[0].model"),
    ('[[point]]\ndevice = "h100-sxm"\nmodel = "llama-3.2-1b"\nbacth = 4\n', "point[0].bacth"),
    ('[grid]\ndevice = "h100-sxm"\nmodel = "llama-3.2-1b"\nspeculative = "yes"\n',
     "grid.speculative"),
])
def test_a_malformed_study_names_its_field(tmp_path, capsys, text, field):
    path = tmp_path / "s.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_study(path)
    assert info.value.field == field and info.value.file == str(path)
    assert main(["sweep", str(path), "--store", str(tmp_path / "r.sqlite"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("memsim: error:") and len(err.splitlines()) == 1 and field in err


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(example=invalid_studies())
def test_every_invalid_study_is_one_config_error_naming_its_field(tmp_path_factory, example):
    assert isinstance(example, InvalidStudy)
    path = tmp_path_factory.mktemp("s") / "study.toml"
    path.write_text(example.text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_study(path)
    assert info.value.field == example.field, (example.mistake, example.text)
