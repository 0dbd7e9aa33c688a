"""Tests of memsim.formats: exact storage cost of every format against closed forms.

The closed forms below are written out from each format's published layout (the brief, the OCP MX
spec, ggml-common.h, GPTQ/AWQ), not read back from ``memsim.formats``, so a change in the library's
table shows up here as a failure.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import memsim
from memsim import ConfigError, bytes_for, get_format
from memsim.testing import examples

# name -> (payload bits per element, elements per group along K (0: one group per row,
#          None: no groups), metadata bits per group, ragged last group stored whole,
#          metadata bits per tensor)
SPEC: dict[str, tuple[int, int | None, int, bool, int]] = {
    "fp32": (32, None, 0, False, 0),
    "bf16": (16, None, 0, False, 0),
    "fp16": (16, None, 0, False, 0),
    "fp8-e4m3": (8, None, 0, False, 32),        # one FP32 scale per tensor
    "fp8-e5m2": (8, None, 0, False, 32),
    "fp8-e4m3-b128": (8, 128, 32, False, 0),    # FP32 scale per 1x128 block
    "mxfp8": (8, 32, 8, True, 0),               # E8M0 scale per 32
    "int8": (8, 0, 16, False, 0),               # FP16 scale per output row
    "int4-g32": (4, 32, 20, False, 0),          # FP16 scale + 4-bit zero per group
    "int4-g64": (4, 64, 20, False, 0),
    "int4-g128": (4, 128, 20, False, 0),
    "nvfp4": (4, 16, 8, True, 32),              # FP8 scale per 16 + FP32 per tensor
    "mxfp4": (4, 32, 8, True, 0),               # E8M0 scale per 32
    "q8_0": (8, 32, 16, True, 0),               # 34 B per block of 32
    "q4_0": (4, 32, 16, True, 0),               # 18 B per block of 32
    "q5_0": (5, 32, 16, True, 0),               # 22 B per block of 32: d + qh[4] + qs[16]
    "q5_1": (5, 32, 32, True, 0),               # 24 B per block of 32: d, m + qh[4] + qs[16]
    # K-quants, 256 weights per super-block (ggml-common.h, QK_K = 256); the metadata is
    # everything in the struct but the packed values
    "q4_k": (4, 256, (144 - 128) * 8, True, 0),  # d, dmin + scales[12] + qs[128] = 144 B
    "q5_k": (5, 256, (176 - 160) * 8, True, 0),  # d, dmin + scales[12] + qh[32] + qs[128]
    "q6_k": (6, 256, (210 - 192) * 8, True, 0),  # ql[128] + qh[64] + scales[16] + d = 210 B
}

NAMES = sorted(SPEC)


def spec_bits(name: str, rows: int, k: int) -> int:
    """Storage of a (rows, k) tensor in bits, from the written-out spec."""
    element_bits, group, meta, padded, tensor_meta = SPEC[name]
    if rows == 0 or k == 0:
        return 0
    if group is None:
        return rows * k * element_bits + tensor_meta
    g = k if group == 0 else group
    groups = math.ceil(k / g)
    payload = groups * g if padded else k
    return rows * (payload * element_bits + groups * meta) + tensor_meta


def spec_bpw(name: str, k: int) -> Fraction:
    """Bits per element of a row of length k that the groups divide, tensor metadata excluded."""
    element_bits, group, meta, _, _ = SPEC[name]
    if group is None:
        return Fraction(element_bits)
    return element_bits + Fraction(meta, k if group == 0 else group)


def test_every_format_has_a_spec():
    assert set(memsim.FORMATS) == set(SPEC)


# --- exact closed forms on a shape that divides ----------------------------------------------

E = 4096 * 4096

SQUARE_CASES = [
    ("fp32", 4 * E),
    ("bf16", 2 * 4096 * 4096),
    ("fp16", 2 * E),
    ("fp8-e4m3", E + 4),
    ("fp8-e5m2", E + 4),
    ("fp8-e4m3-b128", E + 4096 * (4096 // 128) * 4),
    ("mxfp8", E + E // 32),
    ("int8", 4096 * 4096 + 4096 * 2),
    ("int4-g32", E // 2 + 4096 * (4096 // 32) * 20 // 8),
    ("int4-g64", E // 2 + 4096 * (4096 // 64) * 20 // 8),
    ("int4-g128", 4096 * 4096 // 2 + 4096 * (4096 // 128) * 20 // 8),
    ("nvfp4", E // 2 + E // 16 + 4),
    ("mxfp4", E // 2 + E // 32),
    ("q8_0", E // 32 * 34),
    ("q4_0", E // 32 * 18),
    ("q5_0", E // 32 * 22),
    ("q5_1", E // 32 * 24),
    ("q4_k", E // 256 * 144),
    ("q5_k", E // 256 * 176),
    ("q6_k", E // 256 * 210),
]


@pytest.mark.parametrize(("name", "expected"), SQUARE_CASES)
def test_bytes_for_square_matrix(name, expected):
    assert bytes_for((4096, 4096), name) == expected


def test_closed_form_table_covers_every_format():
    assert {name for name, _ in SQUARE_CASES} == set(memsim.FORMATS)


def test_bytes_for_accepts_a_format_object_and_leading_axes():
    fmt = get_format("q4_0")
    assert bytes_for((4096, 4096), fmt) == E // 32 * 18
    # every leading axis is a row: (2, 3, 64) is 6 rows of 64
    assert bytes_for((2, 3, 64), "q4_0") == 6 * 2 * 18
    # a 1-D tensor is one row
    assert bytes_for((64,), "int8") == 64 + 2


# --- ragged last group ------------------------------------------------------------------------

def test_int4_g128_ragged_k130():
    # K = 130: two groups of metadata per row; the 130 payload nibbles are not padded
    per_row_bits = 130 * 4 + 2 * 20
    assert bytes_for((1, 130), "int4-g128") == math.ceil(per_row_bits / 8) == 70
    assert bytes_for((3, 130), "int4-g128") == math.ceil(3 * per_row_bits / 8) == 210
    # an odd total of nibbles rounds up to a whole byte
    assert bytes_for((1, 129), "int4-g128") == math.ceil((129 * 4 + 2 * 20) / 8) == 70
    assert bytes_for((1, 131), "int4-g128") == math.ceil((131 * 4 + 2 * 20) / 8) == 71


@pytest.mark.parametrize(("name", "block_bytes"), [("q4_k", 144), ("q5_k", 176), ("q6_k", 210)])
def test_k_quant_ragged_last_super_block_is_stored_whole(name, block_bytes):
    assert bytes_for((1, 256), name) == block_bytes
    assert bytes_for((1, 257), name) == 2 * block_bytes
    assert bytes_for((3, 100), name) == 3 * block_bytes
    assert bytes_for((7, 4096 + 1), name) == 7 * 17 * block_bytes
    assert bytes_for((7, 4096 + 1), name) > bytes_for((7, 4096), name)


def test_q4_0_ragged_k33_stores_two_whole_blocks():
    assert bytes_for((1, 33), "q4_0") == 2 * 18
    assert bytes_for((5, 33), "q4_0") == 5 * 2 * 18
    assert bytes_for((5, 64), "q4_0") == 5 * 2 * 18
    assert bytes_for((5, 65), "q4_0") == 5 * 3 * 18


@pytest.mark.parametrize(("name", "k", "expected_per_row"), [
    ("q8_0", 33, 2 * 34),
    ("mxfp4", 33, 2 * 17),            # 16 B payload + 1 B scale per 32
    ("mxfp8", 40, 2 * 33),
    ("nvfp4", 17, 2 * 9),             # 8 B payload + 1 B scale per 16 (+ 4 B per tensor below)
    ("fp8-e4m3-b128", 130, 130 + 2 * 4),
    ("int8", 130, 130 + 2),
])
def test_ragged_rows(name, k, expected_per_row):
    rows = 4
    tensor = 4 if name == "nvfp4" else 0
    assert bytes_for((rows, k), name) == rows * expected_per_row + tensor


def test_empty_tensor_costs_nothing():
    for name in NAMES:
        assert bytes_for((0, 4096), name) == 0
        assert bytes_for((4096, 0), name) == 0


# --- bits per element -------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "bpw"), [
    ("int4-g128", 4.15625),
    ("int4-g64", 4.3125),
    ("int4-g32", 4.625),
    ("nvfp4", 4.5),
    ("mxfp4", 4.25),
    ("mxfp8", 8.25),
    ("q8_0", 8.5),
    ("q4_0", 4.5),
    ("q5_0", 5.5),
    ("q5_1", 6),
    ("q4_k", 4.5),
    ("q5_k", 5.5),
    ("q6_k", 6.5625),
    ("bf16", 16),
    ("fp16", 16),
    ("fp32", 32),
    ("fp8-e4m3", 8),
    ("fp8-e5m2", 8),
    ("fp8-e4m3-b128", 8.25),
    ("int8", 8 + 16 / 4096),
])
def test_bits_per_element(name, bpw):
    assert get_format(name).bits_per_element() == bpw
    assert get_format(name).bits_per_element(4096) == bpw


def test_bits_per_element_int8_depends_on_row_length():
    assert get_format("int8").bits_per_element(8192) == 8 + 16 / 8192
    assert get_format("int8").bits_per_element(128) == 8.125


def test_bits_per_element_counts_a_padded_block():
    # q4_0 at K = 33 stores 64 nibbles and two scales for 33 elements
    assert get_format("q4_0").bits_per_element(33) == (64 * 4 + 2 * 16) / 33


# --- kernel parameters ------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "k", "expected"), [
    ("bf16", 4096, (16, 0, 0, 0, 0)),
    ("fp32", 4096, (32, 0, 0, 0, 0)),
    ("fp8-e4m3", 4096, (8, 0, 0, 0, 32)),
    ("fp8-e4m3-b128", 4096, (8, 128, 32, 0, 0)),
    ("mxfp8", 4096, (8, 32, 8, 1, 0)),
    ("int8", 4096, (8, 4096, 16, 0, 0)),
    ("int8", 130, (8, 130, 16, 0, 0)),
    ("int4-g128", 4096, (4, 128, 20, 0, 0)),
    ("int4-g32", 7, (4, 32, 20, 0, 0)),
    ("nvfp4", 4096, (4, 16, 8, 1, 32)),
    ("mxfp4", 4096, (4, 32, 8, 1, 0)),
    ("q8_0", 4096, (8, 32, 16, 1, 0)),
    ("q4_0", 4096, (4, 32, 16, 1, 0)),
    ("q4_k", 4096, (4, 256, 128, 1, 0)),
    ("q5_k", 4096, (5, 256, 128, 1, 0)),
    ("q6_k", 4096, (6, 256, 144, 1, 0)),
    ("q6_k", 100, (6, 256, 144, 1, 0)),
])
def test_kernel_params(name, k, expected):
    params = get_format(name).kernel_params(k)
    assert params == expected
    assert all(type(p) is int for p in params)


def _bits_from_kernel_params(params: tuple[int, int, int, int, int], rows: int, k: int) -> int:
    """What a kernel computes from the plain integers: the cost of ``rows`` rows of length k."""
    element_bits, group, meta, padded, tensor_meta = params
    if group == 0:
        row = k * element_bits
    else:
        groups = -(-k // group)
        row = (groups * group if padded else k) * element_bits + groups * meta
    return rows * row + tensor_meta


@settings(max_examples=examples(60))
@given(name=st.sampled_from(NAMES), rows=st.integers(1, 64), k=st.integers(1, 1000))
def test_kernel_params_reproduce_bytes_for(name, rows, k):
    bits = _bits_from_kernel_params(get_format(name).kernel_params(k), rows, k)
    assert -(-bits // 8) == bytes_for((rows, k), name) == math.ceil(spec_bits(name, rows, k) / 8)


# --- properties -------------------------------------------------------------------------------

@settings(max_examples=examples(80))
@given(name=st.sampled_from(NAMES), rows=st.integers(0, 300), k=st.integers(0, 700),
       more_rows=st.integers(0, 40), more_k=st.integers(0, 200))
def test_monotonic_in_elements(name, rows, k, more_rows, more_k):
    base = bytes_for((rows, k), name)
    assert bytes_for((rows + more_rows, k), name) >= base
    assert bytes_for((rows, k + more_k), name) >= base
    assert bytes_for((rows + more_rows, k + more_k), name) >= base


@settings(max_examples=examples(80))
@given(name=st.sampled_from(NAMES), rows=st.integers(0, 300), k=st.integers(0, 700))
def test_matches_spec_on_any_shape(name, rows, k):
    assert bytes_for((rows, k), name) == math.ceil(spec_bits(name, rows, k) / 8)


@settings(max_examples=examples(80))
@given(name=st.sampled_from(NAMES), row_blocks=st.integers(1, 40), k_groups=st.integers(1, 40),
       k_any=st.integers(1, 600))
def test_exact_for_shapes_that_divide(name, row_blocks, k_groups, k_any):
    _, group, _, _, tensor_meta = SPEC[name]
    rows = 8 * row_blocks                           # whole bytes whatever the format
    k = k_any if group in (None, 0) else k_groups * group
    bpw = spec_bpw(name, k)
    assert get_format(name).bits_per_element(k) == float(bpw)
    assert Fraction(bytes_for((rows, k), name) * 8) == rows * k * bpw + tensor_meta


@settings(max_examples=examples(80))
@given(name=st.sampled_from(NAMES), rows=st.integers(0, 300), k=st.integers(0, 700))
def test_never_below_the_payload(name, rows, k):
    element_bits = SPEC[name][0]
    assert bytes_for((rows, k), name) * 8 >= rows * k * element_bits


@settings(max_examples=examples(60))
@given(n=st.integers(8, 4096), rows=st.integers(1, 64), k=st.integers(1, 5000))
def test_int4_any_group_size(n, rows, k):
    fmt = get_format(f"int4-g{n}")
    assert fmt.name == f"int4-g{n}"
    assert fmt.group == n
    groups = math.ceil(k / n)
    assert bytes_for((rows, k), f"int4-g{n}") == math.ceil(rows * (4 * k + 20 * groups) / 8)
    assert fmt.bits_per_element(n) == (4 * n + 20) / n   # one group of n inputs: exact


# --- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["int5", "INT8", "bf-16", "int4-g7", "int4-g0", "int4-g", "",
                                  "int4-g0128", "nvfp4 ", "Q4_K", "q4_k_m", "q4_K"])
def test_unknown_format(name):
    with pytest.raises(ConfigError) as info:
        bytes_for((4, 4), name)
    assert info.value.field == "format"
    assert repr(name) in str(info.value)
    assert "int4-g128" in str(info.value)      # the message lists what is valid


def test_unknown_format_names_the_callers_field_and_file():
    with pytest.raises(ConfigError) as info:
        get_format("fp7", field="workload.weights", file="sweep.toml")
    assert info.value.field == "workload.weights"
    assert info.value.file == "sweep.toml"
    assert str(info.value).startswith("sweep.toml: workload.weights: ")


@pytest.mark.parametrize("value", [None, 8, 4.5])
def test_format_name_must_be_a_string(value):
    with pytest.raises(ConfigError):
        get_format(value)


@pytest.mark.parametrize("shape", [(), (4, -1), (-2, 4), (4, 1.5), (True, 4)])
def test_bad_shape(shape):
    with pytest.raises(ConfigError) as info:
        bytes_for(shape, "bf16")
    assert info.value.field == "shape"


@pytest.mark.parametrize("name", ["int4-g99999999999999999999", "int4-g1048577",
                                  "int4-g" + "9" * 5000, "int4-g18446744073709551616"])
def test_group_beyond_the_bound_names_the_field_and_the_limit(name):
    with pytest.raises(ConfigError) as info:
        get_format(name, field="weights")
    assert info.value.field == "weights"
    assert "1048576" in str(info.value) and "2**20" in str(info.value)
    assert len(str(info.value)) < 200                  # one line, the name cut short


def test_group_at_the_bound_is_a_format():
    fmt = get_format("int4-g1048576")
    assert fmt.group == 2**20 == memsim.formats.MAX_GROUP
    assert bytes_for((2, 2**20 + 1), fmt) == math.ceil(2 * (4 * (2**20 + 1) + 2 * 20) / 8)


def test_k_quant_sources_cite_ggml_common():
    for name in ("q4_k", "q5_k", "q6_k", "q5_0", "q5_1"):
        assert "ggml-common.h" in get_format(name).source
