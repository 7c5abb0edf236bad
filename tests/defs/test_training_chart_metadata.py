"""The training assets' charts and tables: a stage's loss chart against its eval gate and its layout
fallbacks as a table; `training_telemetry`'s goodput chart, goodput table and step-time chart,
from event logs written the way the runtime writes them (no training runs here)."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

import dagster as dg  # noqa: E402
from types import SimpleNamespace  # noqa: E402

from ito_assets.defs.resources import ItoSettingsResource, LedgerResource  # noqa: E402
from ito_assets.defs.telemetry.assets import training_telemetry  # noqa: E402
from ito_assets.defs.training.stage_outcome import gate_marks, outcome_metadata  # noqa: E402
from ito_assets.posttraining.timeline import StageTimeline  # noqa: E402
from ito_assets.runtime.record import events  # noqa: E402
from ito_assets.runtime.record.events import Event, EventKind  # noqa: E402
from ito_assets.runtime.stage.eval_gate import Direction, EvalGatePolicy, GatedMetric, judge_stage  # noqa: E402
from ito_assets.runtime.stage.noise import Units  # noqa: E402
from ito_assets.runtime.stage.run import StageCheckpoint  # noqa: E402

POLICY = EvalGatePolicy(metrics=(GatedMetric(name="heldout_loss", direction=Direction.LOWER_IS_BETTER, noise_band=0.1),
                                 GatedMetric(name="answer_loss", direction=Direction.LOWER_IS_BETTER, noise_band=0.2)))
CALIBRATION = {"predicted_step_s": 0.5, "measured_step_s": 0.8, "step_time_ratio": 1.6,
               "predicted_peak_memory_bytes": 2**30, "measured_peak_memory_bytes": 2**29, "peak_memory_source": "rss",
               "device": "CPU", "peak_memory_ratio": 0.5, "flagged": True}


def _steady(values: dict[str, float]) -> dict[str, Units]:
    """Units that agree with one another: no item noise, so each band is the policy's seed band."""
    return {name: Units(loss=(value * 10,) * 4, tokens=(10,) * 4) for name, value in values.items()}


def _stage(tmp_path, name: str, *, previous: dict | None = None) -> StageCheckpoint:
    folder = tmp_path / name
    folder.mkdir()
    at = 1000.0  # the window the supervisor writes at its end: 900 to 1000, every event inside it
    events.append(folder, Event(kind=EventKind.ALLOCATION, at=at, seconds=100.0, num_devices=1))
    events.append(folder, Event(kind=EventKind.STARTUP, at=910.0, seconds=10.0), by_worker=True)
    for step in range(20):
        events.append(folder, Event(kind=EventKind.STEP, at=913.0 + 3 * step, step=step, seconds=3.0, loss=6.0 - 0.2 * step),
                      by_worker=True)
    events.append(folder, Event(kind=EventKind.EVALUATION, at=975.0, seconds=5.0), by_worker=True)
    evals = {"heldout_loss": 2.5, "answer_loss": 4.0}
    verdict = judge_stage(name, _steady(evals), previous or {"heldout_loss": 6.2, "answer_loss": 5.0}, POLICY,
                          previous_stage=None if previous is None else "pretraining")
    layout = {"ran": {"dp_shard": 1}, "fallbacks": [{"field": "compile", "planned": True, "ran": False,
                                                     "reason": "no compiler on this host"}]}
    return StageCheckpoint(stage=name, run_dir=str(tmp_path), stage_dir=str(folder), final_checkpoint=str(folder / "ckpt"),
                           num_steps=20, metadata_sha256="0" * 64, eval=evals, gate=verdict.to_dict(), num_attempts=1,
                           layout=layout, calibration=CALIBRATION)


def _columns(value) -> list[str]:
    return [c.name for c in value.schema.columns]


def test_a_stage_shows_its_loss_chart_and_its_fallbacks_as_a_table(tmp_path):
    stage = _stage(tmp_path, "pretraining")
    metadata = outcome_metadata(stage, POLICY)
    assert metadata["loss_chart"].value.startswith("![pretraining loss and eval gate](data:image/png;base64,")
    assert metadata["final_train_loss"] == pytest.approx(6.0 - 0.2 * 19)  # numeric, for the Plots view
    assert metadata["heldout_loss"] == 2.5 and metadata["goodput"] == pytest.approx(0.6)
    # Figures rounded to what they mean, with their unit in the key; the verdict is a table.
    assert all(round(v, 4) == v for v in metadata.values() if isinstance(v, float))
    assert "checkpoint_bandwidth_mb_per_s" in metadata and "checkpoint_blocking_s" in metadata
    gate = metadata["gate"]
    assert _columns(gate) == ["metric", "value", "reference", "gain", "required gain", "band", "band from", "passed"]
    assert [r.data["metric"] for r in gate.records] == [c["metric"] for c in stage.gate["checks"]]
    assert all(round(v, 4) == v for r in gate.records for v in r.data.values() if isinstance(v, float))
    assert _columns(metadata["layout_ran"]) == ["field", "value"]
    fallbacks = metadata["layout_fallbacks"]
    assert _columns(fallbacks) == ["field", "planned", "ran", "why"]
    assert fallbacks.records[0].data == {"field": "compile", "planned": "True", "ran": "False",
                                         "why": "no compiler on this host"}


def test_gate_marks_place_the_threshold_bands_from_the_reference():
    gate = judge_stage("pretraining", _steady({"heldout_loss": 5.9, "answer_loss": 4.0}), {"heldout_loss": 6.2, "answer_loss": 5.0},
                       POLICY, previous_stage=None).to_dict()
    heldout, answer = gate_marks(gate, POLICY)
    # the first stage must beat the untrained model by 2 bands: threshold 6.2 - 2 x 0.1
    assert heldout["threshold"] == pytest.approx(6.0) and heldout["margin_bands"] == pytest.approx(1.0)
    assert heldout["passed"] and answer["threshold"] == pytest.approx(4.6) and answer["band"] == 0.2
    # without the policy only the verdict's own figures are drawn
    assert "threshold" not in gate_marks(gate, None)[0]


def test_telemetry_shows_goodput_by_cause_and_step_time(tmp_path, installation):
    first = _stage(tmp_path, "pretraining")
    second = _stage(tmp_path, "mid_training", previous=first.eval)
    context = dg.build_asset_context(partition_key="abc123")
    training_telemetry(context=context, ito=ItoSettingsResource.from_settings(installation.settings),
                       ledger=LedgerResource.from_settings(installation.settings),
                       pretraining_checkpoint=first, mid_training_checkpoint=second, long_context_checkpoint=second,
                       sft_checkpoint=None, dpo_checkpoint=None, rlvr_checkpoint=None)
    metadata = context.get_output_metadata("result")
    assert metadata["goodput_chart"].value.startswith("![goodput and badput by cause](data:image/png;base64,")
    table = metadata["goodput_by_stage"]
    assert _columns(table) == ["stage", "goodput %", "device hours", "productive s", "startup s", "checkpoint s",
                               "recovery s", "wasted_step s", "evaluation s", "idle s", "other s",
                               "post-training s", "unplanned interruptions /1000 device-h"]
    assert [r.data["stage"] for r in table.records] == ["pretraining", "mid_training", "run"]
    assert table.records[-1].data["goodput %"] == 60.0 and table.records[-1].data["startup s"] == 20.0
    assert _columns(metadata["step_time"]) == ["stage", "predicted s/step", "measured s/step", "measured/predicted",
                                               "flagged"]
    assert metadata["step_time_chart"].value.startswith("![predicted and measured step time](data:image/png;base64,")
    assert metadata["goodput"] == pytest.approx(0.6)  # the number stays beside the picture
    assert "badput_seconds" not in metadata  # by cause in goodput_by_stage, not a JSON blob
    assert all(round(v, 4) == v for v in metadata.values() if isinstance(v, float))


class _Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


def _posttraining_stage(tmp_path, kind: str, *, starts_at: float) -> SimpleNamespace:
    """A post-training stage's log as its timeline writes it: 2 s start-up, 5 s evaluation, ten
    steps of 3 s, a 1 s save, 4 s evaluation, in a 50 s window (8 s of it other)."""
    clock = _Clock(starts_at)
    timeline = StageTimeline(tmp_path / "posttraining" / kind, clock=clock)
    clock.now += 2
    timeline.startup()
    for seconds, report in ((5, timeline.evaluation), *((3, lambda s: timeline.step(s, 1.0)),) * 10,
                            (1, lambda s: timeline.checkpoint(s, 100)), (4, timeline.evaluation)):
        clock.now += seconds
        report(seconds)
    clock.now = starts_at + 50
    timeline.close()
    return SimpleNamespace(stage=kind, stage_dir=str(tmp_path / "posttraining" / kind))


def test_telemetry_counts_post_training_once_each_with_the_gap_before_it_idle(tmp_path, installation):
    first = _stage(tmp_path, "pretraining")  # its window: 900 to 1000
    sft = _posttraining_stage(tmp_path, "sft", starts_at=1100.0)  # 100 s idle before it
    context = dg.build_asset_context(partition_key="abc123")
    rows = training_telemetry(context=context, ito=ItoSettingsResource.from_settings(installation.settings),
                              ledger=LedgerResource.from_settings(installation.settings), pretraining_checkpoint=first,
                              mid_training_checkpoint=first, long_context_checkpoint=first, sft_checkpoint=sft,
                              dpo_checkpoint=sft, rlvr_checkpoint=sft)  # dpo and rlvr not in the recipe: carried
    assert [r["stage"] for r in rows] == ["pretraining", "sft", "run"]
    sft_row, run = rows[1], rows[-1]
    assert sft_row["allocated_seconds"] == 50 and sft_row["productive_seconds"] == 30
    assert sft_row["posttraining_seconds"] == 50 and rows[0]["posttraining_seconds"] == 0
    assert (sft_row["badput_startup_seconds"], sft_row["badput_evaluation_seconds"],
            sft_row["badput_checkpoint_seconds"], sft_row["badput_other_seconds"]) == (2, 9, 1, 8)
    assert run["allocated_seconds"] == 100 + 50 + 100 and run["badput_idle_seconds"] == 100
    assert run["productive_seconds"] == 60 + 30 and run["posttraining_seconds"] == 50
    buckets = [v for k, v in run.items() if k.startswith("badput_")] + [run["productive_seconds"]]
    assert min(buckets) >= 0 and sum(buckets) == run["allocated_seconds"]
    metadata = context.get_output_metadata("result")
    assert metadata["posttraining_s"] == 50.0 and metadata["stages"] == "pretraining, sft"
    assert [r.data["post-training s"] for r in metadata["goodput_by_stage"].records] == [0.0, 50.0, 50.0]
    assert [r.data["stage"] for r in metadata["step_time"].records] == ["pretraining"]  # nothing priced post-training


def test_a_rerun_post_training_stage_wastes_its_first_attempts_steps(tmp_path):
    from ito_assets.runtime.record.goodput import summarize

    _posttraining_stage(tmp_path, "dpo", starts_at=1000.0)
    _posttraining_stage(tmp_path, "dpo", starts_at=2000.0)  # the stage run again in the same run folder
    log = events.read(tmp_path / "posttraining" / "dpo")
    assert {e.attempt for e in log} == {0, 1}
    figures = summarize(log, posttraining=True)
    assert (figures.num_steps, figures.num_wasted_steps) == (10, 10)
    assert figures.wasted_step_seconds == 30 and figures.posttraining_seconds == figures.allocated_seconds == 100


def test_the_trained_stages_keep_the_runs_order_whatever_order_their_inputs_come_in():
    from ito_assets.defs.telemetry.assets import trained_stages

    names = ["dpo", "long_context", "mid_training", "pretraining", "rlvr", "sft"]  # as Dagster hands them over
    outputs = {f"{name}_checkpoint": SimpleNamespace(stage=name) for name in names}
    assert list(trained_stages(outputs)) == ["pretraining", "mid_training", "long_context", "sft", "dpo", "rlvr"]
    outputs["dpo_checkpoint"] = outputs["sft_checkpoint"]  # dpo left out of the recipe: it hands on sft's record
    assert list(trained_stages(outputs)) == ["pretraining", "mid_training", "long_context", "sft", "rlvr"]
