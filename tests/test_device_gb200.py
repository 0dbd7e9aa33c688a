"""The GB200's Grace memory tier at the rate Azure's nvbandwidth measured over NVLink-C2C
(devices/gb200.toml [sources]: host-to-device copy 201 GB/s per GPU), and the time model using
exactly that rate."""

from __future__ import annotations

import pytest

import memsim

C2C_COPY_BYTES_PER_S = 201e9      # Azure ND GB200 v6, nvbandwidth host_to_device_memcpy_ce


def test_grace_memory_runs_at_the_measured_copy_rate():
    tier = {t.name: t for t in memsim.device("gb200").tiers}["lpddr"]
    assert tier.sustained_bandwidth == C2C_COPY_BYTES_PER_S
    assert tier.sustained_bandwidth < tier.bandwidth


def test_kv_in_grace_memory_takes_its_bytes_over_the_measured_rate():
    """Llama 3 8B with its KV cache placed in Grace memory: the lpddr-bound time of the step is
    the bytes read and written there over 201 GB/s."""
    step = memsim.emulate("gb200", "llama-3-8b", batch=1, context=128,
                          placement={"kv": "lpddr"}).warm
    moved = step.bytes_read["lpddr"] + step.bytes_written["lpddr"]
    assert moved > 0
    assert step.time_by_bound["lpddr"] == pytest.approx(moved / C2C_COPY_BYTES_PER_S, rel=1e-12)
