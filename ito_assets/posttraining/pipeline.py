"""One post-training stage end to end, as the Dagster assets run it: start from the policy the
previous stage left (or the pretraining chain's result), refuse to start after a failed gate,
train, evaluate on the held-out battery, save the checkpoint, judge the gate, and return
everything as one frozen record. Its time goes to the runtime event log of its folder
(`timeline.StageTimeline`), where desk telemetry reads it beside the pretraining stages'.

`PostTrainingRuntime` (stage.py, with the record a stage hands on) holds what the manifest does
not say (the battery's train / held-out split, the seed, the host's threads); the manifest's own
fields (learning rates, beta, batch and group sizes, step counts, clip range, staleness bound, RLVR's
completion length and overlong window, the bound pair files, and `post_training_eval`: how many
held-out prompts the battery evaluates and its completion length) always come from the manifest.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import time
from pathlib import Path

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.schema import DpoStep, PostTrainingEval, RlvrStep, SftStep
from ito_assets.posttraining.base import CheckpointRef, PolicySpec
from ito_assets.posttraining.checkpoint import load_policy, save_policy
from ito_assets.posttraining.dpo import DpoConfig, run_dpo
from ito_assets.posttraining.evaluation import RewardEval, evaluate_reward, sampled_kl
from ito_assets.posttraining.fixtures import check_completions, check_pairs, pair_answers, read_bound_pairs
from ito_assets.posttraining.eval_gate import BATTERY, judge_rewards, require_passed
from ito_assets.posttraining.rlvr import RlvrConfig, run_rlvr
from ito_assets.posttraining.sft import SftConfig, run_sft
from ito_assets.posttraining.stage import PostTrainingRuntime, StageOutcome, Start
from ito_assets.posttraining.tasks import Task, battery_split, held_out_refusal, trains_held_out
from ito_assets.posttraining.timeline import StageTimeline
from ito_assets.posttraining.decoding import encode_prompt
from ito_assets.posttraining.on_worker import (WorkerLaunch, dpo_on_worker, refuse_if_running, rlvr_on_worker,
                                               sft_on_worker)
from ito_assets.posttraining.plan import evaluation_calibration, generation_calibration
from ito_assets.runtime.record.storage import held_alone
from ito_assets.training.model_config import config_by_name
from ito_assets.training.threads import torch_threads

SFT_FILE, DPO_FILE = "sft_pairs.jsonl", "dpo_pairs.jsonl"


def battery(evaluation: PostTrainingEval = PostTrainingEval()) -> tuple[list[Task], list[Task]]:
    """(train prompts, held-out eval prompts): the split of the manifest's `post_training_eval`
    (its `held_out_fraction`, one seed for every stage and every run), and the first
    `evaluation.num_prompts` of its held-out side (which the schema keeps within that side)."""
    train, held_out = battery_split(evaluation.held_out_fraction)
    return train, held_out[: evaluation.num_prompts]


def longest_prompt(codec, tasks: list[Task]) -> int:
    """The longest of the tasks' prompts in tokens, bos included: where RLVR's completions start."""
    return max(len(encode_prompt(codec, task.prompt)) for task in tasks)


def _evaluate(policy, codec, tasks, runtime: PostTrainingRuntime, evaluation: PostTrainingEval) -> RewardEval:
    return evaluate_reward(policy, codec, tasks, max_new_tokens=evaluation.max_new_tokens, seed=runtime.seed)


def _train(step, policy, reference, codec, spec: PolicySpec, pairs, train_tasks, runtime,
           on_step, worker: tuple[WorkerLaunch, Path] | None) -> tuple[dict, int]:
    """Run the stage's loop; returns (metrics, optimizer steps). `worker`: the stage trains on the
    stage worker (its launch, the stage folder) instead of in this process."""
    if isinstance(step, SftStep):
        config = SftConfig.from_step(step, seed=runtime.seed)
        if worker is not None:
            result = sft_on_worker(policy, spec, codec, pairs, config, stage_dir=worker[1], launch=worker[0])
        else:
            result = run_sft(policy, codec, pairs, config, on_step)
        return {"loss_curve": list(result.losses), "num_response_tokens": result.num_response_tokens,
                "train_seconds": round(result.wall_seconds, 2)}, result.num_steps
    if isinstance(step, DpoStep):
        config = DpoConfig.from_step(step, seed=runtime.seed)
        if worker is not None:
            # `reference` is the policy as the stage starts: the worker computes it from the same weights.
            result = dpo_on_worker(policy, spec, codec, pairs, config, stage_dir=worker[1], launch=worker[0])
        else:
            result = run_dpo(policy, reference, codec, pairs, config, on_step)
        return {"loss_curve": list(result.losses), "accuracy_curve": list(result.accuracies),
                "final_margin": result.mean_margin, "train_seconds": round(result.wall_seconds, 2)}, result.num_steps
    config = RlvrConfig.from_step(step, seed=runtime.seed)
    if worker is not None:
        result = rlvr_on_worker(policy, spec, train_tasks, config, stage_dir=worker[1], launch=worker[0],
                                prompt_length=longest_prompt(codec, train_tasks))
    else:
        result = run_rlvr(policy, reference, codec, train_tasks, config, policy_factory=spec.factory(),
                          on_step=on_step)
    return {
        "reward_curve": list(result.reward_curve),
        "kl_curve": [s.kl_to_reference for s in result.steps],
        "clip_fraction_curve": [s.clip_fraction for s in result.steps],
        "staleness": result.staleness.as_dict(),
        "num_dropped_all_equal": sum(s.num_dropped_all_equal for s in result.steps),
        "num_weight_syncs": result.num_weight_syncs,
        "num_steps_without_signal": result.num_steps_without_signal,
        "num_groups_drawn": result.num_groups_drawn,
        "train_seconds": round(result.wall_seconds, 2),
    }, result.steps[-1].policy_version if result.steps else 0


def _starting_policy(start: Start):
    """(spec, policy module, previous outcome or None, the checkpoint loaded or None for the seed's
    weights). Each checkpoint is loaded only when its bytes still hash to the digest recorded here."""
    if isinstance(start, StageOutcome):
        loaded = CheckpointRef(path=start.checkpoint.path, sha256=start.checkpoint.sha256)
        return start.policy, load_policy(start.policy.factory()(), start.checkpoint), start, loaded
    return start, start.initial_policy(), None, start.initial_checkpoint()


# Held by a launch of a post-training stage for its whole run (`held_alone`); the supervisor's own
# lock (`supervisor.LOCK_NAME`) is another file, which the launch takes for moments inside it.
LAUNCH_LOCK_NAME = "launch.lock"


def run_stage(
    step: SftStep | DpoStep | RlvrStep, *, start: Start, data_root: Path, out_dir: Path,
    runtime: PostTrainingRuntime = PostTrainingRuntime(), launch: WorkerLaunch | None = None,
    evaluation: PostTrainingEval = PostTrainingEval(),
) -> StageOutcome:
    """Train one stage of the recipe from `start`; pair files resolve under `data_root`. `launch`:
    every stage trains on the stage worker under the supervisor (`on_worker`); without, in this process.
    `evaluation`: the manifest's `post_training_eval`, the held-out battery's sizes."""
    with torch_threads(runtime.num_threads):
        return _run_stage(step, start=start, data_root=data_root, out_dir=out_dir, runtime=runtime, launch=launch,
                          evaluation=evaluation)


def _run_stage(step: SftStep | DpoStep | RlvrStep, *, start: Start, data_root: Path, out_dir: Path,
               runtime: PostTrainingRuntime, launch: WorkerLaunch | None, evaluation: PostTrainingEval) -> StageOutcome:
    if isinstance(start, StageOutcome):  # a failed gate stays failed: refused before anything is read
        require_passed(start.gate)
    stage_dir = out_dir / step.kind
    stage_dir.mkdir(parents=True, exist_ok=True)
    # One launch of the stage at a time, from before its timeline's first event to after its last:
    # two launches that both passed the supervisor's check before either supervisor started would
    # both write their start-up, evaluations and windows into the one log, counted twice.
    with held_alone(stage_dir / LAUNCH_LOCK_NAME, lambda: ItoError(
            ErrorCode.STAGE_BUSY, f"another launch of the {step.kind.upper()} stage runs in {stage_dir}: this one "
            "recorded, evaluated and started nothing (one at a time per stage folder); run it again once that one ended")):
        worker = (launch, stage_dir) if launch is not None else None
        if worker is not None:  # before the timeline and the evaluations write into a running stage's folder
            refuse_if_running(stage_dir)
        timeline = StageTimeline(stage_dir, steps_by_worker=worker is not None)
        try:
            return _timed_stage(step, start, data_root, out_dir, runtime, evaluation, timeline, worker)
        finally:  # a stage that failed held its device too
            timeline.close()


def _timed_stage(step, start: Start, data_root: Path, out_dir: Path, runtime: PostTrainingRuntime,
                 evaluation: PostTrainingEval, timeline: StageTimeline,
                 worker: tuple[WorkerLaunch, Path] | None) -> StageOutcome:
    # The bound pair file is checked against the manifest's digest before any compute is spent.
    pairs = None if isinstance(step, RlvrStep) else read_bound_pairs(step, data_root)
    spec, policy, previous, started_from = _starting_policy(start)
    codec = spec.codec()
    train_tasks, held_out = battery(evaluation)
    max_positions = config_by_name(spec.model_name).max_seq_len
    if pairs is not None:
        fraction = evaluation.held_out_fraction
        number = next((n for n, pair in enumerate(pairs, 1)
                       if trains_held_out(pair.prompt, pair_answers(pair), fraction)), None)
        if number is not None:
            raise ItoError(ErrorCode.POSTTRAINING_DATA_INVALID,
                           held_out_refusal(step.data.uri, number, fraction))
        check_pairs(pairs, codec, max_positions=max_positions, batch_size=step.batch_size, name=step.data.uri)
    else:
        check_completions(longest_prompt(codec, train_tasks), step.max_new_tokens, max_positions=max_positions)
    # The battery's samples (before and after, and the KL's) fit the model as RLVR's must.
    check_completions(longest_prompt(codec, held_out), evaluation.max_new_tokens, max_positions=max_positions,
                      name="the evaluation battery", field="post_training_eval.max_new_tokens")
    reference = copy.deepcopy(policy).eval()  # frozen: the stage's starting point
    timeline.startup()
    evaluated: list[tuple[float, float]] = []  # each evaluation's (CPU, wall) seconds

    @contextlib.contextmanager
    def evaluating():
        cpu, wall = time.process_time(), time.perf_counter()
        yield
        evaluated.append((time.process_time() - cpu, time.perf_counter() - wall))
        timeline.evaluation(evaluated[-1][1])

    before = previous.eval_after if previous is not None else None  # the previous stage's "after"
    first = before is None  # the recipe's first stage: evaluated before its training too, as the plan prices it
    if first:
        with evaluating():
            before = _evaluate(policy, codec, held_out, runtime, evaluation)
    with timeline.handed_to_worker() if worker is not None else contextlib.nullcontext():
        metrics, num_steps = _train(step, policy, reference, codec, spec, pairs, train_tasks, runtime, timeline.step,
                                    worker)
    with evaluating():
        after = _evaluate(policy, codec, held_out, runtime, evaluation)
        metrics["kl_to_reference"] = sampled_kl(policy, reference, codec, held_out,
                                                max_new_tokens=evaluation.max_new_tokens, seed=runtime.seed)
    # The plan's model: the manifest's configuration (its vocabulary the configuration's, which a
    # run's BPE never exceeds), so the price compared is the one the confirmation bound.
    metrics["evaluation_calibration"] = evaluation_calibration(
        config_by_name(spec.model_name), evaluation, first=first, cpu_s=math.fsum(c for c, _ in evaluated),
        wall_s=math.fsum(w for _, w in evaluated))
    if isinstance(step, RlvrStep):
        metrics["generation_calibration"] = generation_calibration(step, metrics["num_groups_drawn"])
    saving = time.perf_counter()
    checkpoint = save_policy(policy, out_dir / step.kind / "policy.pt", stage=step.kind, policy_version=num_steps)
    timeline.checkpoint(time.perf_counter() - saving, checkpoint.num_bytes, step=num_steps)
    gate = judge_rewards(step.kind, before, after, BATTERY[step.kind])
    chain_start = previous.chain_start if previous is not None else started_from
    outcome = StageOutcome(stage=step.kind, policy=spec, checkpoint=checkpoint, gate=gate, eval_before=before,
                           eval_after=after, metrics=metrics, started_from=started_from, chain_start=chain_start)
    write_metrics(outcome, out_dir / step.kind / "metrics.json")
    return outcome


def write_metrics(outcome: StageOutcome, path: Path) -> None:
    """The stage's figures beside its checkpoint, for auditors (`publish` puts them in the ledger)."""
    document = {"stage": outcome.stage, "policy": outcome.policy.as_dict(), "checkpoint": outcome.checkpoint.as_dict(),
                "gate": outcome.gate.as_dict(), "eval_before": outcome.eval_before.as_dict(),
                "eval_after": outcome.eval_after.as_dict(), "metrics": outcome.metrics, **outcome.start_record()}
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
