import math

import pytest

from ito_assets.manifest.strict_json import StrictJsonError, loads_strict


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": 1, "a": 2}',
        b'{"a": {"b": 1, "b": 1}}',
        b'{"a": [{"c": 1, "c": 2}]}',
        b'{"a": NaN}',
        b'{"a": Infinity}',
        b'{"a": -Infinity}',
        b'\xef\xbb\xbf{"a": 1}',
        b'{"a": 1} x',
        b'{"a": 1}{"b": 2}',
        b'{"a": "\xff"}',
        b"",
        b"[" * 40 + b"]" * 40,
    ],
    ids=["dup-top", "dup-nested", "dup-in-list", "nan", "inf", "neg-inf", "bom", "trailing", "two-docs",
         "bad-utf8", "empty", "too-deep"],
)
def test_refused(raw):
    with pytest.raises(StrictJsonError):
        loads_strict(raw)


def test_accepts_one_document_with_surrounding_whitespace():
    assert loads_strict(b'\n {"a": [1, 2.5, "x"]} \n') == {"a": [1, 2.5, "x"]}


def test_large_numbers_stay_finite():
    value = loads_strict(b'{"a": 1e308}')["a"]
    assert math.isfinite(value)


def test_error_never_carries_input():
    with pytest.raises(StrictJsonError) as info:
        loads_strict(b'{"secret-canary-xyz": 1, "secret-canary-xyz": 2}')
    assert "canary" not in str(info.value)


@pytest.mark.parametrize("text", ["1e400", "-1e400", "[1.8e308]", '{"a": 2e308}'])
def test_a_float_past_a_doubles_range_is_refused_like_infinity(text) -> None:
    with pytest.raises(StrictJsonError, match="out of a double's range"):
        loads_strict(text.encode())


@pytest.mark.parametrize(("text", "value"), [("1.7976931348623157e308", 1.7976931348623157e308),
                                              ("-1.7976931348623157e308", -1.7976931348623157e308),
                                              ("1e-400", 0.0), ("0.1", 0.1)])
def test_the_largest_double_and_underflow_to_zero_are_kept(text, value) -> None:
    assert loads_strict(text.encode()) == value
