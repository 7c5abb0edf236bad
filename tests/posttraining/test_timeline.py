"""A post-training stage's time in the runtime event log: `run_stage` writes one event per
optimizer step with the loss it reports, its evaluations and its save, and the stage's window
last, also when the stage fails after it began; telemetry reads it as it reads a pretraining
stage's log (ito_assets.posttraining.timeline)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.schema import PostTrainingEval, SftStep
from ito_assets.posttraining.base import seeded
from ito_assets.posttraining.fixtures import instruction_pairs, write_jsonl
from ito_assets.posttraining.pipeline import SFT_FILE, battery, run_stage
from ito_assets.posttraining.stage import PostTrainingRuntime
from ito_assets.runtime.record import events
from ito_assets.runtime.record.events import EventKind
from ito_assets.runtime.record.goodput import summarize

RUNTIME = PostTrainingRuntime()
EVALUATION = PostTrainingEval(num_prompts=8)  # the manifest's battery, small


def _sft_step(data_root: Path, *, num_pairs: int) -> SftStep:
    train, _ = battery()
    path = data_root / "pairs" / SFT_FILE
    write_jsonl(path, instruction_pairs(train[:num_pairs], copies=1, seed=0, error_rate=0.0))
    data = {"uri": f"dataroot://pairs/{SFT_FILE}", "format": "jsonl", "license": "CC0-1.0",
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    return SftStep.model_validate({"kind": "sft", "num_epochs": 1, "data": data})


def test_each_optimizer_step_evaluation_and_save_is_an_event_inside_the_stages_window(tmp_path):
    step = _sft_step(tmp_path, num_pairs=24)  # 3 steps of 8 pairs
    outcome = run_stage(step, start=seeded(), data_root=tmp_path, out_dir=tmp_path / "out", runtime=RUNTIME,
                        evaluation=EVALUATION)
    folder = Path(outcome.stage_dir)
    assert folder == tmp_path / "out" / "sft"
    log = events.read(folder)
    kinds = [e.kind for e in log]
    assert kinds[0] is EventKind.RESUME and kinds[-1] is EventKind.ALLOCATION  # the window is written last
    steps = [e for e in log if e.kind is EventKind.STEP]
    assert [e.step for e in steps] == [1, 2, 3] and [e.loss for e in steps] == outcome.metrics["loss_curve"]
    (saved,) = [e for e in log if e.kind is EventKind.CHECKPOINT]
    assert saved.num_bytes == outcome.checkpoint.num_bytes and saved.step == 3
    assert kinds.count(EventKind.EVALUATION) == 2  # the first stage measures its start, then its end
    figures = summarize(log, posttraining=True)
    assert figures.num_steps == 3 and figures.posttraining_seconds == figures.allocated_seconds > 0
    assert figures.other_seconds >= 0 and figures.productive_seconds > 0


def test_a_stage_that_fails_after_it_began_still_closes_its_window(tmp_path):
    step = _sft_step(tmp_path, num_pairs=8)
    (tmp_path / "pairs" / SFT_FILE).write_text("{}\n")  # changed after the manifest bound it
    with pytest.raises(ItoError) as refused:
        run_stage(step, start=seeded(), data_root=tmp_path, out_dir=tmp_path / "out", runtime=RUNTIME,
                  evaluation=EVALUATION)
    assert refused.value.code is ErrorCode.SOURCE_DIGEST_MISMATCH
    log = events.read(tmp_path / "out" / "sft")
    assert [e.kind for e in log] == [EventKind.RESUME, EventKind.ALLOCATION]
    assert not (tmp_path / "out" / "sft" / "policy.pt").exists()


def test_a_rerun_in_the_same_folder_is_the_next_attempt_and_wastes_the_first(tmp_path):
    step = _sft_step(tmp_path, num_pairs=16)
    for _ in range(2):
        run_stage(step, start=seeded(), data_root=tmp_path, out_dir=tmp_path / "out", runtime=RUNTIME,
                  evaluation=EVALUATION)
    log = events.read(tmp_path / "out" / "sft")
    assert sorted({e.attempt for e in log}) == [0, 1]
    figures = summarize(log, posttraining=True)
    assert (figures.num_steps, figures.num_wasted_steps) == (2, 2)
