"""Detection and recovery seconds of the supervisor under injected faults, and the seed noise bands
the stage gates use.

On the fixture corpora (all three, tokenized by the run's own BPE), the `tiny` model trains
fixture-small's pretraining stage as the training assets size it: the plan's global batch and
data-parallel strategy on the default booked hardware (`BookedHardwareResource`), world size 2 on
gloo, under the supervisor, then runs the stage's eval battery (held-out loss and answer loss on
the fixture eval suite):
  clean     seeds 0, 1, 2 with no fault: goodput, and the battery whose sample standard deviations
            over seeds are the noise bands `HELDOUT_LOSS_NOISE_BAND` and `ANSWER_LOSS_NOISE_BAND`
  sigkill   rank 1 killed (SIGKILL) mid-step after the first whole checkpoint
  hang      rank 0 stopped (SIGSTOP) after the first whole checkpoint: alive and silent
For each fault: detection seconds (last heartbeat to decision), recovery seconds (decision to the
first step of the next attempt), and the stage's goodput with its badput split.

    .venv/bin/python benchmarks/fault_recovery.py [--hang-timeout 10] [--seeds 0 1 2] [--faults sigkill hang]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from ito_assets.defs.decision.resources import BookedHardwareResource  # noqa: E402
from ito_assets.defs.training.resources import TrainingRuntimeResource  # noqa: E402
from ito_assets.evals.suite import load_suite  # noqa: E402
from ito_assets.manifest.schema import Manifest  # noqa: E402
from ito_assets.runtime.stage import corpus  # noqa: E402
from ito_assets.runtime.record import events  # noqa: E402
from ito_assets.runtime.supervision import heartbeat  # noqa: E402
from ito_assets.runtime.checkpoint import registry  # noqa: E402
from ito_assets.runtime.stage import curriculum as stages  # noqa: E402
from ito_assets.runtime.stage.config import WorkerConfig  # noqa: E402
from ito_assets.runtime.supervision.supervisor import Supervisor, SupervisorConfig  # noqa: E402
from ito_assets.runtime.worker import execution  # noqa: E402
from ito_assets.runtime.record.goodput import summarize  # noqa: E402
from ito_assets.training.run_plan import plan_run  # noqa: E402
from ito_assets.training.tokenizer import TokenizerConfig  # noqa: E402

FIXTURES = ROOT / "data" / "fixtures"
WORLD_SIZE = 2
FAULTS = {"sigkill": (1, signal.SIGKILL), "hang": (0, signal.SIGSTOP)}


def _texts() -> list[str]:
    folder = ROOT / "data" / "fixtures" / "corpora"
    return [json.loads(line)["text"] for path in sorted(folder.glob("*.jsonl")) for line in path.read_text().splitlines()]


def _config(root: Path, tokens: corpus.TokenSet, *, seed: int) -> WorkerConfig:
    """fixture-small's pretraining stage, sized as `_stage_config` in the training assets sizes it
    (the training runtime's defaults decide compile and precision on this host)."""
    manifest = Manifest.model_validate_json((FIXTURES / "manifests" / "fixture-small.json").read_bytes())
    run_plan = plan_run(manifest, BookedHardwareResource().hardware(), pair_shapes=None)  # its curriculum
    runtime, has_cuda = TrainingRuntimeResource(), torch.cuda.is_available()
    sizing = stages.sizing_from_plan(stages.stage_plan(run_plan, "pretraining"), vocab_size=tokens.vocab_size,
                                     world_size=WORLD_SIZE, seed=seed,
                                     eager_reason=runtime.eager_reason(has_cuda=has_cuda),
                                     fp32_reason=runtime.fp32_reason(has_cuda=has_cuda,
                                                                     native_cpu_bf16=execution.native_cpu_bf16()))
    suite_path = FIXTURES / "evals" / "ito-fixture-evals-v1.jsonl"
    return stages.worker_config(
        run_key=f"bench-{root.name}", stage=manifest.training_target.stages[0], policy=manifest.checkpoint_policy,
        layout=stages.RunLayout(checkpoint_dir=root, run_dir=root), sizing=sizing,
        tokens_path=Path(tokens.train_path), heldout_path=Path(tokens.heldout_path), init_from=None,
        tokenizer_path=tokens.tokenizer_path, eval_suite_path=str(suite_path),
        eval_suite_sha256=load_suite(suite_path).digest)


def _inject(config: WorkerConfig, rank: int, number: int) -> None:
    """Wait until a whole checkpoint exists and `rank` is training past it, then send `number`."""
    while True:
        beat = heartbeat.read_all(Path(config.heartbeat_dir), attempt=0).get(rank)
        saved = registry.read(Path(config.stage_dir))
        if saved and beat is not None and beat.step > saved[0].step and beat.phase == "training":
            os.kill(beat.pid, number)
            return
        time.sleep(0.01)


def _run(config: WorkerConfig, supervisor: SupervisorConfig, fault: tuple[int, int] | None) -> dict:
    reports = []
    thread = threading.Thread(target=lambda: reports.append(Supervisor(worker=config, config=supervisor).run()))
    thread.start()
    if fault is not None:
        _inject(config, *fault)
    thread.join()
    (report,) = reports
    telemetry = summarize(events.read(Path(config.stage_dir)))
    return {
        "outcome": report.outcome, "num_attempts": report.num_attempts,
        "faults": [{"kind": f.kind, "detection_s": round(f.detection_seconds, 2),
                    "recovery_s": None if f.recovery_seconds is None else round(f.recovery_seconds, 2)}
                   for f in report.faults],
        "num_steps": config.num_steps, "batch_size": config.batch_size, "layout": config.layout.describe(),
        "eval": report.result["eval"] if report.result else None,
        "goodput": round(telemetry.goodput, 4),
        "badput_s": {k: round(v, 2) for k, v in telemetry.as_row().items() if k.startswith("badput_")},
        "checkpoint_blocking_s": round(telemetry.checkpoint_blocking_seconds, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hang-timeout", type=float, default=10.0)
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--faults", nargs="*", choices=sorted(FAULTS), default=sorted(FAULTS))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ito-fault-bench-"))
    try:
        print(json.dumps(_measure(work, args), indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _measure(work: Path, args: argparse.Namespace) -> dict:
    tokens = corpus.prepare(_texts(), work / "tokens", config=TokenizerConfig())
    supervisor = SupervisorConfig(nproc_per_node=WORLD_SIZE, hang_timeout_s=args.hang_timeout, startup_timeout_s=120.0,
                                  poll_interval_s=0.5, grace_s=10.0, max_restarts=2)
    figures: dict = {"hang_timeout_s": args.hang_timeout, "poll_interval_s": supervisor.poll_interval_s, "runs": {}}
    for seed in args.seeds:
        figures["runs"][f"clean-seed{seed}"] = _run(_config(work / f"clean{seed}", tokens, seed=seed), supervisor, None)
    battery = [figures["runs"][f"clean-seed{s}"]["eval"] for s in args.seeds]
    if len(battery) > 1:
        figures["seed_stdev"] = {name: statistics.stdev(b[name] for b in battery) for name in battery[0]}
    for name in args.faults:
        # A whole checkpoint to recover from before the fault: fixture-small's 50-step interval is
        # longer than its 13-step pretraining stage at the plan's batch.
        config = replace(_config(work / name, tokens, seed=0), interval_steps=4)
        figures["runs"][name] = _run(config, supervisor, FAULTS[name])
    return figures


if __name__ == "__main__":
    main()
