"""Detection and recovery seconds of the supervisor under injected faults, and the seed noise band
the stage gates use.

On the fixture corpora (all three, tokenized by the run's own BPE), the `tiny` model trains a
pretraining-sized stage (196 steps of 8 x 128 tokens, like fixture-small's 200,000 tokens) under
the supervisor, world size 2 on gloo:
  clean     seeds 0, 1, 2 with no fault: goodput, and the held-out loss whose sample standard
            deviation over seeds is the noise band of `HELDOUT_LOSS_NOISE_BAND`
  sigkill   rank 1 killed (SIGKILL) mid-step after the first whole checkpoint
  hang      rank 0 stopped (SIGSTOP) after the first whole checkpoint: alive and silent
For each fault: detection seconds (last heartbeat to decision), recovery seconds (decision to the
first step of the next attempt), and the stage's goodput with its badput split.

    .venv/bin/python benchmarks/fault_recovery.py [--steps 196] [--hang-timeout 10] [--seeds 0 1 2]
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ito_assets.runtime import corpus, events, heartbeat, registry  # noqa: E402
from ito_assets.runtime.config import WorkerConfig  # noqa: E402
from ito_assets.runtime.supervisor import Supervisor, SupervisorConfig  # noqa: E402
from ito_assets.runtime.telemetry import summarize  # noqa: E402
from ito_assets.training.tokenizer import TokenizerConfig  # noqa: E402


def _texts() -> list[str]:
    folder = ROOT / "data" / "fixtures" / "corpora"
    return [json.loads(line)["text"] for path in sorted(folder.glob("*.jsonl")) for line in path.read_text().splitlines()]


def _config(root: Path, tokens: corpus.TokenSet, *, seed: int, steps: int) -> WorkerConfig:
    return WorkerConfig(
        run_key=f"bench-{root.name}", stage="pretraining", model="tiny", vocab_size=tokens.vocab_size,
        tokens_path=tokens.train_path, heldout_path=tokens.heldout_path, stage_dir=str(root / "pretraining"),
        heartbeat_dir=str(root / "heartbeats"), metrics_path=str(root / "metrics.jsonl"), num_steps=steps,
        batch_size=8, sequence_length=128, interval_steps=50, keep_last=3, seed=seed, launched_at=time.time(),
    )


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
        "heldout_loss": report.result["eval"]["heldout_loss"] if report.result else None,
        "goodput": round(telemetry.goodput, 4),
        "badput_s": {k: round(v, 2) for k, v in telemetry.as_row().items() if k.startswith("badput_")},
        "checkpoint_blocking_s": round(telemetry.checkpoint_blocking_seconds, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=196)
    parser.add_argument("--hang-timeout", type=float, default=10.0)
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ito-fault-bench-"))
    try:
        print(json.dumps(_measure(work, args), indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _measure(work: Path, args: argparse.Namespace) -> dict:
    tokens = corpus.prepare(_texts(), work / "tokens", config=TokenizerConfig())
    supervisor = SupervisorConfig(nproc_per_node=2, hang_timeout_s=args.hang_timeout, startup_timeout_s=120.0,
                                  poll_interval_s=0.5, grace_s=10.0, max_restarts=2)
    figures: dict = {"hang_timeout_s": args.hang_timeout, "poll_interval_s": supervisor.poll_interval_s, "runs": {}}
    for seed in args.seeds:
        figures["runs"][f"clean-seed{seed}"] = _run(_config(work / f"clean{seed}", tokens, seed=seed, steps=args.steps),
                                                    supervisor, None)
    losses = [figures["runs"][f"clean-seed{s}"]["heldout_loss"] for s in args.seeds]
    if len(losses) > 1:
        figures["heldout_loss_seed_stdev"] = statistics.stdev(losses)
    for name, fault in (("sigkill", (1, signal.SIGKILL)), ("hang", (0, signal.SIGSTOP))):
        figures["runs"][name] = _run(_config(work / name, tokens, seed=0, steps=args.steps), supervisor, fault)
    return figures


if __name__ == "__main__":
    main()
