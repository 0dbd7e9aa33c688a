"""The committed report and the numbers the READMEs quote are what the code computes today: a
time-model change that moves a row cannot leave docs/validation.md, the README's medians or
validation/README.md's row counts behind."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from memsim.validate import default_folder, summarize, validate

ROOT = Path(__file__).parents[1]

# The README's medians table: its row label, then the summary groups it quotes (one per figure).
README_GROUPS = {
    "batch-1 decode": ["batch 1"],
    "batched decode": ["batched"],
    "single chip": ["single chip"],
    "multi-chip": ["multi-chip"],
    "serving (continuous batching, `memsim serve`)": ["serving (continuous batching)"],
    "speculative speedup": ["speculative"],
    "time to first token": ["time to first token"],
    "NVIDIA / Apple / AMD": ["family NVIDIA", "family Apple", "family AMD"],
    "AWS / TPU / Groq / Cerebras": ["family AWS", "family Google TPU", "family Groq",
                                    "family Cerebras"],
}


@pytest.fixture(scope="module")
def report():
    rows, text = validate(default_folder())
    return rows, text


def test_docs_validation_md_is_what_memsim_validate_writes(report):
    _, text = report
    assert (ROOT / "docs" / "validation.md").read_text() == text, (
        "docs/validation.md is stale: run `memsim validate -o docs/validation.md`")


def test_the_readmes_medians_are_the_reports(report):
    rows, _ = report
    groups = {g.group: g for g in summarize(rows).groups}
    table = {}
    for line in (ROOT / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] in README_GROUPS:
            table[cells[0]] = cells
    assert set(table) == set(README_GROUPS)
    for label, names in README_GROUPS.items():
        _, counts, medians = table[label]
        assert [int(c) for c in counts.split(" / ")] == [groups[n].rows for n in names], label
        assert [m.strip() for m in medians.split(" / ")] == [
            f"{100 * groups[n].median_abs_error:.1f}%" for n in names], label


def test_validation_readmes_regime_counts_are_the_files():
    rows = tomllib.loads((default_folder() / "measurements.toml").read_text())["measurement"]
    decode = [r for r in rows if r["metric"] not in ("speedup", "ttft_ms") and not r.get("serving")]
    expected = {
        "decode, batch 1, one chip": sum(r["batch"] == 1 and r.get("chips", 1) == 1 for r in decode),
        "decode, batch 1, several chips": sum(r["batch"] == 1 and r.get("chips", 1) > 1
                                              for r in decode),
        "decode, batched": sum(r["batch"] > 1 for r in decode),
        "serving": sum(bool(r.get("serving")) for r in rows),
        "time to first token": sum(r["metric"] == "ttft_ms" for r in rows),
        "speculative decoding": sum(r["metric"] == "speedup" for r in rows),
    }
    text = (default_folder() / "README.md").read_text()
    found = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        for regime in expected:
            if len(cells) == 3 and cells[0].startswith(regime):
                found[regime] = int(cells[1])
    assert found == expected
    several = sum(r["batch"] > 1 and r.get("chips", 1) > 1 for r in decode)
    assert f"{several} of them on several chips" in text
    assert re.search(rf"holds {len(rows)} published measurements", text)
