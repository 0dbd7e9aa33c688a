"""Golden outputs: a change in any count or time of these runs is a visible diff.

Regenerate deliberately with ``MEMSIM_REGENERATE_GOLDEN=1 python -m pytest tests/test_golden.py``
and commit the changed files with the reason.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import memsim

GOLDEN = Path(__file__).parent / "golden"
CASES = {
    "h100-sxm_llama-3-8b_bf16_b1_c4096": ("h100-sxm", "llama-3-8b",
                                          dict(batch=1, context=4096)),
    "mi300x_llama-3.2-1b_int4-g128_b8_c2048": ("mi300x", "llama-3.2-1b",
                                               dict(batch=8, context=2048, weights="int4-g128",
                                                    kv="fp8-e4m3")),
    "mtia-v2_llama-3.2-1b_int8_b1_c512": ("mtia-v2", "llama-3.2-1b",
                                          dict(batch=1, context=512, weights="int8", steps=3)),
    "wse-3_llama-3-8b_bf16_b4_c8192": ("wse-3", "llama-3-8b", dict(batch=4, context=8192)),
}


def _figures(report: memsim.Report) -> dict:
    return {"cold": report.cold.to_dict(), "warm": report.warm.to_dict(),
            "ops": [row.to_dict() for row in report.op_rows("warm")[:12]]}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name):
    device, model, fields = CASES[name]
    figures = _figures(memsim.emulate(device, model, **fields))
    path = GOLDEN / f"{name}.json"
    if os.environ.get("MEMSIM_REGENERATE_GOLDEN") == "1":
        path.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
    expected = json.loads(path.read_text())
    assert _equal(json.loads(json.dumps(figures)), expected)


def _equal(actual, expected) -> bool:
    """Integers exactly, floats to 1e-12 relative, through nested dicts and lists."""
    if isinstance(expected, dict):
        assert set(actual) == set(expected)
        return all(_equal(actual[key], expected[key]) for key in expected)
    if isinstance(expected, list):
        assert len(actual) == len(expected)
        return all(_equal(a, e) for a, e in zip(actual, expected))
    if isinstance(expected, float):
        assert actual == pytest.approx(expected, rel=1e-12)
    else:
        assert actual == expected
    return True
