"""Every number in the manifest schema has a lower and an upper bound: each bound accepted exactly
at its edge and refused one step past it (one integer, or the next float), reported as
MANIFEST_INVALID at the field's location and never with its value. A meta-test keeps the table
complete: a numeric field without both bounds, or without a row here, fails."""

from __future__ import annotations

import hashlib
import json
import math
import re
import os
import typing
from pathlib import Path

import annotated_types
import pytest
from pydantic import BaseModel

from helpers import valid_manifest, write_manifest
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest import schema
from ito_assets.manifest.secure_read import ManifestBytes
from ito_assets.manifest.verify import parse_manifest, verify_manifest


def _raw(data: bytes) -> ManifestBytes:
    return ManifestBytes(data=data, sha256_hex=hashlib.sha256(data).hexdigest())


def _verdict(document: dict) -> ItoError | None:
    try:
        parse_manifest(_raw(json.dumps(document).encode()))
    except ItoError as err:
        return err
    return None


def _locations(err: ItoError) -> list[str]:
    assert err.code is ErrorCode.MANIFEST_INVALID
    return re.sub(r" \([^)]*\)", "", err.message.split(": ", 1)[1]).split(", ")  # without a rule's own words


# --- how each field is set in an otherwise valid manifest -------------------------------------


def _at(*path):
    """A builder that sets the field at `path` of an otherwise valid manifest."""
    def build(value):
        document = valid_manifest()
        node = document
        for step in path[:-1]:
            node = node[step]
        node[path[-1]] = value
        return document
    return build


def _total_tokens(value):
    document = valid_manifest()  # one stage, so that the stage tokens add up to the total
    document["training_target"] = {"num_tokens": value,
                                   "stages": [{"name": "pretraining", "num_tokens": value, "sequence_length": 128}]}
    return document


def _eval_gate(field):
    def build(value):
        document = valid_manifest()
        document["training_target"]["eval_gate"] = {field: value}
        return document
    return build


def _step(kind, field):
    def build(value):
        document = valid_manifest()
        document["post_training"] = [{"kind": kind, field: value}]
        return document
    return build


def _rlvr_length(field):
    def build(value):
        document = valid_manifest()
        # The other length sits where RLVR's own rule (overlong_cache <= max_new_tokens - 2) cannot object.
        other = {"max_new_tokens": 2**16} if field == "overlong_cache" else {"overlong_cache": 1}
        document["post_training"] = [{"kind": "rlvr", field: value, **other}]
        return document
    return build


def _post_training_eval(field):
    # Beside the field, the other that the block's own rule (num_prompts within the held-out
    # split) compares it with, where that rule cannot object: 999 held out, or two prompts asked.
    other = {"num_prompts": {"held_out_fraction": 0.999}, "held_out_fraction": {"num_prompts": 2}}.get(field, {})

    def build(value):
        document = valid_manifest()
        document["post_training_eval"] = {**other, field: value}
        return document
    return build


def _budget(field):
    def build(value):
        document = valid_manifest()
        # The other amount sits where the budget's own rule (increment <= cap) cannot object.
        if field == "cap_cents":
            document["budget"] = {"cap_cents": value, "max_incremental_cents": 1}
        else:
            document["budget"] = {"cap_cents": schema.MAX_CENTS, "max_incremental_cents": value}
        return document
    return build


def _decision_economics(value):
    document = valid_manifest()
    document["decision_economics"] = {"max_cost_cents_per_improvement_point": value}
    return document


def _decision_power(field):
    def build(value):
        document = valid_manifest()
        document["decision_power"] = {"minimum_detectable_effect": 0.01, field: value}
        return document
    return build


INF, NEG = math.inf, -math.inf
# (schema class, field) -> (builder, reported location, lower, lower inclusive, upper, upper inclusive)
RANGES = {
    ("Model", "num_parameters"): (_at("model", "num_parameters"), "model.num_parameters", 1, True, 10**13, True),
    ("DecontaminationProvenance", "ngram_size"): (_at("data", 0, "decontamination", "ngram_size"), "data.0.decontamination.ngram_size", 4, True, 50, True),
    ("TrainingTarget", "num_tokens"): (_total_tokens, "training_target.num_tokens", 1, True, 10**15, True),
    ("Stage", "num_tokens"): (_total_tokens, "training_target.stages.0.num_tokens", 1, True, 10**15, True),
    ("Stage", "sequence_length"): (_at("training_target", "stages", 0, "sequence_length"), "training_target.stages.0.sequence_length", 1, True, 2**24, True),
    ("EvalGate", "min_improvement_bands"): (_eval_gate("min_improvement_bands"),
                                            "training_target.eval_gate.min_improvement_bands", 0.0, True, 100.0, True),
    ("EvalGate", "max_regression_bands"): (_eval_gate("max_regression_bands"),
                                           "training_target.eval_gate.max_regression_bands", 0.0, True, 100.0, True),
    ("SftStep", "num_epochs"): (_step("sft", "num_epochs"), "post_training.0.sft.num_epochs", 1, True, 1000, True),
    ("SftStep", "learning_rate"): (_step("sft", "learning_rate"), "post_training.0.sft.learning_rate",
                                   0.0, False, 1.0, False),
    ("SftStep", "batch_size"): (_step("sft", "batch_size"), "post_training.0.sft.batch_size", 1, True, 2**20, True),
    ("DpoStep", "batch_size"): (_step("dpo", "batch_size"), "post_training.0.dpo.batch_size", 1, True, 2**20, True),
    ("DpoStep", "beta"): (_step("dpo", "beta"), "post_training.0.dpo.beta", 0.0, False, 10.0, True),
    ("DpoStep", "label_smoothing"): (_step("dpo", "label_smoothing"), "post_training.0.dpo.label_smoothing",
                                     0.0, True, 0.5, False),
    ("DpoStep", "rpo_alpha"): (_step("dpo", "rpo_alpha"), "post_training.0.dpo.rpo_alpha", 0.0, True, 10.0, True),
    ("DpoStep", "learning_rate"): (_step("dpo", "learning_rate"), "post_training.0.dpo.learning_rate",
                                   0.0, False, 1.0, False),
    ("RlvrStep", "group_size"): (_step("rlvr", "group_size"), "post_training.0.rlvr.group_size", 2, True, 1024, True),
    ("RlvrStep", "clip_eps_low"): (_step("rlvr", "clip_eps_low"), "post_training.0.rlvr.clip_eps_low",
                                   0.0, False, 1.0, False),
    ("RlvrStep", "clip_eps_high"): (_step("rlvr", "clip_eps_high"), "post_training.0.rlvr.clip_eps_high",
                                    0.0, False, 1.0, False),
    ("RlvrStep", "max_staleness"): (_step("rlvr", "max_staleness"), "post_training.0.rlvr.max_staleness", 0, True, 64, True),
    ("RlvrStep", "max_draws_per_group"): (_step("rlvr", "max_draws_per_group"), "post_training.0.rlvr.max_draws_per_group",
                                          1, True, 100, True),
    ("RlvrStep", "num_steps"): (_step("rlvr", "num_steps"), "post_training.0.rlvr.num_steps", 1, True, 10**9, True),
    ("RlvrStep", "groups_per_step"): (_step("rlvr", "groups_per_step"), "post_training.0.rlvr.groups_per_step",
                                      1, True, 2**20, True),
    ("RlvrStep", "learning_rate"): (_step("rlvr", "learning_rate"), "post_training.0.rlvr.learning_rate",
                                    0.0, False, 1.0, False),
    ("RlvrStep", "max_new_tokens"): (_rlvr_length("max_new_tokens"), "post_training.0.rlvr.max_new_tokens",
                                     3, True, 2**16, True),
    ("RlvrStep", "overlong_cache"): (_rlvr_length("overlong_cache"), "post_training.0.rlvr.overlong_cache",
                                     1, True, 2**16 - 2, True),
    ("PostTrainingEval", "num_prompts"): (_post_training_eval("num_prompts"), "post_training_eval.num_prompts",
                                          2, True, 10**3 - 1, True),
    ("PostTrainingEval", "max_new_tokens"): (_post_training_eval("max_new_tokens"),
                                             "post_training_eval.max_new_tokens", 1, True, 2**16, True),
    ("PostTrainingEval", "held_out_fraction"): (_post_training_eval("held_out_fraction"),
                                                "post_training_eval.held_out_fraction", 0.0, False, 0.999, True),
    ("Budget", "cap_cents"): (_budget("cap_cents"), "budget.cap_cents", 1, True, 10**15, True),
    ("Budget", "max_incremental_cents"): (_budget("max_incremental_cents"), "budget.max_incremental_cents",
                                          1, True, 10**15, True),
    ("CheckpointPolicy", "interval_steps"): (_at("checkpoint_policy", "interval_steps"), "checkpoint_policy.interval_steps",
                                             1, True, 10**9, True),
    ("CheckpointPolicy", "keep_last"): (_at("checkpoint_policy", "keep_last"), "checkpoint_policy.keep_last", 1, True, 10_000, True),
    ("DecisionEconomics", "max_cost_cents_per_improvement_point"): (
        _decision_economics, "decision_economics.max_cost_cents_per_improvement_point", 1, True, 10**15, True),
    ("DecisionPower", "minimum_detectable_effect"): (
        _decision_power("minimum_detectable_effect"), "decision_power.minimum_detectable_effect", 0.0, False, 10.0, True),
    ("DecisionPower", "max_seeds"): (_decision_power("max_seeds"), "decision_power.max_seeds", 2, True, 64, True),
}


def _step_past(value, direction: float):
    """One step past `value` towards `direction`: the next integer, or the next float."""
    if isinstance(value, int):
        return value + (1 if direction > 0 else -1)
    return math.nextafter(value, direction)


def _edges(lower, lower_inclusive, upper, upper_inclusive):
    """(accepted, refused): the values just inside and just outside both bounds."""
    low_in = lower if lower_inclusive else _step_past(lower, INF)
    low_out = _step_past(lower, NEG) if lower_inclusive else lower
    high_in = upper if upper_inclusive else _step_past(upper, NEG)
    high_out = _step_past(upper, INF) if upper_inclusive else upper
    return [low_in, high_in], [low_out, high_out]


@pytest.mark.parametrize("field", sorted(RANGES), ids=[".".join(k) for k in sorted(RANGES)])
def test_each_bound_at_its_edge_and_one_past(field):
    build, location, *bounds = RANGES[field]
    accepted, refused = _edges(*bounds)
    for value in accepted:
        assert _verdict(build(value)) is None, (field, value)
    for value in refused:
        err = _verdict(build(value))
        assert err is not None, (field, value)
        assert location in _locations(err), (field, value, err.message)
        if len(str(value)) >= 3:  # shorter ones (0, -1, 65) read as parts of a location like "stages.0"
            assert str(value) not in err.message


def _numeric_fields(model: type[BaseModel], seen: set) -> typing.Iterator[tuple[type[BaseModel], str]]:
    if model in seen:
        return
    seen.add(model)
    for name, info in model.model_fields.items():
        if info.annotation in (int, float):
            yield model, name
        for nested in _models_in(info.annotation):
            yield from _numeric_fields(nested, seen)


def _models_in(annotation) -> typing.Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in typing.get_args(annotation):
        yield from _models_in(arg)


def test_every_numeric_field_has_both_bounds_and_a_row_here():
    fields = list(_numeric_fields(schema.Manifest, set()))
    assert {(m.__name__, n) for m, n in fields} == set(RANGES)
    for model, name in fields:
        kinds = {type(c) for c in model.model_fields[name].metadata}
        assert kinds & {annotated_types.Ge, annotated_types.Gt}, (model.__name__, name)
        assert kinds & {annotated_types.Le, annotated_types.Lt}, (model.__name__, name)


def test_the_table_matches_the_schemas_own_bounds():
    for (model_name, name), (_build, _loc, lower, lower_inclusive, upper, upper_inclusive) in RANGES.items():
        constraints = {type(c): c for c in getattr(schema, model_name).model_fields[name].metadata}
        low = constraints.get(annotated_types.Ge if lower_inclusive else annotated_types.Gt)
        high = constraints.get(annotated_types.Le if upper_inclusive else annotated_types.Lt)
        assert low is not None and high is not None, (model_name, name)
        assert (getattr(low, "ge", None) if lower_inclusive else low.gt) == lower
        assert (getattr(high, "le", None) if upper_inclusive else high.lt) == upper


def test_the_named_limits():
    assert schema.MAX_CENTS == 10**15  # ten trillion dollars
    assert schema.MAX_PARAMETERS == 10**13
    assert schema.MAX_TOKENS == 10**15
    assert schema.MAX_STEPS == 10**9


# --- the two reported cases: thousands of digits ----------------------------------------------


def _with_digits(path: tuple, digits: int) -> bytes:
    document = valid_manifest()
    if path == ("budget", "cap_cents"):
        document["budget"] = {"cap_cents": "@@", "max_incremental_cents": 1}
    else:
        target = document
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = "@@"
    return json.dumps(document).replace('"@@"', "9" * digits).encode()


@pytest.mark.parametrize("path,digits,location", [
    (("model", "num_parameters"), 4300, "model.num_parameters"),
    (("budget", "cap_cents"), 4000, "budget.cap_cents"),
    (("budget", "cap_cents"), 16, "budget.cap_cents"),  # 10**16 - 1: the first length past the cap
])
def test_a_number_with_thousands_of_digits_is_invalid(path, digits, location):
    with pytest.raises(ItoError) as info:
        parse_manifest(_raw(_with_digits(path, digits)))
    assert info.value.message == f"the manifest does not match the schema at: {location}"
    assert "9999" not in info.value.message


def test_the_largest_budget_is_read_exactly(tmp_path: Path):
    document = valid_manifest()
    document["budget"] = {"cap_cents": 10**15, "max_incremental_cents": 10**15}
    document["model"]["num_parameters"] = 10**13
    verified = verify_manifest(write_manifest(Path(os.path.realpath(tmp_path)) / "m.json", document))
    assert verified.manifest.budget.cap_cents == 1_000_000_000_000_000
    assert verified.manifest.model.num_parameters == 10_000_000_000_000


@pytest.mark.parametrize("name", ["fixture-small.json", "fixture-docs-only.json"])
def test_the_shipped_fixtures_are_within_every_range(name):
    path = Path(__file__).resolve().parents[2] / "data" / "fixtures" / "manifests" / name
    assert parse_manifest(_raw(path.read_bytes())).name
