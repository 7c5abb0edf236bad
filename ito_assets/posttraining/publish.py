"""A finished post-training stage's figures into the ledger, where `ito metrics` and `ito
checkpoints` read them, named `<stage>/<metric>` as the pretraining stages' are
(`ito_assets.runtime.record.publish`).

    curves, at the stage's optimizer step:  <stage>/loss, dpo/accuracy, rlvr/reward,
                                            rlvr/kl_to_reference, rlvr/clip_fraction
    once, at the stage's last step:         <stage>/heldout_reward (+ _before, _standard_error),
                                            <stage>/heldout_greedy_accuracy,
                                            <stage>/heldout_kl_to_reference, <stage>/gate_passed,
                                            <stage>/gate_delta, <stage>/train_seconds
    RLVR's staleness histogram:             rlvr/staleness_admitted/<k>, rlvr/staleness_dropped/<k>,
                                            rlvr/num_dropped_stale, rlvr/num_dropped_all_equal,
                                            rlvr/num_weight_syncs

Curves are thinned to at most `MAX_CURVE_POINTS` points (the last always kept). Publishing twice
adds nothing: (step, name) pairs already in the ledger for the run are skipped (the first value
published stands, as for the pretraining stages), and a checkpoint is listed once per file digest.
"""

from __future__ import annotations

from ito_assets.control import telemetry as ledger_telemetry
from ito_assets.control.ledger import Ledger
from ito_assets.posttraining.stage import StageOutcome

# 100 points draw a readable curve in any plot, and keep a 10,000-step stage to 100 ledger rows.
MAX_CURVE_POINTS = 100
_CURVES = {"loss_curve": "loss", "accuracy_curve": "accuracy", "reward_curve": "reward",
           "kl_curve": "kl_to_reference", "clip_fraction_curve": "clip_fraction"}


def _thinned(values: list[float]) -> list[tuple[int, float]]:
    """(step, value) with step 1-based (the policy version after that optimizer step)."""
    stride = max(1, -(-len(values) // MAX_CURVE_POINTS))
    return [(i + 1, float(v)) for i, v in enumerate(values) if (i + 1) % stride == 0 or i == len(values) - 1]


def _staleness(stage: str, last: int, histogram: dict) -> list[tuple[int, str, float]]:
    rows = [(last, f"{stage}/staleness_admitted/{k}", float(n)) for k, n in histogram["admitted_by_staleness"].items()]
    rows += [(last, f"{stage}/staleness_dropped/{k}", float(n)) for k, n in histogram["dropped_by_staleness"].items()]
    return rows + [(last, f"{stage}/num_dropped_stale", float(histogram["num_dropped_stale"]))]


def stage_metrics(outcome: StageOutcome) -> list[tuple[int, str, float]]:
    stage, metrics, last = outcome.stage, outcome.metrics, outcome.checkpoint.policy_version
    rows = [(step, f"{stage}/{name}", value) for key, name in _CURVES.items() if key in metrics
            for step, value in _thinned(metrics[key])]
    rows += [
        (last, f"{stage}/heldout_reward_before", outcome.eval_before.mean_reward),
        (last, f"{stage}/heldout_reward", outcome.eval_after.mean_reward),
        (last, f"{stage}/heldout_reward_standard_error", outcome.eval_after.standard_error),
        (last, f"{stage}/heldout_greedy_accuracy", outcome.eval_after.greedy_accuracy),
        (last, f"{stage}/heldout_kl_to_reference", metrics["kl_to_reference"]),
        (last, f"{stage}/gate_passed", float(outcome.gate.passed)),
        (last, f"{stage}/gate_delta", outcome.gate.delta),
        (last, f"{stage}/train_seconds", metrics["train_seconds"]),
    ]
    if "staleness" in metrics:
        rows += _staleness(stage, last, metrics["staleness"])
        rows += [(last, f"{stage}/{name}", float(metrics[name])) for name in ("num_dropped_all_equal", "num_weight_syncs")]
    return rows


def publish_outcome(ledger: Ledger, run_id: str, outcome: StageOutcome) -> tuple[int, int]:
    """Returns (checkpoints added, metrics added); the checkpoint is known by its file's (path, sha256)."""
    record = outcome.checkpoint
    finished = ledger_telemetry.FinishedCheckpoint(step=record.policy_version, path=record.path,
                                                   size_bytes=record.num_bytes, sha256=record.sha256)
    return ledger_telemetry.publish(ledger, run_id, [finished], stage_metrics(outcome), same_checkpoint=("path", "sha256"))
