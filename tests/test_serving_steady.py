"""memsim.serve: the steady state of continuous batching against closed forms (Little's law),
monotonicity in the prompt length, and the validation rows it predicts."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import memsim
from memsim.serving import serve
from memsim.validate import default_folder, load_measurements, predict

DEVICE, MODEL = "h100-sxm", "llama-3.2-1b"


def test_without_prompts_the_steady_state_is_plain_decode_at_the_concurrency():
    state = serve(DEVICE, MODEL, input_tokens=0, output_tokens=256, concurrency=32)
    plain = memsim.emulate(DEVICE, MODEL, memsim.Decode(batch=32, context=127))
    assert [(s.kind, s.share, s.decode_sequences) for s in state.steps] == [("decode", 1.0, 32)]
    assert state.step_time_s == plain.time_per_step
    assert state.inter_token_latency_s == plain.time_per_step
    assert state.output_tokens_per_s == pytest.approx(32 / plain.time_per_step, rel=1e-12)
    assert state.output_tokens_per_s == pytest.approx(plain.tokens_per_s_total, rel=1e-12)


@pytest.mark.parametrize("inputs, outputs, clients, budget", [
    (512, 128, 16, None),        # one prompt at a time, whole in one step
    (128, 64, 200, None),        # prompts overlap: every step carries some
    (3000, 500, 8, 1024),        # each prompt in three chunks of at most 1024 - 7 tokens
])
def test_little_s_law_gives_the_tokens_of_a_step(inputs, outputs, clients, budget):
    state = serve(DEVICE, MODEL, input_tokens=inputs, output_tokens=outputs,
                  concurrency=clients, token_budget=budget)
    n, rate = state.live_sequences, state.requests_per_step
    assert n == clients
    assert n == pytest.approx(rate * (state.prompt_steps + outputs - 1), rel=1e-12)
    assert sum(s.share for s in state.steps) == pytest.approx(1.0, rel=1e-12)
    assert state.decode_sequences_per_step == pytest.approx(rate * (outputs - 1), rel=1e-2)
    assert state.prompt_tokens_per_step == pytest.approx(rate * inputs, rel=1e-12)
    assert state.output_tokens_per_s == pytest.approx(
        state.output_tokens_per_step / state.step_time_s, rel=1e-12)
    if budget is None:          # each prompt in one step: C output tokens, C x I / O prompt
        assert state.output_tokens_per_step == pytest.approx(clients, rel=1e-12)
        assert state.prompt_tokens_per_step == pytest.approx(clients * inputs / outputs,
                                                             rel=1e-12)
    else:
        chunks = math.ceil(inputs / (budget - (clients - 1)))
        assert state.prompt_steps == chunks
        prompts = [s for s in state.steps if s.kind == "chunk"]
        assert [s.prompt_context for s in prompts] == [j * (budget - clients + 1)
                                                       for j in range(chunks)]
        assert sum(s.prompt_tokens for s in prompts) == inputs
        assert all(s.decode_sequences + s.prompt_tokens <= budget for s in state.steps)


def test_a_binding_budget_fills_every_step_and_queues_prompts():
    state = serve(DEVICE, MODEL, input_tokens=2048, output_tokens=16, concurrency=256,
                  token_budget=2048)
    (step,) = state.steps
    assert step.decode_sequences + step.prompt_tokens == pytest.approx(2048, abs=2)
    assert state.requests_per_step == pytest.approx(2048 / (16 - 1 + 2048), rel=1e-12)
    assert state.prompt_steps > 1                  # prompts wait for room
    assert state.live_sequences == 256


def test_the_inter_token_latency_weighs_each_step_by_its_decodes():
    state = serve(DEVICE, MODEL, input_tokens=1024, output_tokens=64, concurrency=8)
    steps = state.steps
    expected = (sum(s.share * s.decode_sequences * s.time_s for s in steps)
                / sum(s.share * s.decode_sequences for s in steps))
    assert state.inter_token_latency_s == pytest.approx(expected, rel=1e-12)
    assert state.tokens_per_s_per_user == pytest.approx(1 / expected, rel=1e-12)
    chunk = next(s for s in steps if s.kind == "chunk")
    assert state.time_to_first_token_s == chunk.time_s     # admitted at once, one step


def test_prefill_first_stalls_the_decodes():
    mixed = serve(DEVICE, MODEL, input_tokens=1024, output_tokens=64, concurrency=8)
    first = serve(DEVICE, MODEL, input_tokens=1024, output_tokens=64, concurrency=8,
                  scheduling="prefill-first")
    assert [s.kind for s in first.steps] == ["prefill", "decode"]
    # one prefill step per 63 x 1 / 8 decode steps (each gives all 8 sequences a token)
    assert first.requests_per_step == pytest.approx(1 / (1 + 63 / 8), rel=1e-12)
    prefill, decode = first.steps
    # the 7 sequences already decoding wait out the prefill once per 63 / 8 decode steps
    assert first.inter_token_latency_s == pytest.approx(
        decode.time_s + 7 * prefill.time_s / (63 / 8 * 8), rel=1e-12)
    assert first.time_to_first_token_s == prefill.time_s
    assert prefill.prompt_tokens == 1024 and mixed.steps[0].prompt_tokens == 1024


def test_requests_beyond_the_engine_wait_in_a_queue():
    alone = serve(DEVICE, MODEL, input_tokens=256, output_tokens=64, concurrency=16)
    capped = serve(DEVICE, MODEL, input_tokens=256, output_tokens=64, concurrency=32,
                   max_batch=16)
    assert capped.live_sequences == 16
    assert capped.output_tokens_per_s == pytest.approx(alone.output_tokens_per_s, rel=1e-12)
    queued = 16 / alone.requests_per_step * alone.step_time_s
    assert capped.time_to_first_token_s == pytest.approx(alone.time_to_first_token_s + queued,
                                                         rel=1e-12)


@pytest.mark.parametrize("fields, field", [
    (dict(token_budget=8), "token_budget"),
    (dict(scheduling="fcfs"), "scheduling"),
    (dict(batch=4), "batch"),
    (dict(output_tokens=0), "output_tokens"),
    (dict(concurrency=True), "concurrency"),
    (dict(weigths="fp8-e4m3"), "weigths"),
])
def test_bad_requests_name_their_field(fields, field):
    request = {**dict(input_tokens=128, output_tokens=64, concurrency=16), **fields}
    with pytest.raises(memsim.ConfigError) as error:
        serve(DEVICE, MODEL, **request)
    assert error.value.field == field


@settings(max_examples=12, deadline=None)
@given(inputs=st.integers(0, 6000), more=st.integers(1, 3000), outputs=st.integers(2, 600),
       clients=st.integers(1, 600), budget=st.sampled_from([None, 1024, 8192]),
       scheduling=st.sampled_from(["mixed", "prefill-first"]))
def test_longer_prompts_never_raise_the_throughput(inputs, more, outputs, clients, budget,
                                                   scheduling):
    budget = None if budget is None else max(budget, clients)
    fields = dict(output_tokens=outputs, concurrency=clients, token_budget=budget,
                  scheduling=scheduling)
    short = serve(DEVICE, MODEL, input_tokens=inputs, **fields)
    long = serve(DEVICE, MODEL, input_tokens=inputs + more, **fields)
    assert long.output_tokens_per_s <= short.output_tokens_per_s * (1 + 1e-9)


def _serving_rows() -> list[dict]:
    return [row for row in load_measurements(default_folder()) if row.get("serving")]


def test_the_repository_has_sourced_serving_rows_at_concurrency_32_and_more():
    rows = _serving_rows()
    assert len(rows) >= 10
    assert all("input_tokens" in row and row["batch"] >= 32 for row in rows)


@pytest.mark.parametrize("row_id", ["nim-h100x2-llama33-70b-fp8-c50",
                                    "trtllm017-h100-llama31-8b-fp8-2048-2048",
                                    "neuron-inf2x4-llama31-8b-bf16-throughput"])
def test_validate_predicts_serving_rows(row_id):
    (row,) = [r for r in _serving_rows() if r["id"] == row_id]
    result = predict(row, default_folder())
    assert result.problem == "" and result.error is not None and result.serving is not None


@pytest.mark.slow
def test_validate_predicts_every_serving_row():
    for row in _serving_rows():
        result = predict(row, default_folder())
        assert result.problem == "" and result.error is not None, row["id"]


def test_a_prompt_of_many_chunks_emulates_a_bounded_number_of_positions():
    state = serve(DEVICE, MODEL, input_tokens=8000, output_tokens=4000, concurrency=4,
                  token_budget=103)
    chunks = [s for s in state.steps if s.kind == "chunk"]
    assert len(chunks) == memsim.serving.MAX_CHUNK_STEPS and "80 chunks" in state.limits
    assert state.prompt_steps == math.ceil(8000 / 100)
    assert sum(s.share for s in chunks) == pytest.approx(
        state.requests_per_step * state.prompt_steps, rel=1e-12)
    assert chunks[-1].prompt_tokens == 8000 - 79 * 100 and chunks[-1].prompt_context == 7900


@pytest.mark.parametrize("scheduling, clients", [("prefill-first", 4), ("mixed", 1),
                                                 ("mixed", 4)])
def test_one_output_token_is_refused_with_its_reason(scheduling, clients):
    """With one output token no token follows the first: no inter-token latency, no decode
    step. It crashed (a division by zero decodes) or invented a decoding sequence."""
    with pytest.raises(memsim.ConfigError, match="no inter-token latency") as info:
        serve("h100-sxm", "llama-3-8b", input_tokens=1024, output_tokens=1,
              concurrency=clients, scheduling=scheduling)
    assert info.value.field == "output_tokens"


@pytest.mark.parametrize("inputs", [10**20, 10**13])
def test_requests_too_long_to_count_name_the_tokens_the_user_gave(inputs):
    """The steps' context is the requests' tokens: its limits were blamed on `context`, a
    field serve sets itself."""
    with pytest.raises(memsim.ConfigError) as info:
        serve("h100-sxm", "llama-3-8b", input_tokens=inputs, output_tokens=4, concurrency=2)
    assert info.value.field == "input_tokens"
