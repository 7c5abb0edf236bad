"""The evaluation battery's sizes are the manifest's (`post_training_eval`: `num_prompts` held-out
prompts, completions of up to `max_new_tokens`), so the confirmation binds them: every stage
evaluates (before, after, and the sampled KL) with them, a manifest without the block means the
sizes stages evaluated with before (200 and 8) and keeps its digest, and a battery the stage cannot
run as the manifest says (more prompts than the held-out split holds, completions the model cannot
hold) is refused before any compute."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from helpers import Stopped, spy_calls
from posttraining.never_ends import NeverEnds
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.schema import MAX_EVAL_PROMPTS, PostTrainingEval, RlvrStep, SftStep
from ito_assets.manifest.verify import verify_manifest
from ito_assets.posttraining import pipeline
from ito_assets.posttraining.base import seeded
from ito_assets.posttraining.decoding import encode_prompt
from ito_assets.posttraining.evaluation import evaluate_reward, sampled_kl
from ito_assets.posttraining.fixtures import instruction_pairs, write_jsonl
from ito_assets.posttraining.pipeline import SFT_FILE, battery, longest_prompt, run_stage
from ito_assets.posttraining.stage import PostTrainingRuntime
from ito_assets.posttraining.tasks import largest_digit_tasks
from ito_assets.training.model_config import config_by_name

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = PostTrainingRuntime()
TRAIN, HELD_OUT = battery(RUNTIME)
# The fixture manifests, reviewed before the manifest held the battery's sizes: their bytes, and so
# their digests and every confirmation of them, are unchanged (data/fixtures/README.md lists them).
FIXTURES = {
    "fixture-small.json": "2735bd518eaaf99cc3597f486e2e8ccea840531171211bf36921e75984e9bb3c",
    "fixture-docs-only.json": "bb8e2d0c424cb00caf1e31b96a91031c2a777ad0634b2c203ed8954db5599905",
}
# A step that trains as little as RLVR can: the stage's evaluations are what these tests look at.
SMALL_RLVR = {"kind": "rlvr", "num_steps": 1, "groups_per_step": 1, "group_size": 2}


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_a_manifest_without_the_block_keeps_its_digest_and_evaluates_as_before(name):
    path = ROOT / "data" / "fixtures" / "manifests" / name
    assert hashlib.sha256(path.read_bytes()).hexdigest() == FIXTURES[name]
    verified = verify_manifest(str(path))
    assert verified.raw.sha256_hex == FIXTURES[name]
    assert "post_training_eval" not in path.read_text()
    # what the stages evaluated with before: the posttraining resource's num_eval_prompts 200 and max_new_tokens 8
    evaluation = verified.manifest.post_training_eval
    assert (evaluation.num_prompts, evaluation.max_new_tokens) == (200, 8)
    assert evaluation == PostTrainingEval.model_validate({"num_prompts": 200, "max_new_tokens": 8})
    assert battery(RUNTIME, evaluation)[1] == HELD_OUT  # every held-out prompt, as before


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
                        out_dir=tmp_path / "out", runtime=RUNTIME, evaluation=evaluation)
    assert len(rewards) == 2 and len(kls) == 1  # before and after; the KL after
    for args, kwargs in rewards:
        assert list(args[2]) == HELD_OUT[:3] and kwargs["max_new_tokens"] == 5
    [(args, kwargs)] = kls
    assert list(args[3]) == HELD_OUT[:3] and kwargs["max_new_tokens"] == 5
    assert outcome.eval_before.num_tasks == outcome.eval_after.num_tasks == 3
    assert len(outcome.eval_after.per_task) == 3


@pytest.mark.parametrize("num_prompts,refused", [(1, False), (200, False), (201, True), (MAX_EVAL_PROMPTS, True)])
def test_more_prompts_than_the_held_out_split_holds_are_refused(num_prompts, refused):
    """The default split holds 200 held-out prompts: 200 are evaluated, 201 refused rather than
    evaluated on 200 while the manifest says 201."""
    evaluation = PostTrainingEval(num_prompts=num_prompts)
    if not refused:
        assert battery(RUNTIME, evaluation)[1] == HELD_OUT[:num_prompts]
        return
    with pytest.raises(ItoError) as error:
        battery(RUNTIME, evaluation)
    assert error.value.code is ErrorCode.POSTTRAINING_DATA_INVALID
    assert error.value.message == (f"post_training_eval.num_prompts asks for {num_prompts} held-out prompts; the "
                                   "battery holds 200 (held_out_fraction 0.2 of 1000)")


def test_a_smaller_split_refuses_the_default_battery_before_any_compute(tmp_path, monkeypatch):
    """A resource holding out a tenth leaves 100 prompts: the default 200 is refused at the stage's
    start, before the first evaluation."""
    evaluated = spy_calls(monkeypatch, pipeline, "_evaluate", stop=True)
    with pytest.raises(ItoError) as error:
        run_stage(RlvrStep.model_validate(SMALL_RLVR), start=seeded(), data_root=tmp_path, out_dir=tmp_path / "out",
                  runtime=PostTrainingRuntime(held_out_fraction=0.1))
    assert error.value.code is ErrorCode.POSTTRAINING_DATA_INVALID
    assert "asks for 200 held-out prompts; the battery holds 100" in error.value.message
    assert evaluated == []


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
        run_stage(step, start=seeded(), data_root=tmp_path, out_dir=tmp_path / "out", runtime=RUNTIME,
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
