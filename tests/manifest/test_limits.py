"""The manifest reader's limits at their boundaries: the size bound (secure_read), the nesting
bound and refusals (strict_json), every numeric and length range of the schema (exactly at the
limit accepted, one step past it refused), huge integers, and verify.py's reports, each with its
exact ErrorCode and message."""

from __future__ import annotations

import hashlib
import json
import re
import math
import os
from pathlib import Path

import pytest

from helpers import valid_manifest, write_file, write_manifest
from ito_assets.digests import Digest
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest import secure_read
from ito_assets.manifest.schema import is_digest_field
from ito_assets.manifest.secure_read import DEFAULT_MAX_BYTES, ManifestBytes, read_manifest_bytes
from ito_assets.manifest.strict_json import StrictJsonError, loads_strict
from ito_assets.manifest.verify import (
    VerifiedManifest,
    check_expected_digest,
    parse_manifest,
    provenance_problems,
    require_provenance,
    summarize,
    verify_manifest,
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return Path(os.path.realpath(tmp_path))  # the reader refuses symlinked parents


def _raw(data: bytes) -> ManifestBytes:
    return ManifestBytes(data=data, sha256_hex=hashlib.sha256(data).hexdigest())


def _padded(size: int) -> bytes:
    """A valid manifest padded with trailing whitespace (allowed around the document) to `size`."""
    text = json.dumps(valid_manifest()).encode()
    assert len(text) < size
    return text + b" " * (size - len(text) - 1) + b"\n"


def _error(fn, *args, **kwargs) -> ItoError:
    with pytest.raises(ItoError) as info:
        fn(*args, **kwargs)
    return info.value


# --- the size bound -------------------------------------------------------------------------------


def test_a_file_of_exactly_the_default_maximum_is_read(root: Path):
    data = _padded(DEFAULT_MAX_BYTES)
    assert len(data) == 256 * 1024
    got = read_manifest_bytes(write_file(root / "m.json", data))
    assert got.data == data and got.size == DEFAULT_MAX_BYTES
    assert got.sha256_hex == hashlib.sha256(data).hexdigest()


def test_one_byte_over_the_default_maximum_is_refused(root: Path):
    err = _error(read_manifest_bytes, write_file(root / "m.json", _padded(DEFAULT_MAX_BYTES + 1)))
    assert err.code is ErrorCode.MANIFEST_TOO_LARGE
    assert err.message == "the manifest exceeds the size limit"


def test_verify_reads_exactly_the_maximum_and_refuses_one_byte_more(root: Path):
    verified = verify_manifest(write_file(root / "a.json", _padded(DEFAULT_MAX_BYTES)))
    assert verified.raw.size == DEFAULT_MAX_BYTES and verified.manifest.name == "unit-test"
    err = _error(verify_manifest, write_file(root / "b.json", _padded(DEFAULT_MAX_BYTES + 1)))
    assert err.code is ErrorCode.MANIFEST_TOO_LARGE


def test_verify_passes_its_own_limit_to_the_reader(root: Path):
    data = _padded(4096)
    path = write_file(root / "m.json", data)
    assert verify_manifest(path, max_bytes=4096).raw.data == data
    assert _error(verify_manifest, path, max_bytes=4095).code is ErrorCode.MANIFEST_TOO_LARGE


@pytest.mark.parametrize("limit", [0, 1, 64, 65536, 65537])
def test_size_limit_boundary_for_any_limit(root: Path, limit: int):
    exact = write_file(root / "exact.json", b"x" * limit)
    assert read_manifest_bytes(exact, max_bytes=limit).size == limit
    over = write_file(root / "over.json", b"x" * (limit + 1))
    assert _error(read_manifest_bytes, over, max_bytes=limit).code is ErrorCode.MANIFEST_TOO_LARGE


def _record_reads(monkeypatch) -> list[int]:
    real_read, asked = os.read, []

    def read(fd: int, n: int) -> bytes:
        asked.append(n)
        return real_read(fd, n)

    monkeypatch.setattr(secure_read.os, "read", read)
    return asked


@pytest.mark.parametrize(
    "size,limit,asked",
    [
        (DEFAULT_MAX_BYTES, DEFAULT_MAX_BYTES, [65536, 65536, 65536, 65536, 1]),
        (10, DEFAULT_MAX_BYTES, [65536, 65536]),
        (64, 64, [65, 1]),
        (0, 64, [65]),
        (65536, 65536, [65536, 1]),
        (65537, 65537, [65536, 2, 1]),  # a short read of 1: one more read meets the end
    ],
)
def test_reads_ask_for_at_most_one_byte_past_the_limit(root: Path, monkeypatch, size, limit, asked):
    path = write_file(root / "m.json", b"y" * size)
    calls = _record_reads(monkeypatch)
    assert read_manifest_bytes(path, max_bytes=limit).size == size
    assert calls == asked
    assert sum(calls) <= limit + 1 + 65536  # bounded by the limit, never by the file


def _grows_before_the_first_read(monkeypatch, path: str, extra: bytes) -> list[int]:
    """Append `extra` to the file after fstat, just before the first read; -> the sizes asked for."""
    real_read, asked = os.read, []

    def read(fd: int, n: int) -> bytes:
        if not asked:
            with open(path, "ab") as fh:
                fh.write(extra)
        asked.append(n)
        return real_read(fd, n)

    monkeypatch.setattr(secure_read.os, "read", read)
    return asked


def test_growth_to_one_byte_past_the_limit_is_too_large(root: Path, monkeypatch):
    """fstat saw 63 bytes; the file grows by 2 before the reads: exactly limit + 1 bytes are read."""
    path = write_file(root / "m.json", b"z" * 63)
    asked = _grows_before_the_first_read(monkeypatch, path, b"zz")
    assert _error(read_manifest_bytes, path, max_bytes=64).code is ErrorCode.MANIFEST_TOO_LARGE
    assert asked == [65]


def test_growth_to_exactly_the_limit_is_a_change_not_too_large(root: Path, monkeypatch):
    path = write_file(root / "m.json", b"z" * 63)
    _grows_before_the_first_read(monkeypatch, path, b"z")
    err = _error(read_manifest_bytes, path, max_bytes=64)
    assert err.code is ErrorCode.MANIFEST_CHANGED and err.message == "the manifest changed while it was read"


# --- strict JSON --------------------------------------------------------------------------------


def _nested(depth: int, kind: str) -> bytes:
    if kind == "list":
        return b"[" * depth + b"1" + b"]" * depth
    if kind == "empty-list":
        return b"[" * depth + b"]" * depth
    if kind == "empty-dict":
        return b'{"a": ' * (depth - 1) + b"{}" + b"}" * (depth - 1)
    return b'{"a": ' * depth + b"1" + b"}" * depth


@pytest.mark.parametrize("kind", ["list", "empty-list", "dict", "empty-dict"])
def test_nesting_of_exactly_32_is_accepted_33_refused(kind):
    assert loads_strict(_nested(32, kind)) is not None
    with pytest.raises(StrictJsonError) as info:
        loads_strict(_nested(33, kind))
    assert str(info.value) == "nesting is too deep"


def test_depth_counts_containers_not_scalars():
    from ito_assets.manifest.strict_json import _depth

    assert _depth(1) == 0 and _depth("x") == 0
    assert _depth([]) == 1 and _depth({}) == 1 and _depth([1]) == 1 and _depth({"a": 1}) == 1
    assert _depth([[], [[]]]) == 3 and _depth({"a": [1], "b": {"c": {}}}) == 3
    assert _depth([[[1]]] * 2 + [1]) == 3
    # Past the bound it stops descending: the answer is just "more than 32".
    assert _depth(json.loads(_nested(500, "list"))) == 33


def test_the_deepest_nesting_in_a_manifest_is_reported_as_invalid(root: Path):
    document = valid_manifest()
    document["model"]["surprise"] = json.loads(_nested(31, "list"))  # 33 levels with the root and model
    err = _error(verify_manifest, write_manifest(root / "m.json", document))
    assert err.code is ErrorCode.MANIFEST_INVALID
    assert err.message == "the manifest is not strict JSON: nesting is too deep"


@pytest.mark.parametrize(
    "raw,message",
    [
        (b'{"a": 1, "a": 2}', "duplicate object key"),
        (b'{"a": NaN}', "NaN and Infinity are not JSON numbers"),
        (b'{"a": -Infinity}', "NaN and Infinity are not JSON numbers"),
        (b'\xef\xbb\xbf{"a": 1}', "a byte order mark is not allowed"),
        (b'{"a": "\xff"}', "not valid UTF-8"),
        (b'{"a": 1} x', "not a single well-formed JSON document"),
        (b"", "not a single well-formed JSON document"),
        (b"[" * 100_000, "not a single well-formed JSON document"),  # RecursionError inside json
    ],
    ids=["duplicate", "nan", "neg-inf", "bom", "utf8", "trailing", "empty", "recursion"],
)
def test_strict_json_refusals_have_exact_messages(raw, message):
    with pytest.raises(StrictJsonError) as info:
        loads_strict(raw)
    assert str(info.value) == message
    err = _error(parse_manifest, _raw(raw))
    assert err.code is ErrorCode.MANIFEST_INVALID
    assert err.message == f"the manifest is not strict JSON: {message}"


def test_a_bom_in_the_middle_is_just_whitespace_trouble_not_a_bom():
    with pytest.raises(StrictJsonError) as info:
        loads_strict(b' \xef\xbb\xbf{"a": 1}')
    assert str(info.value) == "not a single well-formed JSON document"


def test_duplicate_keys_only_within_one_object():
    assert loads_strict(b'{"a": {"b": 1}, "c": {"b": 2}}') == {"a": {"b": 1}, "c": {"b": 2}}
    assert loads_strict(b'[{"a": 1}, {"a": 2}]') == [{"a": 1}, {"a": 2}]


# --- schema ranges ------------------------------------------------------------------------------


def _at(document: dict, path: tuple, value) -> dict:
    target = document
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return document


def _verdict(document) -> ItoError | None:
    try:
        parse_manifest(_raw(json.dumps(document).encode()))
    except ItoError as err:
        return err
    return None


def _judged(document: dict, location: str | None) -> None:
    """Accepted where `location` is None; else refused as MANIFEST_INVALID naming exactly it."""
    err = _verdict(document)
    if location is None:
        assert err is None, err
        return
    assert err is not None and err.code is ErrorCode.MANIFEST_INVALID
    assert err.message == f"the manifest does not match the schema at: {location}"


def _with(**top) -> dict:
    document = valid_manifest()
    document.update(top)
    return document


BELOW_0 = math.nextafter(0.0, -1.0)
ABOVE_0 = math.nextafter(0.0, 1.0)
BELOW_1 = math.nextafter(1.0, 0.0)

# field path -> (accepted values, refused values, the location reported)
RANGES = {
    "num_parameters": (("model", "num_parameters"), [1, 10**13], [0, -1, 10**13 + 1], "model.num_parameters"),
    "model.size": (("model", "size"), ["a", "a" * 128, "A0._-"], ["", "a" * 129, "-a", "a b"], "model.size"),
    "ngram_size": (("data", 0, "decontamination", "ngram_size"), [4, 50], [3, 51], "data.0.decontamination.ngram_size"),
    "uri": (("data", 0, "uri"), ["dataroot://" + "a" * 2037, "file:///x", "dataroot://x"],
            ["dataroot://" + "a" * 2038, "dataroot://", "dataroot://a b", "file://x"], "data.0.uri"),
    "sha256": (("data", 0, "sha256"), ["f" * 64], ["f" * 63, "f" * 65, "F" * 64], "data.0.sha256"),
    "eval_suite_sha256": (("data", 0, "decontamination", "eval_suite_sha256"), ["sha256:" + "0" * 64],
                          ["sha256:" + "0" * 63, "0" * 64], "data.0.decontamination.eval_suite_sha256"),
    "sequence_length": (("training_target", "stages", 0, "sequence_length"), [1], [0], "training_target.stages.0.sequence_length"),
    "cap_cents": (("budget", "cap_cents"), [50000, 10**15], [49999], "budget"),
    "interval_steps": (("checkpoint_policy", "interval_steps"), [1], [0], "checkpoint_policy.interval_steps"),
    "keep_last": (("checkpoint_policy", "keep_last"), [1], [0], "checkpoint_policy.keep_last"),
    "storage_uri": (("checkpoint_policy", "storage_uri"), ["tenant://" + "c" * 2039, "file://x"],
                    ["tenant://" + "c" * 2040, "tenant://", "s3://x"], "checkpoint_policy.storage_uri"),
}
# cap_cents below max_incremental_cents (50000) is the budget's own error, located at "budget";
# a cap that is not a positive integer fails the field itself.
RANGES["cap_cents_floor"] = (("budget", "cap_cents"), [], [0, -1, 50000.0], "budget.cap_cents")


def _locations(message: str) -> list[str]:
    """The locations a schema error names, without the words of a rule across fields."""
    return re.sub(r" \([^)]*\)", "", message.split(": ", 1)[1]).split(", ")


@pytest.mark.parametrize("case", sorted(RANGES))
def test_schema_range_boundaries(case):
    path, accepted, refused, location = RANGES[case]
    for value in accepted:
        assert _verdict(_at(valid_manifest(), path, value)) is None, (case, value)
    for value in refused:
        err = _verdict(_at(valid_manifest(), path, value))
        assert err is not None and err.code is ErrorCode.MANIFEST_INVALID, (case, value)
        assert location in _locations(err.message), (case, value, err.message)


@pytest.mark.parametrize(
    "budget,ok",
    [({"cap_cents": 1, "max_incremental_cents": 1}, True), ({"cap_cents": 2, "max_incremental_cents": 1}, True),
     ({"cap_cents": 1, "max_incremental_cents": 2}, False), ({"cap_cents": 1, "max_incremental_cents": 0}, False),
     ({"cap_cents": 0, "max_incremental_cents": 0}, False),
     ({"cap_cents": 10**15, "max_incremental_cents": 10**15}, True),
     ({"cap_cents": 10**15, "max_incremental_cents": 10**15 + 1}, False),
     ({"cap_cents": 10**15 + 1, "max_incremental_cents": 1}, False)],
)
def test_budget_increment_may_equal_the_cap_but_not_exceed_it(budget, ok):
    err = _verdict(_with(budget=budget))
    assert (err is None) is ok
    if not ok:
        assert err.code is ErrorCode.MANIFEST_INVALID


TOO_LONG = "overlong_cache exceeds max_new_tokens"  # a rule across fields, said in its own words
NO_ROOM = "max_new_tokens - overlong_cache is below 2: an answer and its eos would be penalised as overlong"


@pytest.mark.parametrize(
    "lengths,refused_at",
    [({}, None),
     # L_max 1 or 2 holds no answer and eos before a window of one token: refused at the field.
     ({"max_new_tokens": 1, "overlong_cache": 1}, "post_training.0.rlvr.max_new_tokens"),
     ({"max_new_tokens": 2, "overlong_cache": 1}, "post_training.0.rlvr.max_new_tokens"),
     ({"max_new_tokens": 3, "overlong_cache": 1}, None),
     ({"max_new_tokens": 0, "overlong_cache": 1}, "post_training.0.rlvr.max_new_tokens"),
     ({"max_new_tokens": 2**16, "overlong_cache": 1}, None),
     ({"max_new_tokens": 2**16, "overlong_cache": 2**16 - 2}, None),
     ({"max_new_tokens": 2**16, "overlong_cache": 2**16 - 1}, "post_training.0.rlvr.overlong_cache"),
     ({"max_new_tokens": 2**16 + 1, "overlong_cache": 1}, "post_training.0.rlvr.max_new_tokens"),
     ({"max_new_tokens": 8, "overlong_cache": 0}, "post_training.0.rlvr.overlong_cache"),
     ({"max_new_tokens": 8, "overlong_cache": 1}, None),
     # An answer and its eos (2 tokens) before the window: at, one below and two below the edge.
     ({"max_new_tokens": 8, "overlong_cache": 6}, None),
     ({"max_new_tokens": 8, "overlong_cache": 7}, f"post_training.0.rlvr ({NO_ROOM})"),
     ({"max_new_tokens": 8, "overlong_cache": 8}, f"post_training.0.rlvr ({NO_ROOM})"),
     ({"max_new_tokens": 8, "overlong_cache": 9}, f"post_training.0.rlvr ({TOO_LONG})"),
     ({"max_new_tokens": 3}, f"post_training.0.rlvr ({TOO_LONG})"),  # the default L_cache 4 does not fit: shorten it too
     ({"max_new_tokens": 5}, f"post_training.0.rlvr ({NO_ROOM})"),
     ({"max_new_tokens": 6}, None),
     ({"overlong_cache": 6}, None), ({"overlong_cache": 7}, f"post_training.0.rlvr ({NO_ROOM})"),
     ({"overlong_cache": 9}, f"post_training.0.rlvr ({TOO_LONG})")],
)
def test_rlvr_leaves_an_answer_and_its_eos_before_the_overlong_window(lengths, refused_at):
    err = _verdict(_with(post_training=[{"kind": "rlvr", **lengths}]))
    if refused_at is None:
        assert err is None
        return
    assert err.code is ErrorCode.MANIFEST_INVALID
    assert err.message == f"the manifest does not match the schema at: {refused_at}"


def _target(total: int, *stages: tuple[str, int]) -> dict:
    return {"num_tokens": total, "stages": [{"name": n, "num_tokens": t, "sequence_length": 1} for n, t in stages]}


@pytest.mark.parametrize(
    "target,ok",
    [(_target(1, ("pretraining", 1)), True), (_target(0, ("pretraining", 0)), False),
     (_target(300, ("pretraining", 200), ("mid_training", 100)), True),
     (_target(299, ("pretraining", 200), ("mid_training", 100)), False),
     (_target(301, ("pretraining", 200), ("mid_training", 100)), False),
     (_target(3, ("pretraining", 1), ("mid_training", 1), ("long_context", 1)), True),
     (_target(2, ("pretraining", 1), ("long_context", 1)), True),
     (_target(2, ("mid_training", 1), ("long_context", 1)), True),
     (_target(2, ("long_context", 1), ("mid_training", 1)), False),
     (_target(2, ("pretraining", 1), ("pretraining", 1)), False),
     (_target(0), False),
     (_target(10**15, ("pretraining", 10**15 - 1), ("mid_training", 1)), True),
     (_target(10**15 + 1, ("pretraining", 10**15), ("mid_training", 1)), False)],
)
def test_stage_tokens_add_up_exactly_and_stages_are_ordered(target, ok):
    err = _verdict(_with(training_target=target))
    assert (err is None) is ok
    if not ok:
        assert err.code is ErrorCode.MANIFEST_INVALID
        assert err.message.startswith("the manifest does not match the schema at: training_target")


@pytest.mark.parametrize(
    "field,accepted,refused",
    [("min_improvement_bands", [0.0, 0, 100.0, 100], [BELOW_0, math.nextafter(100.0, 200.0), 101]),
     ("max_regression_bands", [0.0, 100.0], [BELOW_0, math.nextafter(100.0, 200.0)])],
)
def test_eval_gate_bands(field, accepted, refused):
    for value in accepted:
        target = valid_manifest()["training_target"] | {"eval_gate": {field: value}}
        assert _verdict(_with(training_target=target)) is None, value
    for value in refused:
        target = valid_manifest()["training_target"] | {"eval_gate": {field: value}}
        err = _verdict(_with(training_target=target))
        assert err.code is ErrorCode.MANIFEST_INVALID
        assert err.message == f"the manifest does not match the schema at: training_target.eval_gate.{field}"


STEP_RANGES = [
    # kind, field, accepted, refused
    ("sft", "num_epochs", [1], [0]),
    ("sft", "learning_rate", [ABOVE_0, BELOW_1], [0.0, 1.0, BELOW_0]),
    ("dpo", "beta", [ABOVE_0, 10.0, 10], [0.0, math.nextafter(10.0, 11.0)]),
    ("dpo", "label_smoothing", [0.0, math.nextafter(0.5, 0.0)], [BELOW_0, 0.5]),
    ("dpo", "learning_rate", [ABOVE_0, BELOW_1], [0.0, 1.0]),
    ("rlvr", "group_size", [2, 1024], [1, 1025, 10**23]),
    ("rlvr", "clip_eps_low", [ABOVE_0, BELOW_1], [0.0, 1.0]),
    ("rlvr", "clip_eps_high", [ABOVE_0, BELOW_1], [0.0, 1.0]),
    ("rlvr", "max_staleness", [0, 64], [-1, 65]),
    ("rlvr", "max_draws_per_group", [1, 100], [0, 101, 10**23]),
    ("sft", "batch_size", [1, 2**20], [0, 2**20 + 1, 10**23]),
    ("dpo", "batch_size", [1, 2**20], [0, 2**20 + 1, 10**23]),
    ("rlvr", "num_steps", [1, 10**9], [0, 10**9 + 1, 10**23]),
    ("rlvr", "groups_per_step", [1, 2**20], [0, 2**20 + 1, 10**23]),
    # L_max from the default L_cache (4) and an answer and its eos (2) up; L_cache up to the default
    # L_max (8) less those 2: the rule between them is the next test's.
    ("rlvr", "max_new_tokens", [6, 2**16], [0, 2**16 + 1, 10**23]),
    ("rlvr", "overlong_cache", [1, 6], [0, -1, 10**23]),
    ("rlvr", "learning_rate", [ABOVE_0, BELOW_1], [0.0, 1.0]),
]


@pytest.mark.parametrize("kind,field,accepted,refused", STEP_RANGES, ids=[f"{s[0]}.{s[1]}" for s in STEP_RANGES])
def test_post_training_ranges(kind, field, accepted, refused):
    for value in accepted:
        assert _verdict(_with(post_training=[{"kind": kind, field: value}])) is None, value
    for value in refused:
        err = _verdict(_with(post_training=[{"kind": kind, field: value}]))
        assert err.code is ErrorCode.MANIFEST_INVALID, value
        assert err.message == f"the manifest does not match the schema at: post_training.0.{kind}.{field}"


# The eval battery's sizes (`post_training_eval`): at each bound, one past it, and far past it.
EVAL_RANGES = [
    ("num_prompts", [2, 200], [1, 0, -1, 10**3, 10**23]),  # more than 200 only with a larger held-out split
    ("max_new_tokens", [1, 8, 2**16], [0, -1, 2**16 + 1, 10**23]),
    ("held_out_fraction", [0.2, 0.5, 0.999], [0, 0.0, 0.9991, 0.9995, 1, 1.0, -0.2, 1.5, 10**23]),
]


@pytest.mark.parametrize("field,accepted,refused", EVAL_RANGES, ids=[r[0] for r in EVAL_RANGES])
def test_post_training_eval_ranges(field, accepted, refused):
    for value in accepted:
        assert _verdict(_with(post_training_eval={field: value})) is None, value
    for value in refused:
        err = _verdict(_with(post_training_eval={field: value}))
        assert err.code is ErrorCode.MANIFEST_INVALID, value
        assert err.message == f"the manifest does not match the schema at: post_training_eval.{field}"


def test_more_prompts_than_the_held_out_split_holds_make_the_block_invalid():
    """The rule across the block's fields is reported at the block, in its own words; its bounds
    at each field. A split keeps one prompt at least for RLVR to train on: 999 held out at most."""
    assert _verdict(_with(post_training_eval={"num_prompts": 999, "held_out_fraction": 0.999})) is None
    for block, held_out in (({"num_prompts": 201}, 200), ({"num_prompts": 999}, 200),
                            ({"num_prompts": 101, "held_out_fraction": 0.1}, 100),
                            ({"num_prompts": 999, "held_out_fraction": 0.998}, 998)):
        err = _verdict(_with(post_training_eval=block))
        assert err.code is ErrorCode.MANIFEST_INVALID, block
        assert err.message == ("the manifest does not match the schema at: post_training_eval (num_prompts exceeds "
                               f"the {held_out} held-out prompts that held_out_fraction leaves of the battery's 1000)")


@pytest.mark.parametrize(
    "block,refused_at",
    [({}, None), ({"num_prompts": 3, "max_new_tokens": 5}, None),
     ({"num_prompts": "3"}, "post_training_eval.num_prompts"),  # strict: a JSON integer, not a string
     ({"num_prompts": 3.0}, "post_training_eval.num_prompts"),
     ({"max_new_tokens": True}, "post_training_eval.max_new_tokens"),
     ({"num_samples": 8}, "post_training_eval.<unknown key>"),  # an unknown field, not near one
     (None, "post_training_eval"), ([], "post_training_eval")],
)
def test_post_training_eval_is_a_strict_block(block, refused_at):
    err = _verdict(_with(post_training_eval=block))
    if refused_at is None:
        assert err is None
        return
    assert err.code is ErrorCode.MANIFEST_INVALID
    assert err.message == f"the manifest does not match the schema at: {refused_at}"


def test_a_manifest_without_post_training_eval_reads_the_defaults():
    evaluation = parse_manifest(_raw(json.dumps(valid_manifest()).encode())).post_training_eval
    assert (evaluation.num_prompts, evaluation.max_new_tokens) == (200, 8)
    written = parse_manifest(_raw(json.dumps(_with(post_training_eval={"num_prompts": 3})).encode())).post_training_eval
    assert (written.num_prompts, written.max_new_tokens) == (3, 8)  # a field left out keeps its default


@pytest.mark.parametrize(
    "kinds,ok",
    [([], True), (["sft"], True), (["dpo"], True), (["rlvr"], True), (["sft", "dpo"], True), (["sft", "rlvr"], True),
     (["dpo", "rlvr"], True), (["sft", "dpo", "rlvr"], True), (["rlvr", "sft"], False), (["dpo", "dpo"], False),
     (["sft", "rlvr", "dpo"], False)],
)
def test_post_training_is_an_ordered_subset(kinds, ok):
    err = _verdict(_with(post_training=[{"kind": k} for k in kinds]))
    assert (err is None) is ok
    if not ok:
        assert err.message == ("the manifest does not match the schema at: post_training (post_training must be an "
                               "ordered subset of sft, dpo, rlvr)")


def test_data_references_need_distinct_uris_and_digests():
    document = valid_manifest()
    second = json.loads(json.dumps(document["data"][0]))
    second["uri"], second["sha256"] = "dataroot://fixtures/corpora/other.jsonl", "e" * 64
    document["data"].append(second)
    assert _verdict(document) is None
    document["data"][1]["uri"] = document["data"][0]["uri"]
    assert _verdict(document).message == "the manifest does not match the schema at: data (data references must have distinct uris)"
    # Other names for the same bytes: every document twice under one id.
    document["data"][1]["uri"], document["data"][1]["sha256"] = "dataroot://fixtures/corpora/other.jsonl", document["data"][0]["sha256"]
    assert _verdict(document).message == "the manifest does not match the schema at: data (data references must have distinct sha256 digests)"


def _baseline(count: int) -> list[dict]:
    return [{"uri": f"dataroot://baseline/part-{i}.jsonl", "sha256": f"{i:064x}"} for i in range(count)]


@pytest.mark.parametrize(("files", "location"), [
    (_baseline(1), None), (_baseline(64), None),
    ([], "decision_baseline"), (_baseline(65), "decision_baseline"),
    # A field's error names the field and the absent value's branch (None) too.
    ([{"uri": "https://example.com/b.jsonl", "sha256": "a" * 64}], "decision_baseline, decision_baseline.0.uri"),
    ([{"uri": "dataroot://b.jsonl", "sha256": "a" * 63}], "decision_baseline, decision_baseline.0.sha256"),
    ([{"uri": "dataroot://b.jsonl"}], "decision_baseline, decision_baseline.0.sha256"),
])
def test_decision_baseline_bounds(files, location):
    """One to MAX_BASELINE_FILES files, each a data root or file URI with its 64 hex digits."""
    _judged(_with(decision_baseline=files), location)


def test_decision_baseline_files_are_distinct_and_a_manifest_without_them_is_unbound():
    assert parse_manifest(_raw(json.dumps(valid_manifest()).encode())).decision_baseline is None
    twice = _baseline(2)
    twice[1]["uri"] = twice[0]["uri"]
    assert _verdict(_with(decision_baseline=twice)).message == (
        "the manifest does not match the schema at: decision_baseline (decision_baseline files must have distinct uris)")


@pytest.mark.parametrize(
    "decision,location",
    [({"accepted_verdicts": ["NO_GO"], "reason": "r", "reviewed_by": "x"}, None),
     ({"accepted_verdicts": ["NO_GO", "WITHIN_NOISE"], "reason": "r" * 1000, "reviewed_by": "x"}, None),
     ({"accepted_verdicts": [], "reason": "r", "reviewed_by": "x"}, "data_decision.accepted_verdicts"),
     ({"accepted_verdicts": ["GO"], "reason": "r", "reviewed_by": "x"}, "data_decision.accepted_verdicts, data_decision.accepted_verdicts.0"),
     ({"accepted_verdicts": ["NO_GO"], "reason": "", "reviewed_by": "x"}, "data_decision.reason"),
     ({"accepted_verdicts": ["NO_GO"], "reason": "r" * 1001, "reviewed_by": "x"}, "data_decision.reason")],
)
def test_data_decision_bounds(decision, location):
    _judged(_with(data_decision=decision), location)


# --- huge integers ------------------------------------------------------------------------------


def test_the_largest_allowed_integers_are_exact(root: Path):
    document = _with(budget={"cap_cents": 10**15, "max_incremental_cents": 10**15 - 1})
    document["model"]["num_parameters"] = 10**13
    verified = verify_manifest(write_manifest(root / "m.json", document))
    summary = summarize(verified)
    assert summary["budget"] == {"cap_cents": 10**15, "max_incremental_cents": 10**15 - 1}
    assert summary["model"]["manifest_num_parameters"] == 10_000_000_000_000
    assert isinstance(verified.manifest.budget.cap_cents, int)


@pytest.mark.parametrize(
    "value,path,location",
    [(1e23, ("budget", "cap_cents"), "budget.cap_cents"),
     # pydantic also reports the tuple as too short once its only item failed
     (10**23, ("data", 0, "decontamination", "ngram_size"), "data, data.0.decontamination.ngram_size"),
     (-(10**23), ("model", "num_parameters"), "model.num_parameters")],
)
def test_huge_numbers_in_the_wrong_place_are_invalid(value, path, location):
    _judged(_at(valid_manifest(), path, value), location)


@pytest.mark.parametrize("digits", [4300, 4301, 5000])
def test_integers_at_and_past_pythons_digit_limit_are_handled(digits):
    """Python refuses int() of more than 4300 digits (its default limit); that must read as an
    invalid manifest, never escape as a bare ValueError (INTERNAL_ERROR at the CLI)."""
    raw = b'{"a": 1' + b"0" * (digits - 1) + b"}"  # a few KB: well inside the size bound
    err = _error(parse_manifest, _raw(raw))
    assert err.code is ErrorCode.MANIFEST_INVALID
    if digits > 4300:
        assert "0000" not in err.message


# --- verify.py's reports --------------------------------------------------------------------------


def test_schema_error_at_the_root():
    assert _error(parse_manifest, _raw(b"[]")).message == "the manifest does not match the schema at: <root>"


def test_schema_error_lists_at_most_five_locations_sorted():
    document = valid_manifest()
    fields = [("budget", "cap_cents"), ("checkpoint_policy", "interval_steps"), ("checkpoint_policy", "keep_last"),
              ("model", "num_parameters"), ("model", "revision")]
    for block, field in fields[:4]:
        document[block][field] = 0
    located = [f"{block}.{field}" for block, field in fields]
    assert _verdict(document).message == "the manifest does not match the schema at: " + ", ".join(located[:4])
    document["model"]["revision"] = ""
    assert _verdict(document).message == "the manifest does not match the schema at: " + ", ".join(located)
    document["model"]["size"] = ""
    assert _verdict(document).message == "the manifest does not match the schema at: " + ", ".join(located) + " (+1 more)"


def test_unknown_keys_are_counted_once_hidden():
    document = valid_manifest()
    for key in ("a1", "a2", "a3", "a4"):
        document[key] = 1
    document["model"]["num_parameters"] = 0
    err = _verdict(document)
    assert err.message == "the manifest does not match the schema at: <unknown key> (x4), model.num_parameters"


def test_secret_report_names_sorted_locations_and_kinds_only():
    document = valid_manifest()
    document["name"] = "ghp_" + "a" * 36
    assert _verdict(document).message == "the manifest contains secret material at: name (github_token)"
    document["model"]["revision"] = "hf_" + "b" * 30
    document["password"] = "x"
    err = _verdict(document)
    assert err.code is ErrorCode.MANIFEST_CONTAINS_SECRET
    assert err.message == ("the manifest contains secret material at: model.revision (hugging_face_token), "
                           "name (github_token), password (credential_key_name)")
    for i in range(6):
        document[f"z{i}"] = "xoxb-" + "1" * 10
    err = _verdict(document)
    assert err.message == ("the manifest contains secret material at: <key> (slack_token) (x6), "
                           "model.revision (hugging_face_token), name (github_token), password (credential_key_name)")


def test_the_secret_scan_runs_before_the_schema_and_spares_digest_fields():
    document = valid_manifest()
    document["data"][0]["sha256"] = "Zq8XvK2mP9wL4rT7yB3nJ6hF1dG5sA0cQeRuIoPZq8XvK2mP9wL4rT7yB3nJ6hF1"
    assert len(document["data"][0]["sha256"]) == 64
    # Not a digest's form: scanned, and the secret wins over the schema error.
    assert _verdict(document).code is ErrorCode.MANIFEST_CONTAINS_SECRET
    document["data"][0]["sha256"] = "0123456789abcdef" * 4
    assert _verdict(document) is None


def test_is_digest_field_by_key_and_form():
    hex64 = "0123456789abcdef" * 4
    assert is_digest_field(("data", 0, "sha256"), hex64)
    assert not is_digest_field(("data", 0, "sha256"), hex64 + "\n")
    assert not is_digest_field(("data", 0, "sha256"), "sha256:" + hex64)
    assert is_digest_field(("eval_suite_sha256",), "sha256:" + hex64)
    assert not is_digest_field(("eval_suite_sha256",), hex64)
    assert not is_digest_field(("data", 0, "uri"), hex64)
    assert not is_digest_field((), hex64)
    assert not is_digest_field((0,), hex64)


def test_expected_digest_boundaries():
    actual = "sha256:" + "ab" * 32
    check_expected_digest(actual, actual)
    check_expected_digest(actual, f"  {actual.upper().replace('SHA256', 'sha256')}\n")
    for bad in ("sha256:" + "ab" * 31 + "a", "sha256:" + "ab" * 32 + "a", "SHA256:" + "ab" * 32, "ab" * 32, ""):
        err = _error(check_expected_digest, actual, bad)
        assert err.code is ErrorCode.USAGE_ERROR
        assert err.message == "--expect-digest must be sha256: followed by 64 hex digits"
    err = _error(check_expected_digest, actual, "sha256:" + "ab" * 31 + "ac")
    assert err.code is ErrorCode.MANIFEST_DIGEST_MISMATCH
    assert err.message == "the manifest digest differs from the expected digest"


def test_provenance_is_reported_by_position():
    document = valid_manifest()
    second = json.loads(json.dumps(document["data"][0]))
    second["uri"], second["sha256"] = "dataroot://b.jsonl", "b" * 64
    third = json.loads(json.dumps(second))
    third["uri"], third["sha256"] = "dataroot://c.jsonl", "c" * 64
    del second["decontamination"], third["decontamination"]
    document["data"] += [second, third]
    manifest = parse_manifest(_raw(json.dumps(document).encode()))
    assert provenance_problems(manifest) == ["data[1]", "data[2]"]
    err = _error(require_provenance, manifest)
    assert err.code is ErrorCode.PROVENANCE_MISSING
    assert err.message == "data references without decontamination provenance: data[1], data[2]"
    require_provenance(parse_manifest(_raw(json.dumps(valid_manifest()).encode())))  # nothing missing


def test_summary_and_digests_of_a_verified_manifest(root: Path):
    data = json.dumps(valid_manifest()).encode()
    verified = verify_manifest(write_file(root / "m.json", data))
    sha = hashlib.sha256(data).hexdigest()
    assert isinstance(verified, VerifiedManifest)
    assert verified.raw.data == data
    assert verified.digest == "sha256:" + sha
    assert verified.short_digest == sha[:12] == Digest.of_hex(sha).short
    assert summarize(verified) == {
        "name": "unit-test",
        "kind": "training",
        "model": {"size": "tiny", "num_parameters": 1115264, "manifest_num_parameters": 1000000, "revision": "r1"},
        "num_data_references": 1,
        "data_references": [{"uri": "dataroot://fixtures/corpora/example.jsonl", "license": "CC0-1.0",
                             "format": "jsonl", "has_provenance": True}],
        "num_training_tokens": 300,
        "stages": ["pretraining", "mid_training"],
        "post_training": ["rlvr"],
        "budget": {"cap_cents": 100000, "max_incremental_cents": 50000},
    }


# --- descriptors ----------------------------------------------------------------------------------


@pytest.mark.parametrize("use_openat2", [True, False], ids=["openat2", "walk"])
def test_descriptor_zero_is_a_valid_descriptor(root: Path, use_openat2):
    """With stdin closed, the manifest's descriptor is 0: still a successful open, not an error."""
    if use_openat2 and not secure_read._openat2_available():
        pytest.skip("no openat2 here")
    path = write_file(root / "m.json", b"{}")
    saved = os.dup(0)
    os.close(0)
    try:
        got = read_manifest_bytes(path, use_openat2=use_openat2)
    finally:
        os.dup2(saved, 0)
        os.close(saved)
    assert got.data == b"{}"


@pytest.mark.parametrize("use_openat2", [None, False], ids=["auto", "walk"])
def test_every_descriptor_is_close_on_exec(root: Path, monkeypatch, use_openat2):
    import fcntl

    (root / "d").mkdir()
    path = write_file(root / "d" / "m.json", b"{}")
    real_open, opened = os.open, []

    def checked_open(*args, **kwargs):
        fd = real_open(*args, **kwargs)
        opened.append(fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC)
        return fd

    real_openat2 = secure_read._openat2

    def checked_openat2(*args):  # the raw syscall: Python adds no O_CLOEXEC of its own here
        fd = real_openat2(*args)
        opened.append(fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC)
        return fd

    monkeypatch.setattr(secure_read.os, "open", checked_open)
    monkeypatch.setattr(secure_read, "_openat2", checked_openat2)
    assert read_manifest_bytes(path, use_openat2=use_openat2).data == b"{}"
    assert opened
    if use_openat2 is False:
        assert len(opened) == len(Path(path).parts)  # "/", each directory, the file
    assert all(opened)


@pytest.mark.parametrize(
    "errno_,code,message",
    [
        ("ELOOP", ErrorCode.MANIFEST_SYMLINK, "the manifest path must not contain a symbolic link"),
        ("ENOENT", ErrorCode.MANIFEST_NOT_FOUND, "the manifest file does not exist"),
        ("EACCES", ErrorCode.MANIFEST_UNSAFE_PERMISSIONS, "the manifest cannot be opened for reading"),
        ("EPERM", ErrorCode.MANIFEST_UNSAFE_PERMISSIONS, "the manifest cannot be opened for reading"),
        ("ENOTDIR", ErrorCode.MANIFEST_NOT_REGULAR, "the manifest must be a regular file"),
        ("ENXIO", ErrorCode.MANIFEST_NOT_REGULAR, "the manifest must be a regular file"),
        ("ENODEV", ErrorCode.MANIFEST_NOT_REGULAR, "the manifest must be a regular file"),
        ("EISDIR", ErrorCode.MANIFEST_NOT_REGULAR, "the manifest must be a regular file"),
        ("EIO", ErrorCode.MANIFEST_NOT_FOUND, "the manifest cannot be opened"),
        ("ENAMETOOLONG", ErrorCode.MANIFEST_NOT_FOUND, "the manifest cannot be opened"),
    ],
)
def test_open_errors_map_to_exact_codes_and_messages(errno_, code, message):
    import errno

    number = getattr(errno, errno_)
    err = secure_read._open_error(OSError(number, os.strerror(number), "/secret/CANARY-path"))
    assert err.code is code and err.message == message
    assert str(err) == f"{code.value}: {message}" and "CANARY" not in str(err)


def test_a_real_missing_file_and_symlink_carry_the_exact_messages(root: Path):
    assert _error(read_manifest_bytes, str(root / "absent.json")).message == "the manifest file does not exist"
    write_file(root / "real.json", b"{}")
    (root / "link.json").symlink_to(root / "real.json")
    for use_openat2 in (None, False):
        err = _error(read_manifest_bytes, str(root / "link.json"), use_openat2=use_openat2)
        assert err.message == "the manifest path must not contain a symbolic link"


# --- which open is used, and the checks on the opened file -----------------------------------------


def _count_openat2(monkeypatch) -> list[bytes]:
    real, calls = secure_read._openat2, []

    def counting(path: bytes, flags: int) -> int:
        calls.append(path)
        return real(path, flags)

    monkeypatch.setattr(secure_read, "_openat2", counting)
    return calls


def test_walk_is_forced_by_false_and_openat2_is_auto_detected(root: Path, monkeypatch):
    if not secure_read._openat2_available():
        pytest.skip("no openat2 here")
    path = write_file(root / "m.json", b"{}")
    calls = _count_openat2(monkeypatch)
    assert read_manifest_bytes(path, use_openat2=False).data == b"{}"
    assert calls == []  # the component walk only
    assert read_manifest_bytes(path).data == b"{}"
    assert calls == [os.fsencode(path)]  # auto: the probe is cached, then one openat2 of the path
    assert read_manifest_bytes(path, use_openat2=True).data == b"{}"
    assert calls == [os.fsencode(path)] * 2


def test_without_proc_the_no_symlink_open_is_trusted(root: Path, monkeypatch):
    path = write_file(root / "m.json", b"{}")

    def no_proc(where, *args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(secure_read.os, "readlink", no_proc)
    assert read_manifest_bytes(path).data == b"{}"
    assert read_manifest_bytes(path, use_openat2=False).data == b"{}"


def test_a_descriptor_that_names_another_path_is_a_change(root: Path, monkeypatch):
    path = write_file(root / "m.json", b"{}")
    monkeypatch.setattr(secure_read.os, "readlink", lambda where, *a, **k: path + ".other")
    err = _error(read_manifest_bytes, path)
    assert err.code is ErrorCode.MANIFEST_CHANGED and err.message == "the manifest path changed while it was opened"


def _read_or_refused(path: str, ok: bool, code: ErrorCode, message: str) -> None:
    """The file is read whole when `ok`; otherwise refused with exactly `code` and `message`."""
    if ok:
        assert read_manifest_bytes(path).data == b"{}"
    else:
        err = _error(read_manifest_bytes, path)
        assert (err.code, err.message) == (code, message)


@pytest.mark.parametrize("uid,ok", [(0, True), (1, False), (65534, False)])
def test_owner_is_the_caller_or_root_exactly(root: Path, uid: int, ok: bool):
    if os.geteuid() != 0:
        pytest.skip("changing a file's owner needs root")
    path = write_file(root / "m.json", b"{}")
    os.chown(path, uid, 0)
    _read_or_refused(path, ok, ErrorCode.MANIFEST_UNSAFE_OWNER,
                     "the manifest must be owned by the caller or root")


@pytest.mark.parametrize("mode,ok", [(0o600, True), (0o601, True), (0o611, True), (0o645, True), (0o755, True),
                                     (0o4644, True), (0o602, False), (0o620, False), (0o622, False), (0o1646, False)])
def test_only_group_or_world_write_bits_are_refused(root: Path, mode: int, ok: bool):
    path = write_file(root / "m.json", b"{}", mode=mode)
    _read_or_refused(path, ok, ErrorCode.MANIFEST_UNSAFE_PERMISSIONS,
                     "the manifest must not be group- or world-writable")


def test_a_metadata_change_during_the_read_is_a_change_even_at_the_same_size(root: Path, monkeypatch):
    path = write_file(root / "m.json", b"{}")
    real_read, calls = os.read, []

    def read(fd: int, n: int) -> bytes:
        chunk = real_read(fd, n)
        if not calls:
            os.utime(path, ns=(1, 1))  # same bytes, same size; another mtime (and ctime)
        calls.append(n)
        return chunk

    monkeypatch.setattr(secure_read.os, "read", read)
    err = _error(read_manifest_bytes, path)
    assert err.code is ErrorCode.MANIFEST_CHANGED and err.message == "the manifest changed while it was read"


def test_fewer_bytes_than_fstat_reported_is_a_change(root: Path, monkeypatch):
    path = write_file(root / "m.json", b"{}")
    monkeypatch.setattr(secure_read.os, "read", lambda fd, n: b"")  # a short read: 0 of 2 bytes
    err = _error(read_manifest_bytes, path)
    assert err.code is ErrorCode.MANIFEST_CHANGED
