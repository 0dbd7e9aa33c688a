"""The serving verbs: run --prefill, the mixed step, plan --max-batch, spec --scan-batch,
show --runtime, runtimes, search (issues 17 and 19)."""

from __future__ import annotations

import json

import pytest

from memsim.capacity import max_batch
from memsim.cli import main
from memsim.emulate import emulate
from memsim.inputs import decode_from, device_from, model_from
from memsim.runtime import runtime_names
from memsim.speculative import break_even_batch
from memsim.workload import Prefill


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_prefill_prints_the_time_to_first_token_and_its_bound(capsys):
    code, out, _ = run(capsys, "run", "h100-sxm", "llama-3.2-1b", "--prefill", "512")
    report = emulate("h100-sxm", "llama-3.2-1b", Prefill(prompt=512))
    assert code == 0 and "time to first token" in out and "time per token" not in out
    assert f"bound by {report.bottleneck}" in out
    code, out, _ = run(capsys, "run", "h100-sxm", "llama-3.2-1b", "--prefill", "512",
                       "--cached", "256", "--batch", "2", "--json")
    data = json.loads(out)["prefill"]
    expected = emulate("h100-sxm", "llama-3.2-1b", Prefill(batch=2, prompt=512, cached=256))
    assert data["time_to_first_token_s"] == pytest.approx(expected.time_per_step)
    assert data["bound_by"] == expected.bottleneck and data["cached"] == 256


def test_cached_without_prefill_is_one_line(capsys):
    code, _, err = run(capsys, "run", "h100-sxm", "llama-3.2-1b", "--cached", "5")
    assert code == 2 and "--prefill" in err and len(err.strip().splitlines()) == 1


def test_a_prompt_chunk_labels_the_inter_token_latency(capsys):
    code, out, _ = run(capsys, "run", "h100-sxm", "llama-3.2-1b", "--batch", "8",
                       "--prefill-chunk", "256")
    report = emulate("h100-sxm", "llama-3.2-1b", decode_from(batch=8, prefill_chunk=256))
    assert code == 0 and out.startswith("inter-token latency of the 8 decoding sequence(s)")
    from memsim.units import format_quantity
    assert format_quantity(report.time_per_token, "time") in out.splitlines()[0]


def test_max_batch_agrees_with_the_api(capsys):
    code, out, _ = run(capsys, "plan", "h100-sxm", "llama-3-8b", "--max-batch", "--context",
                       "8192", "--json")
    rows = json.loads(out)
    assert code == 0 and rows and [r["chips"] for r in rows] == sorted(r["chips"] for r in rows)
    one = next(r for r in rows if r["chips"] == 1)
    expected = max_batch(device_from("h100-sxm"), model_from("llama-3-8b"),
                         decode_from(context=8192))
    assert one["batch"] == expected.batch > 0
    code, out, _ = run(capsys, "plan", "h100-sxm", "llama-3-8b", "--max-batch", "--context",
                       "8192", "--tp", "2")
    assert code == 0 and "max batch" in out and len(out.strip().splitlines()) == 4


def test_scan_batch_prints_the_break_even_batch(capsys):
    argv = ("spec", "h100-sxm", "llama-3-8b", "--draft", "llama-3.2-1b", "--acceptance", "0.7",
            "--scan-batch")
    code, out, _ = run(capsys, *argv, "--json")
    largest, scan = break_even_batch("h100-sxm", "llama-3-8b", "llama-3.2-1b", 4, 0.7)
    data = json.loads(out)
    assert code == 0 and data["largest_paying_batch"] == largest
    assert [(r["batch"], r["speedup"]) for r in data["scan"]] == [tuple(s) for s in scan]
    code, out, _ = run(capsys, *argv)
    assert "batch  speedup" in out and "speculation" in out.splitlines()[-1]


def test_show_runtime_cites_every_figure_and_runtimes_lists_them(capsys):
    code, out, _ = run(capsys, "show", "--runtime", "hf-eager")
    assert code == 0 and "host_per_step" in out and "collective library" in out
    code, out, _ = run(capsys, "runtimes")
    assert code == 0 and all(name in out for name in runtime_names())
    assert "host per step" in out.splitlines()[0]
    code, _, err = run(capsys, "show", "--runtime", "no-such-stack")
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_show_device_marks_defaulted_sustained_bandwidth_and_power(capsys):
    code, out, _ = run(capsys, "show", "h100-sxm")
    assert code == 0 and "idle 70 W" in out and "runtime trt-llm" in out
    assert "nvlink" in out and "scale-out" in out
    assert "9.7 TB/s *" in out and "default fraction" in out
    assert "matmuls  bf16 794.5 TFLOP/s" in out            # sustained_compute, measured


def test_search_verb_ranks_and_says_what_it_evaluated(capsys, tmp_path):
    argv = ("search", "llama-3-8b", "--target", "ms_per_token<=15", "--devices",
            "h100-sxm,mi300x", "--formats", "bf16,int4-g128", "--kv-formats", "bf16",
            "--store", str(tmp_path / "s.sqlite"), "--quiet")
    code, out, _ = run(capsys, *argv)
    assert code == 0 and "configurations emulated" in out and "$/Mtok" in out
    code, out, _ = run(capsys, *argv, "--json")
    data = json.loads(out)
    assert data["computed"] == 0 and data["met"] == len(data["configurations"]) > 0
    code, _, err = run(capsys, "search", "llama-3-8b", "--target", "fast")
    assert code == 2 and "--target" in err


def test_terabytes_per_second_written_as_bps_suggests_tb_per_s(capsys):
    code, _, err = run(capsys, "run", "h100-sxm", "llama-3.2-1b", "--set",
                       "tiers.hbm.bandwidth=5TBps")
    assert code == 2 and "did you mean 'TB/s'" in err


def test_serve_verb_prints_the_steady_state_serve_computes(capsys):
    """`memsim serve` takes the run flags (less the ones serve sets) and shows memsim.serve's
    figures: the same output tokens/s as the Python API."""
    from memsim.serving import serve

    argv = ["serve", "h100-sxm", "llama-3.2-1b", "--input-tokens", "256", "--output-tokens", "64",
            "--concurrency", "16", "--token-budget", "512", "--weights", "fp8-e4m3"]
    assert main(argv + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    expected = serve("h100-sxm", "llama-3.2-1b", input_tokens=256, output_tokens=64,
                     concurrency=16, token_budget=512, weights="fp8-e4m3")
    assert data["output_tokens_per_s"] == pytest.approx(expected.output_tokens_per_s)
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert f"{expected.output_tokens_per_s:,.1f} in aggregate" in text
    with pytest.raises(SystemExit):
        main(argv + ["--batch", "4"])          # serve sets the batch itself


def test_a_mixed_step_names_the_cached_prompt_of_the_step_it_times(capsys):
    """The time shown is the warm (last) step's, whose chunk follows the cached prompt and the
    earlier steps' chunks: with 2 steps of 512-token chunks, after 512 tokens."""
    assert main(["run", "h100-sxm", "llama-3-8b", "--batch", "4", "--context", "256",
                 "--prefill-chunk", "512"]) == 0
    assert "(this one after 512 cached prompt tokens)" in capsys.readouterr().out
    assert main(["run", "h100-sxm", "llama-3-8b", "--batch", "4", "--context", "256",
                 "--prefill-chunk", "512", "--steps", "3", "--prefill-context", "100"]) == 0
    assert "(this one after 1124 cached prompt tokens)" in capsys.readouterr().out
