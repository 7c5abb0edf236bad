"""The post-training recipe end to end on CPU (SFT -> DPO -> RLVR on the committed fixtures), over
several seeds: held-out verifiable reward before and after each stage, gate verdicts, KL to the
reference, wall seconds, RLVR throughput (groups per second, generator and trainer in separate
processes) and the staleness histogram. The seed-to-seed spread is the noise band of the figures.

    .venv/bin/python benchmarks/posttraining_recipe.py [--seeds 0 1 2] [--lr-sft 3e-3 --lr-dpo 1e-4 --lr-rlvr 1e-3]
        [--stages sft dpo rlvr] [--on-worker]

The default rates are the tiny-model ones; pass the fixture manifest's (1e-4, 5e-6, 1e-6) to see
the SFT gate stop the chain on a model that rate cannot move in one epoch. `--on-worker` trains
SFT and DPO on the stage worker under the supervisor, as the Dagster assets do (the baseline is the
same recipe in this process: the same batches, loss and optimizer, so the same gate within float
noise).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ito_assets.errors import ItoError  # noqa: E402
from ito_assets.manifest.schema import DataReference, DpoStep, RlvrStep, SftStep  # noqa: E402
from ito_assets.posttraining.base import seeded  # noqa: E402
from ito_assets.posttraining.pipeline import DPO_FILE, SFT_FILE, run_stage  # noqa: E402
from ito_assets.posttraining.stage import PostTrainingRuntime  # noqa: E402
from ito_assets.posttraining.on_worker import WorkerLaunch  # noqa: E402
from ito_assets.runtime.supervision.supervisor import SupervisorConfig  # noqa: E402

DATA_ROOT = ROOT / "data"
FIXTURES = DATA_ROOT / "fixtures" / "posttraining"


def _bound(name: str) -> DataReference:
    """The pair file bound by digest, as the fixture manifest binds it."""
    digest = hashlib.sha256((FIXTURES / name).read_bytes()).hexdigest()
    return DataReference(uri=f"dataroot://fixtures/posttraining/{name}", sha256=digest, license="CC0-1.0",
                         format="jsonl")


def run_recipe(seed: int, rates: tuple[float, float, float], out: Path, *, stages=("sft", "dpo", "rlvr"),
               on_worker: bool = False) -> list[dict]:
    """The small char model from a seeded start (the benchmark of the recipe's loops; the Dagster
    path starts from the pretraining chain's checkpoint and tokenizer instead)."""
    runtime = PostTrainingRuntime(seed=seed)
    steps = (SftStep(kind="sft", learning_rate=rates[0], data=_bound(SFT_FILE)),
             DpoStep(kind="dpo", learning_rate=rates[1], data=_bound(DPO_FILE)),
             RlvrStep(kind="rlvr", learning_rate=rates[2]))
    launch = WorkerLaunch(run=lambda command: subprocess.run(command, check=False), run_key=f"benchmark-{seed}",
                          supervisor=SupervisorConfig(poll_interval_s=0.2)) if on_worker else None
    rows, start = [], seeded(seed=seed)
    for step in (s for s in steps if s.kind in stages):
        started = time.perf_counter()
        try:
            start = run_stage(step, start=start, data_root=DATA_ROOT, out_dir=out / str(seed), runtime=runtime,
                              launch=launch)
        except ItoError as error:
            rows.append({"seed": seed, "stage": step.kind, "refused": error.code.value})
            break
        row = {"seed": seed, "stage": step.kind, "wall_seconds": round(time.perf_counter() - started, 2),
               "gate": start.gate.as_dict(), "kl_to_reference": round(start.metrics["kl_to_reference"], 4),
               "greedy_accuracy_after": start.eval_after.greedy_accuracy}
        if step.kind == "rlvr":
            num_groups = len(start.metrics["reward_curve"]) * step.groups_per_step
            row["rlvr_groups_used_per_second"] = round(num_groups / start.metrics["train_seconds"], 2)
            row["staleness"] = start.metrics["staleness"]
            row["num_dropped_all_equal"] = start.metrics["num_dropped_all_equal"]
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--lr-sft", type=float, default=3e-3)
    parser.add_argument("--lr-dpo", type=float, default=1e-4)
    parser.add_argument("--lr-rlvr", type=float, default=1e-3)
    parser.add_argument("--stages", nargs="+", choices=("sft", "dpo", "rlvr"), default=["sft", "dpo", "rlvr"])
    parser.add_argument("--on-worker", action="store_true", help="SFT and DPO on the stage worker, as the assets train them")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for seed in args.seeds:
            for row in run_recipe(seed, (args.lr_sft, args.lr_dpo, args.lr_rlvr), Path(folder), stages=args.stages,
                                  on_worker=args.on_worker):
                rows.append(row)
                print(json.dumps(row), flush=True)
    for stage in ("sft", "dpo", "rlvr"):
        deltas = [r["gate"]["delta"] for r in rows if r["stage"] == stage and "gate" in r]
        if deltas:
            spread = statistics.stdev(deltas) if len(deltas) > 1 else 0.0
            passed = sum(r["gate"]["passed"] for r in rows if r["stage"] == stage and "gate" in r)
            print(f"{stage}: held-out reward delta mean {statistics.fmean(deltas):+.3f} (seed sd {spread:.3f}), "
                  f"gate passed {passed}/{len(deltas)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
