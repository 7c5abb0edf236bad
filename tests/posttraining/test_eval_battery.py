"""The evaluation battery's sizes are the manifest's (`post_training_eval`: `num_prompts` held-out
prompts, completions of up to `max_new_tokens`, the share `held_out_fraction` held out of RLVR's
training), so the confirmation binds them: every stage evaluates (before, after, and the sampled
KL) with them, a manifest without the block means what stages evaluated with before (200, 8 and
0.2) and keeps its digest, a battery asking for more prompts than its split holds out is refused
with the manifest, and completions the model cannot hold are refused before any compute."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pydantic
import pytest

from helpers import Stopped, spy_calls
from posttraining.never_ends import NeverEnds
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.schema import MAX_EVAL_PROMPTS, PostTrainingEval, RlvrStep, SftStep
from ito_assets.manifest.verify import verify_manifest
from ito_assets.posttraining import pipeline
from ito_assets.posttraining.base import seeded
from ito_assets.posttraining.decoding import encode_prompt
from helpers import fixture_as_first_reviewed
from ito_assets.posttraining.evaluation import evaluate_reward, sampled_kl
from ito_assets.posttraining.fixtures import instruction_pairs, write_jsonl
from ito_assets.posttraining.pipeline import SFT_FILE, battery, longest_prompt, run_stage
from ito_assets.posttraining.tasks import largest_digit_tasks, split_held_out
from ito_assets.training.model_config import config_by_name

ROOT = Path(__file__).resolve().parents[2]
TRAIN, HELD_OUT = battery()
# The fixture manifests as reviewed before the manifest held the battery's sizes: their bytes, and
# so their digests and every confirmation of them, are unchanged (the fixtures bind their
# decision's baseline since; `fixture_as_first_reviewed` leaves it out again).
FIXTURES = {
    "fixture-small.json": "2735bd518eaaf99cc3597f486e2e8ccea840531171211bf36921e75984e9bb3c",
    "fixture-docs-only.json": "bb8e2d0c424cb00caf1e31b96a91031c2a777ad0634b2c203ed8954db5599905",
}
# A step that trains as little as RLVR can: the stage's evaluations are what these tests look at.
SMALL_RLVR = {"kind": "rlvr", "num_steps": 1, "groups_per_step": 1, "group_size": 2}


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_a_manifest_without_the_block_keeps_its_digest_and_evaluates_as_before(name, tmp_path):
    path = fixture_as_first_reviewed(name, tmp_path)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == FIXTURES[name]
    verified = verify_manifest(str(path))
    assert verified.raw.sha256_hex == FIXTURES[name]
    assert "post_training_eval" not in path.read_text()
    # what the stages evaluated with before: the posttraining resource's num_eval_prompts 200,
    # max_new_tokens 8 and held_out_fraction 0.2, and its split (seed 0)
    evaluation = verified.manifest.post_training_eval
    assert (evaluation.num_prompts, evaluation.max_new_tokens, evaluation.held_out_fraction) == (200, 8, 0.2)
    assert evaluation == PostTrainingEval.model_validate({"num_prompts": 200, "max_new_tokens": 8})
    assert battery(evaluation) == (TRAIN, HELD_OUT) == split_held_out(largest_digit_tasks(), held_out_fraction=0.2, seed=0)


def test_the_schemas_bound_is_the_battery_task_familys_size():
    """No held-out split holds more prompts than the task family: the schema's upper bound."""
    assert MAX_EVAL_PROMPTS == len(largest_digit_tasks())


def test_the_stage_evaluates_the_manifests_prompts_with_its_completion_length(tmp_path, monkeypatch):
    """3 prompts and completions of up to 5 tokens: the reward before and after, and the KL, all
    with the manifest's figures (the runtime holds none of them any more)."""
    evaluation = PostTrainingEval(num_prompts=3, max_new_tokens=5)
    rewards = spy_calls(monkeypatch, pipeline, "evaluate_reward")
    kls = spy_calls(monkeypatch, pipeline, "sampled_kl")
    outcome = run_stage(RlvrStep.model_validate(SMALL_RLVR), start=seeded(), data_root=tmp_path,
                        out_dir=tmp_path / "out", evaluation=evaluation)
    assert len(rewards) == 2 and len(kls) == 1  # before and after; the KL after
    for args, kwargs in rewards:
        assert list(args[2]) == HELD_OUT[:3] and kwargs["max_new_tokens"] == 5
    [(args, kwargs)] = kls
    assert list(args[3]) == HELD_OUT[:3] and kwargs["max_new_tokens"] == 5
    assert outcome.eval_before.num_tasks == outcome.eval_after.num_tasks == 3
    assert len(outcome.eval_after.per_task) == 3


@pytest.mark.parametrize(("fraction", "held_out"), [(0.2, 200), (0.1, 100), (0.5, 500), (0.999, 999), (1e-9, 2)])
def test_a_battery_may_ask_for_every_prompt_its_split_holds_out_and_no_more(fraction, held_out):
    """Refused with the manifest (its schema), before any compute is confirmed, never evaluated on
    fewer prompts than it says; the split holds at least two prompts out (the gate's fewest)."""
    evaluation = PostTrainingEval(num_prompts=held_out, held_out_fraction=fraction)
    train, evaluated = battery(evaluation)
    assert len(evaluated) == held_out and len(train) == MAX_EVAL_PROMPTS - held_out
    assert not {t.prompt for t in train} & {t.prompt for t in evaluated}  # RLVR never trains on the battery's prompts
    rule = (f"num_prompts exceeds the {held_out} held-out prompts that held_out_fraction leaves of the battery's 1000"
            if held_out < MAX_EVAL_PROMPTS - 1 else "less than or equal to 999")  # num_prompts' own bound
    with pytest.raises(pydantic.ValidationError, match=rule):
        PostTrainingEval(num_prompts=held_out + 1, held_out_fraction=fraction)


@pytest.mark.parametrize("fraction", [0, 1, -0.1, 1.5, float("nan"), float("inf"), 0.9991, 0.9995])
def test_a_held_out_share_outside_zero_to_0999_is_refused(fraction):
    """From 0.9995 the split would hold out all 1,000 prompts, leaving RLVR none to train on."""
    with pytest.raises(pydantic.ValidationError, match="held_out_fraction"):
        PostTrainingEval(num_prompts=2, held_out_fraction=fraction)
    assert len(battery(PostTrainingEval(num_prompts=2, held_out_fraction=0.999))[0]) == 1


def test_a_manifest_asking_for_more_prompts_than_its_split_holds_out_is_invalid(tmp_path):
    """The default split holds out 200: 201 is refused when the manifest is read (review, the
    API's validation, the sensor), not at the post-training stage after the pretraining's compute."""
    body = json.loads((ROOT / "data" / "fixtures" / "manifests" / "fixture-small.json").read_text())
    for num_prompts, valid in ((200, True), (201, False)):
        path = tmp_path / f"asks-{num_prompts}.json"
        path.write_text(json.dumps(body | {"post_training_eval": {"num_prompts": num_prompts}}))
        if valid:
            assert verify_manifest(str(path)).manifest.post_training_eval.num_prompts == 200
            continue
        with pytest.raises(ItoError) as refused:
            verify_manifest(str(path))
        assert refused.value.code is ErrorCode.MANIFEST_INVALID and "post_training_eval" in refused.value.message


def test_a_smaller_split_trains_rlvr_on_the_rest(tmp_path, monkeypatch):
    """A tenth held out: the stage evaluates its 100 and RLVR draws from the other 900 prompts."""
    rewards = spy_calls(monkeypatch, pipeline, "evaluate_reward")
    trained = spy_calls(monkeypatch, pipeline, "_train", stop=True)
    evaluation = PostTrainingEval(num_prompts=100, held_out_fraction=0.1)
    with pytest.raises(Stopped):
        run_stage(RlvrStep.model_validate(SMALL_RLVR), start=seeded(), data_root=tmp_path, out_dir=tmp_path / "out",
                  evaluation=evaluation)
    train, held_out = battery(evaluation)
    [(args, _)] = rewards  # the recipe's first stage: the battery before training
    assert [t.prompt for t in args[2]] == [t.prompt for t in held_out] and len(held_out) == 100
    [(args, _)] = trained
    assert [t.prompt for t in args[6]] == [t.prompt for t in train] and len(train) == 900


# --- completions the model must hold ---------------------------------------------------------------

MAX_POSITIONS = config_by_name(seeded().model_name).max_seq_len


def _edge() -> tuple[int, int]:
    """(the longest held-out prompt with bos, the largest max_new_tokens its model holds after it)."""
    prompt = longest_prompt(seeded().codec(), HELD_OUT)
    return prompt, MAX_POSITIONS + 1 - prompt


def test_the_longest_completion_the_check_admits_is_the_longest_the_battery_runs():
    """What the stage's check counts is what the battery feeds the model: at the edge, completions
    that never end are sampled and their KL measured within max_seq_len positions; one token more
    fails the model itself, mid-evaluation."""
    _, edge = _edge()
    codec = seeded().codec()
    task = max(HELD_OUT, key=lambda t: len(encode_prompt(codec, t.prompt)))
    policy = NeverEnds(seeded().factory()(), codec.eos_id)
    result = evaluate_reward(policy, codec, [task], max_new_tokens=edge, num_samples=2)
    assert result.num_tasks == 1
    assert sampled_kl(policy, policy, codec, [task], max_new_tokens=edge, num_samples=2) == 0.0
    with pytest.raises(ValueError, match="max_seq_len"):
        evaluate_reward(policy, codec, [task], max_new_tokens=edge + 1, num_samples=2)


def _sft_step(data_root: Path) -> SftStep:
    path = data_root / "pairs" / SFT_FILE
    write_jsonl(path, instruction_pairs(TRAIN[:8], copies=1, seed=0, error_rate=0.0))
    data = {"uri": f"dataroot://pairs/{SFT_FILE}", "format": "jsonl", "license": "CC0-1.0",
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    return SftStep.model_validate({"kind": "sft", "data": data})


@pytest.mark.parametrize("kind", ["sft", "rlvr"])
@pytest.mark.parametrize("past_the_edge", [0, 1])
def test_a_battery_the_model_cannot_hold_is_refused_before_any_compute(tmp_path, monkeypatch, kind, past_the_edge):
    """Every stage checks its battery: at the edge it goes on to its first compute (the battery
    before training, stopped here); one token past it, POSTTRAINING_DATA_INVALID before that,
    naming the positions and the manifest's field."""
    prompt_length, edge = _edge()
    max_new_tokens = edge + past_the_edge
    step = _sft_step(tmp_path) if kind == "sft" else RlvrStep.model_validate(SMALL_RLVR)
    evaluation = PostTrainingEval(num_prompts=2, max_new_tokens=max_new_tokens)
    evaluated = spy_calls(monkeypatch, pipeline, "_evaluate", stop=True)

    def stage():
        run_stage(step, start=seeded(), data_root=tmp_path, out_dir=tmp_path / "out",
                  evaluation=evaluation)

    if not past_the_edge:
        with pytest.raises(Stopped):
            stage()
        [(args, _)] = evaluated
        assert args[-1] == evaluation
        return
    with pytest.raises(ItoError) as error:
        stage()
    assert error.value.code is ErrorCode.POSTTRAINING_DATA_INVALID
    assert error.value.message == (
        f"the evaluation battery's completions of up to {max_new_tokens} tokens (post_training_eval.max_new_tokens) "
        f"after its longest prompt of {prompt_length} need {MAX_POSITIONS + 1} positions; the model holds "
        f"{MAX_POSITIONS}")
    assert evaluated == []
    assert not (tmp_path / "out" / kind / "policy.pt").exists()


# --- pairs on the battery's held-out prompts ------------------------------------------------------

def _pairs_step(data_root: Path, tasks) -> SftStep:
    path = data_root / "pairs" / SFT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"pair_id": f"p{i}", "prompt": t.prompt, "response": t.answer}) + "\n"
                            for i, t in enumerate(tasks)))
    data = {"uri": f"dataroot://pairs/{SFT_FILE}", "format": "jsonl", "license": "CC0-1.0",
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    return SftStep.model_validate({"kind": "sft", "data": data, "batch_size": 2})


@pytest.mark.parametrize("fraction", [0.2, 0.5])
def test_pairs_on_a_held_out_prompt_are_refused_at_gate_5_and_by_the_stage_before_any_compute(
        tmp_path, monkeypatch, fraction):
    """The eval gate scores a stage on held-out prompts: pairs that teach those very prompts made a
    contaminated gain pass (the committed fixtures are clean only at the default 0.2 split, and a
    manifest holding out half was accepted with 122 of its 200 eval prompts in the pair files)."""
    from ito_assets.posttraining.plan import read_pair_shapes

    train, held_out = split_held_out(largest_digit_tasks(), held_out_fraction=fraction, seed=0)
    evaluation = PostTrainingEval(num_prompts=2, held_out_fraction=fraction)
    clean = _pairs_step(tmp_path, train[:4])
    assert read_pair_shapes([clean], tmp_path, held_out_fraction=fraction)["sft"].num_pairs == 4
    held = held_out[-1]  # past the evaluated ones: held out is never trained on, evaluated or not
    dirty = _pairs_step(tmp_path, [*train[:2], held])
    stopped = spy_calls(monkeypatch, pipeline, "_evaluate", stop=True)
    expected = (f"dataroot://pairs/{SFT_FILE}: pair 3 trains on a prompt the eval battery holds out "
                f"(held_out_fraction {fraction}): the stage's eval gate would measure what it was trained on")
    for refuse in (lambda: read_pair_shapes([dirty], tmp_path, held_out_fraction=fraction),
                   lambda: run_stage(dirty, start=seeded(), data_root=tmp_path, out_dir=tmp_path / "out",
                                     evaluation=evaluation)):
        with pytest.raises(ItoError) as refused:
            refuse()
        assert refused.value.code is ErrorCode.POSTTRAINING_DATA_INVALID and refused.value.message == expected
    assert stopped == []
    # The same prompt with other whitespace is the same prompt.
    spaced = json.dumps({"pair_id": "spaced", "prompt": "  " + held.prompt.replace(" ", "   ") + " ", "response": held.answer})
    (tmp_path / "pairs" / SFT_FILE).write_text((tmp_path / "pairs" / SFT_FILE).read_text().splitlines()[0] + "\n"
                                                + spaced + "\n")
    step = SftStep.model_validate({"kind": "sft", "batch_size": 2, "data": {
        **dirty.data.model_dump(), "sha256": hashlib.sha256((tmp_path / "pairs" / SFT_FILE).read_bytes()).hexdigest()}})
    with pytest.raises(ItoError, match="pair 2 trains on a prompt the eval battery holds out"):
        read_pair_shapes([step], tmp_path, held_out_fraction=fraction)


def test_the_fixture_pair_files_are_clean_at_the_default_split_and_refused_where_it_holds_them_out():
    from ito_assets.manifest.schema import Manifest
    from ito_assets.posttraining.plan import read_pair_shapes

    recipe = Manifest.model_validate_json((ROOT / "data" / "fixtures" / "manifests" / "fixture-small.json").read_bytes()).post_training
    assert set(read_pair_shapes(recipe, ROOT / "data", held_out_fraction=0.2)) == {"sft", "dpo"}
    with pytest.raises(ItoError, match="trains on a prompt the eval battery holds out"):
        read_pair_shapes(recipe, ROOT / "data", held_out_fraction=0.5)
