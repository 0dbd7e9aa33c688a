"""memsim validate: predictions beside measurements, and the landscape's table."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import memsim
from memsim.validate import validate

ROW = """
[[measurement]]
id = "{id}"
device = "{device}"
model = "{model}"
weights = "bf16"
software = "test"
batch = {batch}
context = 512
metric = "{metric}"
value = {value}
source = "a test"
"""


def folder_with(tmp_path: Path, rows: list[dict], findings: str = "") -> Path:
    folder = tmp_path / "validation"
    (folder / "devices").mkdir(parents=True)
    (folder / "models").mkdir()
    shutil.copy(Path(memsim.__file__).parent / "models" / "llama-3.2-1b.toml",
                folder / "models" / "my-model.toml")
    text = (Path(memsim.__file__).parent.parent / "devices" / "h100-sxm.toml").read_text()
    (folder / "devices" / "my-gpu.toml").write_text(text.replace('name = "h100-sxm"',
                                                                 'name = "my-gpu"'))
    (folder / "measurements.toml").write_text("".join(ROW.format(**row) for row in rows))
    if findings:
        (folder / "findings.toml").write_text(findings)
    return folder


def test_rows_are_predicted_in_their_metric(tmp_path):
    folder = folder_with(tmp_path, [
        dict(id="a", device="my-gpu", model="my-model", batch=1, metric="ms_per_token",
             value=1.0),
        dict(id="b", device="h100-sxm", model="llama-3-8b", batch=4,
             metric="tokens_per_s_total", value=500.0),
        dict(id="c", device="h100-sxm", model="llama-3-70b", batch=1,
             metric="tokens_per_s_per_user", value=20.0),
    ], findings='a = "the test says why"\n')
    rows, text = validate(folder, tmp_path / "out.md")
    by_id = {r.id: r for r in rows}
    report = memsim.emulate("h100-sxm", "llama-3.2-1b", context=512)
    assert by_id["a"].predicted == pytest.approx(1e3 * report.time_per_token)
    assert by_id["a"].error == pytest.approx(1.0 / by_id["a"].predicted - 1)   # on speed
    assert by_id["c"].predicted is None and "short by" in by_id["c"].problem
    assert "the test says why" in text and "Median absolute error" in text
    assert "8x NVIDIA H100" in text and (tmp_path / "out.md").read_text() == text


def test_a_bad_measurement_names_its_field(tmp_path):
    folder = folder_with(tmp_path, [dict(id="a", device="h100-sxm", model="llama-3-8b",
                                         batch=1, metric="furlongs", value=1.0)])
    with pytest.raises(memsim.ConfigError) as info:
        validate(folder)
    assert info.value.field == "measurement.0.metric"
