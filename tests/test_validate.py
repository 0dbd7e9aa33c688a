"""memsim validate: predictions beside measurements, medians per group, rows it cannot predict."""

from __future__ import annotations

import shutil
import statistics
from pathlib import Path

import pytest

import memsim
from memsim.speculative import Acceptance, closed_form_tokens
from memsim.validate import (
    METRICS,
    RUNTIMES,
    Row,
    acceptance_for,
    default_folder,
    device_family,
    load_measurements,
    predict,
    resolve_device,
    resolve_model,
    summarize,
    validate,
)

ROW = """
[[measurement]]
id = "{id}"
device = "{device}"
model = "{model}"
weights = "{weights}"
software = "test"
runtime = "vllm"
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
    (folder / "measurements.toml").write_text(
        "".join(ROW.format(**{"weights": "bf16", **row}) for row in rows))
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
        dict(id="d", device="my-gpu", model="my-model", batch=1, weights="q9_z",
             metric="tokens_per_s_per_user", value=20.0),
    ], findings='a = "the test says why"\n')
    rows, text = validate(folder, tmp_path / "out.md")
    by_id = {r.id: r for r in rows}
    report = memsim.emulate("h100-sxm", "llama-3.2-1b", context=512, runtime="vllm")
    assert by_id["a"].predicted == pytest.approx(1e3 * report.time_per_token)
    assert by_id["a"].error == pytest.approx(1.0 / by_id["a"].predicted - 1)   # on speed
    assert by_id["c"].predicted is None and "short by" in by_id["c"].problem
    # An unknown format is listed with its reason, not raised.
    assert by_id["d"].predicted is None and "unknown format 'q9_z'" in by_id["d"].problem
    assert "Rows memsim does not predict" in text and "**d**" in text
    assert "the test says why" in text and "Median absolute error" in text
    assert "| family NVIDIA |" in text and "| runtime vllm |" in text
    assert "8x NVIDIA H100" in text and (tmp_path / "out.md").read_text() == text


def test_a_bad_measurement_names_its_field(tmp_path):
    folder = folder_with(tmp_path, [dict(id="a", device="h100-sxm", model="llama-3-8b",
                                         batch=1, metric="furlongs", value=1.0)])
    with pytest.raises(memsim.ConfigError) as info:
        validate(folder)
    assert info.value.field == "measurement.0.metric"


@pytest.mark.parametrize("value", ["nan", "inf", "-1.0", "0"])
def test_a_measurement_that_is_no_positive_finite_number_is_refused(tmp_path, value):
    """nan and inf passed, showing +nan% and -100% rows."""
    folder = folder_with(tmp_path, [dict(id="a", device="h100-sxm", model="llama-3-8b",
                                         batch=1, metric="tokens_per_s_per_user", value=value)])
    with pytest.raises(memsim.ConfigError) as info:
        validate(folder)
    assert info.value.field == "measurement.0.value"


@pytest.mark.parametrize("old, new, field", [
    ('runtime = "vllm"\n', "", "runtime"),                  # a row must say its stack
    ("batch = 1", 'batch = 1\nchips = "x"', "chips")])      # a ValueError traceback before
def test_a_row_missing_or_misstating_a_field_is_refused_at_it(tmp_path, old, new, field):
    folder = folder_with(tmp_path, [dict(id="a", device="h100-sxm", model="llama-3-8b",
                                         batch=1, metric="ms_per_token", value=1.0)])
    text = (folder / "measurements.toml").read_text().replace(old, new)
    (folder / "measurements.toml").write_text(text)
    with pytest.raises(memsim.ConfigError) as info:
        load_measurements(folder)
    assert info.value.field == f"measurement.0.{field}"


def _row(error: float | None, *, device="h100-sxm", runtime="vllm", batch=1, chips=1,
         metric="tokens_per_s_per_user") -> Row:
    measurement = dict(id=f"r{error}{device}{runtime}{batch}{chips}{metric}", device=device,
                       runtime=runtime, batch=batch, chips=chips, metric=metric)
    return Row(measurement, None if error is None else 1.0, error, "", "" if error is not None
               else "a reason")


def test_medians_per_group_are_the_medians_of_their_rows():
    rows = [
        _row(0.10), _row(-0.30), _row(0.20, batch=8),                     # NVIDIA, vllm
        _row(0.50, device="m2-ultra", runtime="llama.cpp-metal"),
        _row(-0.05, device="m2-ultra", runtime="llama.cpp-metal", chips=2),
        _row(0.40, device="groq-lpu", runtime="vendor", chips=576),
        _row(0.25, metric="speedup"), _row(-0.15, metric="speedup"),
        _row(None), _row(None, metric="ttft_ms"),
    ]
    summary = summarize(rows)
    assert summary.measurements == 10 and summary.predicted == 8
    assert summary.median("all") == pytest.approx(statistics.median(
        [0.10, 0.30, 0.20, 0.50, 0.05, 0.40]))
    assert summary.median("batch 1") == pytest.approx(statistics.median(
        [0.10, 0.30, 0.50, 0.05, 0.40]))
    assert summary.median("batched") == pytest.approx(0.20)
    assert summary.median("single chip") == pytest.approx(statistics.median(
        [0.10, 0.30, 0.20, 0.50]))
    assert summary.median("multi-chip") == pytest.approx(statistics.median([0.05, 0.40]))
    assert summary.median("speculative") == pytest.approx(0.20)
    assert summary.median("family NVIDIA") == pytest.approx(0.20)
    assert summary.median("family Apple") == pytest.approx(statistics.median([0.50, 0.05]))
    assert summary.median("family Groq") == pytest.approx(0.40)
    assert summary.median("runtime llama.cpp-metal") == pytest.approx(0.275)
    assert summary.median("runtime vendor") == pytest.approx(0.40)
    assert len(summary.unpredictable) == 2
    assert summary.to_dict()["groups"][0]["group"] == "all"


def test_device_families_follow_the_name():
    assert [device_family(n) for n in ("h100-sxm", "a100-pcie-80gb", "rtx-4090", "m3-max",
                                       "mi300x", "tpu-v5e", "inferentia2", "groq-lpu",
                                       "wse-3", "unheard-of")] == [
        "NVIDIA", "NVIDIA", "NVIDIA", "Apple", "AMD", "Google TPU", "AWS", "Groq", "Cerebras",
        "other"]


def test_acceptance_inverts_the_expected_tokens():
    assert acceptance_for(closed_form_tokens(0.7, 5), 5) == pytest.approx(0.7, abs=1e-9)
    tree = (4, 2, 2, 2)
    tokens = Acceptance(tuple(1 - (1 - 0.4) ** b for b in tree)).expected_tokens
    assert acceptance_for(tokens, 4, tree) == pytest.approx(0.4, abs=1e-9)
    with pytest.raises(memsim.ConfigError):
        acceptance_for(7.0, 5)                     # more than gamma + 1 tokens


@pytest.mark.parametrize("extra, reason", [
    (dict(serving="chunked prefill, 512-token chunks"), "without input_tokens and output_tokens"),
    (dict(speculative_in_figure=True), "includes speculative decoding"),
])
def test_rows_memsim_cannot_predict_say_why(extra, reason):
    row = {**dict(id="x", device="h100-sxm", model="llama-3-8b", weights="bf16", software="s",
                  runtime="trt-llm", batch=1, context=128, metric="tokens_per_s_per_user",
                  value=1.0, source="s"), **extra}
    result = predict(row, default_folder())
    assert result.predicted is None and result.error is None and reason in result.problem


def test_a_report_never_replaces_a_users_file(tmp_path):
    folder = folder_with(tmp_path, [dict(id="a", device="h100-sxm", model="llama-3-8b",
                                         batch=1, metric="ms_per_token", value=1.0)])
    mine = tmp_path / "notes.md"
    mine.write_text("my notes\n")
    with pytest.raises(memsim.ConfigError):
        validate(folder, mine)
    assert mine.read_text() == "my notes\n"


def test_every_repository_row_is_sourced_and_resolves():
    folder = default_folder()
    rows = load_measurements(folder)
    assert len(rows) >= 90
    for row in rows:
        assert row["source"].strip() and row["runtime"] in RUNTIMES
        assert row["metric"] in METRICS
        resolve_device(row["device"], folder)
        resolve_model(row["model"], folder)
        if row["metric"] == "speedup" and row["method"] == "draft":
            resolve_model(row["draft"], folder)
    metrics = {row["metric"] for row in rows}
    assert {"ttft_ms", "speedup"} <= metrics
    assert any(row.get("serving") and row["batch"] >= 32 for row in rows)


def test_time_to_first_token_rows_are_predicted_by_a_prefill():
    """A ttft_ms row is the prefill step of its prompt (memsim.workload.Prefill), on time."""
    row = dict(id="x", device="h100-sxm", model="llama-3-8b", weights="bf16", software="s",
               runtime="trt-llm", batch=1, context=128, prompt=128, metric="ttft_ms",
               value=20.0, source="s")
    result = predict(row, default_folder())
    prefill = memsim.emulate("h100-sxm", "llama-3-8b",
                             memsim.Prefill(prompt=128, runtime="trt-llm"))
    assert result.predicted == pytest.approx(1e3 * prefill.time_per_step)
    assert result.error == pytest.approx(20.0 / result.predicted - 1)       # on speed


def test_serving_rows_are_predicted_by_the_steady_state_in_their_own_group(tmp_path):
    folder = folder_with(tmp_path, [dict(id="plain", device="my-gpu", model="my-model", batch=8,
                                         metric="tokens_per_s_total", value=1000.0)])
    serving = ('serving = "chunked prefill"\ninput_tokens = 1024\noutput_tokens = 128\n'
               'token_budget = 2048\n')
    text = (folder / "measurements.toml").read_text()
    for metric in ("ms_per_token", "tokens_per_s_total"):
        text += ROW.format(id=f"s-{metric}", device="my-gpu", model="my-model", weights="bf16",
                           batch=64, metric=metric, value=10.0) + serving
    (folder / "measurements.toml").write_text(text)
    rows, report = validate(folder)
    by_id = {r.id: r for r in rows}
    state = memsim.serve(resolve_device("my-gpu", folder), resolve_model("my-model", folder),
                         input_tokens=1024, output_tokens=128, concurrency=64,
                         token_budget=2048, runtime="vllm")
    assert by_id["s-ms_per_token"].predicted == pytest.approx(1e3 * state.inter_token_latency_s)
    assert by_id["s-tokens_per_s_total"].predicted == pytest.approx(state.output_tokens_per_s)
    summary = summarize(rows)
    assert summary.median("serving (continuous batching)") is not None
    assert [g.rows for g in summary.groups if g.group == "all"] == [1]   # serving kept apart
    assert "## Serving rows (continuous batching)" in report and "| s-ms_per_token |" in report


def test_a_serving_row_with_a_decode_only_metric_is_refused(tmp_path):
    folder = folder_with(tmp_path, [dict(id="s", device="my-gpu", model="my-model", batch=64,
                                         metric="ttft_ms", value=10.0)])
    text = (folder / "measurements.toml").read_text().replace(
        'metric = "ttft_ms"', 'metric = "ttft_ms"\nprompt = 8\nserving = "x"\n'
        'input_tokens = 8\noutput_tokens = 8')
    (folder / "measurements.toml").write_text(text)
    with pytest.raises(memsim.ConfigError) as error:
        load_measurements(folder)
    assert error.value.field.endswith("metric")


def test_a_static_batch_row_counts_its_prompts_prefill(tmp_path):
    """input_tokens/output_tokens on a decode row: output tokens over one prefill of every prompt
    plus output_tokens decode steps, in each decode metric; a half-stated shape is refused."""
    folder = folder_with(tmp_path, [dict(id=metric, device="my-gpu", model="my-model", batch=4,
                                         metric=metric, value=10.0)
                                    for metric in ("tokens_per_s_total", "ms_per_token")])
    text = (folder / "measurements.toml").read_text().replace(
        "context = 512\n", "context = 512\ninput_tokens = 256\noutput_tokens = 64\n")
    (folder / "measurements.toml").write_text(text)
    rows, _ = validate(folder)
    by_id = {r.id: r for r in rows}
    dev, mod = resolve_device("my-gpu", folder), resolve_model("my-model", folder)
    decode = memsim.emulate(dev, mod, batch=4, context=512, runtime="vllm")
    prefill = memsim.emulate(dev, mod, memsim.Prefill(prompt=256, batch=4, runtime="vllm"))
    wall_s = prefill.time_per_step + 64 * decode.time_per_token
    assert by_id["tokens_per_s_total"].predicted == pytest.approx(4 * 64 / wall_s)
    assert by_id["ms_per_token"].predicted == pytest.approx(1e3 * wall_s / 64)
    assert by_id["ms_per_token"].predicted > 1e3 * decode.time_per_token
    (folder / "measurements.toml").write_text(text.replace("output_tokens = 64\n", ""))
    with pytest.raises(memsim.ConfigError) as error:
        load_measurements(folder)
    assert error.value.field.endswith("output_tokens")


def test_a_static_batch_rows_cached_prompt_tokens_are_read_not_computed(tmp_path):
    """cached_tokens: a benchmark that repeats its prompts under prefix caching prefills only
    the rest of each prompt (memsim.Prefill's cached); all of a prompt cannot be cached."""
    folder = folder_with(tmp_path, [dict(id="cached", device="my-gpu", model="my-model", batch=4,
                                         metric="tokens_per_s_total", value=10.0)])
    path = folder / "measurements.toml"
    text = path.read_text().replace(
        "context = 512\n", "context = 512\ninput_tokens = 256\noutput_tokens = 64\n"
        "cached_tokens = 240\n")
    path.write_text(text)
    (row,) = validate(folder)[0]
    dev, mod = resolve_device("my-gpu", folder), resolve_model("my-model", folder)
    decode = memsim.emulate(dev, mod, batch=4, context=512, runtime="vllm")
    prefill = memsim.emulate(dev, mod, memsim.Prefill(prompt=16, cached=240, batch=4,
                                                      runtime="vllm"))
    whole = memsim.emulate(dev, mod, memsim.Prefill(prompt=256, batch=4, runtime="vllm"))
    assert prefill.flops < whole.flops / 10          # 16 of 256 tokens computed
    assert row.predicted == pytest.approx(
        4 * 64 / (prefill.time_per_step + 64 * decode.time_per_token))
    path.write_text(text.replace("cached_tokens = 240", "cached_tokens = 256"))
    with pytest.raises(memsim.ConfigError) as error:
        load_measurements(folder)
    assert error.value.field.endswith("cached_tokens")


def test_a_row_states_its_activation_type():
    """torchao's float8 weight-only row runs FP8 weights on BF16 activations (W8A16): the row
    says so and memsim's Decode receives it; rows that do not say take the weights' usual one."""
    from memsim.validate import _decode_fields
    rows = {r["id"]: r for r in load_measurements(default_folder())}
    assert _decode_fields(rows["torchao-h100-llama31-8b-float8wo"])["activations"] == "bf16"
    assert _decode_fields(rows["torchao-h100-llama31-8b-float8dq-tensor"])["activations"] == "auto"
