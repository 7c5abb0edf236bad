"""The sizes that decide a post-training stage's compute are the manifest recipe's, so the
confirmation binds them: a step's `batch_size` (SFT, DPO) and RLVR's `num_steps`,
`groups_per_step`, `max_new_tokens` and `overlong_cache` are what the stage trains with, and the
`posttraining` resource refuses them rather than train with other sizes than its caller says (the
evaluation battery's sizes are the manifest's `post_training_eval`: test_eval_battery.py). An RLVR
step whose completions its model cannot hold after the longest prompt is refused before any compute."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from helpers import Stopped, fixture_as_first_reviewed, spy_calls
from posttraining.never_ends import NeverEnds
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.schema import DpoStep, PostTrainingEval, RlvrStep, SftStep
from ito_assets.manifest.verify import verify_manifest
from ito_assets.posttraining import on_worker, pipeline, sampling
from ito_assets.posttraining.base import seeded
from ito_assets.posttraining.decoding import encode_prompt
from ito_assets.posttraining.fixtures import check_completions, instruction_pairs, preference_pairs, write_jsonl
from ito_assets.posttraining.generation import GenerationConfig, make_group
from ito_assets.posttraining.pipeline import DPO_FILE, SFT_FILE, battery, longest_prompt, run_stage
from ito_assets.posttraining.policy import token_logprobs
from ito_assets.posttraining.rlvr import RlvrConfig
from ito_assets.posttraining.rollouts import collate
from ito_assets.posttraining.stage import PostTrainingRuntime
from ito_assets.training.model_config import config_by_name

RUNTIME = PostTrainingRuntime()
EVALUATION = PostTrainingEval(num_prompts=4)  # the manifest's eval battery, small
TRAIN, _ = battery()


def _bound(data_root: Path, name: str, pairs: list) -> dict:
    path = data_root / "pairs" / name
    write_jsonl(path, pairs)
    return {"uri": f"dataroot://pairs/{name}", "format": "jsonl", "license": "CC0-1.0",
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def _sft(data_root: Path, num_pairs: int, batch_size: int) -> SftStep:
    data = _bound(data_root, SFT_FILE, instruction_pairs(TRAIN[:num_pairs], copies=1, seed=0, error_rate=0.0))
    return SftStep.model_validate({"kind": "sft", "batch_size": batch_size, "data": data})


@pytest.mark.parametrize("batch_size,num_steps", [(8, 3), (12, 2), (24, 1)])
def test_sft_takes_as_many_steps_as_the_recipes_batch_size_makes(tmp_path, batch_size, num_steps):
    step = _sft(tmp_path, 24, batch_size)
    outcome = run_stage(step, start=seeded(), data_root=tmp_path, out_dir=tmp_path / "out", runtime=RUNTIME,
                        evaluation=EVALUATION)
    assert len(outcome.metrics["loss_curve"]) == num_steps


@pytest.mark.parametrize("batch_size,refused", [(24, False), (25, True)])
def test_a_pair_file_is_refused_below_one_batch_of_the_recipes_size(tmp_path, batch_size, refused):
    step = _sft(tmp_path, 24, batch_size)
    if not refused:
        run_stage(step, start=seeded(), data_root=tmp_path, out_dir=tmp_path / "out", runtime=RUNTIME,
                  evaluation=EVALUATION)
        return
    with pytest.raises(ItoError) as error:
        run_stage(step, start=seeded(), data_root=tmp_path, out_dir=tmp_path / "out", runtime=RUNTIME,
                  evaluation=EVALUATION)
    assert error.value.code is ErrorCode.POSTTRAINING_DATA_INVALID and "fewer than one batch of 25" in error.value.message


def test_dpo_takes_as_many_steps_as_the_recipes_batch_size_makes(tmp_path):
    data = _bound(tmp_path, DPO_FILE, preference_pairs(TRAIN[:16], copies=1, seed=0))
    step = DpoStep.model_validate({"kind": "dpo", "batch_size": 4, "data": data})
    outcome = run_stage(step, start=seeded(), data_root=tmp_path, out_dir=tmp_path / "out", runtime=RUNTIME,
                        evaluation=EVALUATION)
    assert len(outcome.metrics["loss_curve"]) == len(preference_pairs(TRAIN[:16], copies=1, seed=0)) // 4


def test_rlvr_runs_the_recipes_steps_of_its_groups(tmp_path):
    step = RlvrStep.model_validate({"kind": "rlvr", "num_steps": 2, "groups_per_step": 3, "group_size": 2})
    outcome = run_stage(step, start=seeded(), data_root=tmp_path, out_dir=tmp_path / "out", runtime=RUNTIME,
                        evaluation=EVALUATION)
    assert len(outcome.metrics["reward_curve"]) == 2
    # the groups a step trains on: the loop's config is the step's (the run's own figures do not count them)
    config = RlvrConfig.from_step(step)
    assert (config.num_steps, config.groups_per_step, config.group_size) == (2, 3, 2)


@pytest.mark.parametrize("max_draws", [1, 10])
def test_rlvr_draws_no_more_groups_than_priced_and_counts_them(tmp_path, monkeypatch, max_draws):
    """Redrawn groups (all rewards equal: an untrained policy's common case, or too stale) are
    priced at the step's draw bound, which the stage never passes; it records what it drew
    beside the priced groups (the plan's warning: its tests). At 1 a group, a step draws its
    groups once and trains on those that had signal."""
    filled = []

    def counted(*args, **kwargs):
        filled.append(real(*args, **kwargs))
        return filled[-1]

    real = sampling.fill_batch
    monkeypatch.setattr(sampling, "fill_batch", counted)
    step = RlvrStep.model_validate({"kind": "rlvr", "num_steps": 3, "groups_per_step": 2, "group_size": 2,
                                    "max_draws_per_group": max_draws})
    outcome = run_stage(step, start=seeded(), data_root=tmp_path, out_dir=tmp_path / "out", runtime=RUNTIME,
                        evaluation=EVALUATION)
    figures = outcome.metrics["generation_calibration"]
    drawn = sum(batch.num_drawn for batch in filled)
    assert len(filled) == 3 and all(batch.num_drawn <= 2 * max_draws for batch in filled)
    assert figures["planned_groups"] == 6 * max_draws and figures["drawn_groups"] == drawn <= 6 * max_draws
    assert figures["ratio"] == round(drawn / (6 * max_draws), 4) and figures["overdrawn"] is False
    if max_draws == 1:
        assert drawn == 6
    assert "generation_calibration" not in run_stage(
        _sft(tmp_path, 24, 24), start=seeded(), data_root=tmp_path, out_dir=tmp_path / "out-sft", runtime=RUNTIME,
        evaluation=EVALUATION).metrics


# --- RLVR's completion length and overlong window --------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
# The fixture manifest as reviewed before the recipe held RLVR's completion length: its bytes, and
# so its digest and every confirmation of it, are unchanged (it binds its decision's baseline
# since; `fixture_as_first_reviewed` leaves it out again).
FIXTURE_SHA256 = "2735bd518eaaf99cc3597f486e2e8ccea840531171211bf36921e75984e9bb3c"


def test_a_manifest_without_the_fields_keeps_its_digest_and_means_what_it_meant(tmp_path):
    fixture = fixture_as_first_reviewed("fixture-small.json", tmp_path)
    assert hashlib.sha256(fixture.read_bytes()).hexdigest() == FIXTURE_SHA256
    verified = verify_manifest(str(fixture))
    assert verified.raw.sha256_hex == FIXTURE_SHA256
    [step] = [s for s in verified.manifest.post_training if s.kind == "rlvr"]
    assert "max_new_tokens" not in fixture.read_text() and "overlong_cache" not in fixture.read_text()
    # what RLVR generated with before: the posttraining resource's 8 and 4
    config = RlvrConfig.from_step(step)
    assert (config.max_new_tokens, config.overlong_cache) == (8, 4)
    assert step == RlvrStep.model_validate({**step.model_dump(), "max_new_tokens": 8, "overlong_cache": 4})
    # and the draws a group it ran with: verl's bound of 10, then a constant of the sampling
    assert "max_draws_per_group" not in fixture.read_text() and config.max_draws_per_group == 10


def test_rlvr_generates_with_the_recipes_completion_length_and_the_battery_with_its_own(tmp_path, monkeypatch):
    """The step's L_max 4 and L_cache 2, not the battery's 8, reach RLVR's loop; the evaluation
    battery keeps its own (the manifest's `post_training_eval`)."""
    step = RlvrStep.model_validate({"kind": "rlvr", "num_steps": 1, "groups_per_step": 1, "group_size": 2,
                                    "max_new_tokens": 4, "overlong_cache": 2})
    trained = spy_calls(monkeypatch, pipeline, "run_rlvr")
    evaluated = spy_calls(monkeypatch, pipeline, "evaluate_reward")
    run_stage(step, start=seeded(), data_root=tmp_path, out_dir=tmp_path / "out", runtime=RUNTIME,
              evaluation=EVALUATION)
    [(args, _)] = trained
    config = args[4]
    assert (config.max_new_tokens, config.overlong_cache) == (4, 2)
    assert (config.generation().max_new_tokens, config.generation().overlong_cache) == (4, 2)
    assert EVALUATION.max_new_tokens == 8
    assert [kwargs["max_new_tokens"] for _, kwargs in evaluated] == [8, 8]  # before and after


def test_rlvr_on_the_worker_sizes_its_rows_by_the_recipes_completion_length(tmp_path, monkeypatch):
    step = RlvrStep.model_validate({"kind": "rlvr", "max_new_tokens": 5, "overlong_cache": 3})
    configs = spy_calls(monkeypatch, on_worker, "_config", stop=True)
    with pytest.raises(Stopped):
        run_stage(step, start=seeded(), data_root=tmp_path, out_dir=tmp_path / "out", runtime=RUNTIME,
                  evaluation=EVALUATION, launch=object())
    [((stage, _rows), kwargs)] = configs
    assert kwargs["sequence_length"] == longest_prompt(seeded().codec(), TRAIN) + 5
    assert (stage.reinforcement.max_new_tokens, stage.reinforcement.overlong_cache) == (5, 3)


def _edge() -> tuple[int, int]:
    """(the longest train prompt with bos, the largest max_new_tokens its model holds after it)."""
    prompt = longest_prompt(seeded().codec(), TRAIN)
    return prompt, config_by_name(seeded().model_name).max_seq_len + 1 - prompt


def test_the_longest_completion_the_check_admits_is_the_longest_the_model_holds():
    """What `check_completions` counts is what generation and training feed the model: at the
    edge, completions that never end fill exactly max_seq_len positions; one token more fails the
    model itself, mid-generation."""
    prompt_length, edge = _edge()
    max_positions = config_by_name(seeded().model_name).max_seq_len
    codec = seeded().codec()
    task = max(TRAIN, key=lambda t: len(encode_prompt(codec, t.prompt)))
    policy = NeverEnds(seeded().factory()(), codec.eos_id)
    check_completions(prompt_length, edge, max_positions=max_positions)
    group = make_group(policy, codec, task, version=0,
                       config=GenerationConfig(group_size=2, max_new_tokens=edge, overlong_cache=1))
    assert all(r.truncated and len(r.completion_ids) == edge for r in group.rollouts)
    tokens = collate([group], pad_id=codec.pad_id).tokens
    assert tokens[:, :-1].shape[1] == max_positions
    assert token_logprobs(policy, tokens).shape == (2, max_positions)
    with pytest.raises(ItoError) as error:
        check_completions(prompt_length, edge + 1, max_positions=max_positions)
    assert error.value.code is ErrorCode.POSTTRAINING_DATA_INVALID
    with pytest.raises(ValueError, match="max_seq_len"):
        make_group(policy, codec, task, version=0,
                   config=GenerationConfig(group_size=2, max_new_tokens=edge + 1, overlong_cache=1))


@pytest.mark.parametrize("past_the_edge", [0, 1])
def test_a_completion_the_model_cannot_hold_is_refused_before_any_compute(tmp_path, monkeypatch, past_the_edge):
    """At the edge the stage goes on to its first compute (the battery before training, stopped
    here); one token past it, POSTTRAINING_DATA_INVALID before that, naming the positions."""
    prompt_length, edge = _edge()
    max_new_tokens = edge + past_the_edge
    step = RlvrStep.model_validate({"kind": "rlvr", "max_new_tokens": max_new_tokens})
    evaluated = spy_calls(monkeypatch, pipeline, "_evaluate", stop=True)
    if not past_the_edge:
        with pytest.raises(Stopped):
            run_stage(step, start=seeded(), data_root=tmp_path, out_dir=tmp_path / "out", runtime=RUNTIME,
                      evaluation=EVALUATION)
        assert len(evaluated) == 1
        return
    with pytest.raises(ItoError) as error:
        run_stage(step, start=seeded(), data_root=tmp_path, out_dir=tmp_path / "out", runtime=RUNTIME,
                  evaluation=EVALUATION)
    assert error.value.code is ErrorCode.POSTTRAINING_DATA_INVALID
    max_positions = config_by_name(seeded().model_name).max_seq_len
    assert error.value.message == (
        f"the rlvr step's completions of up to {max_new_tokens} tokens (max_new_tokens) after its longest prompt "
        f"of {prompt_length} need {max_positions + 1} positions; the model holds {max_positions}")
    assert evaluated == []
    assert not (tmp_path / "out" / "rlvr" / "policy.pt").exists()
