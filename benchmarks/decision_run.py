"""A decision run on the fixtures, timed: the embedded default's candidate
(the fixture manifest's corpora) against its baseline (the reference corpus), with the default
`DecisionConfig` (tiny, three seeds), then the economics on the default booked hardware. Each
trainer named runs in turn (default: both), the arms on the stage worker as the asset trains them
(`stage_worker`) and in this process with the trainer's loop (`in_process`), and the ratio of
their wall times is printed.

The candidate is read from the manifest's data references (digest-checked). The Dagster asset
reads the data stage's clean shards instead, which hold the same documents less the duplicates and
contaminated ones; deduplication would not change what this measures (time, verdict shape).

    .venv/bin/python benchmarks/decision_run.py [--manifest data/fixtures/manifests/fixture-small.json] [--threads 0]
        [--trainers stage_worker in_process]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from ito_assets.data.sources import read_source  # noqa: E402
from ito_assets.defs.decision.assets import arm_launch  # noqa: E402
from ito_assets.defs.decision.params import DecisionRunParams  # noqa: E402
from ito_assets.evals.suite import load_suite  # noqa: E402
from ito_assets.manifest.schema import Manifest  # noqa: E402
from ito_assets.settings import load_settings  # noqa: E402
from ito_assets.training.decision import run_decision  # noqa: E402
from ito_assets.training.decision_config import DecisionConfig  # noqa: E402
from ito_assets.training.decision_gate import judge_decision  # noqa: E402
from ito_assets.training.economics import EconomicsConfig  # noqa: E402
from ito_assets.training.hardware import gpu_spec, network_spec  # noqa: E402
from ito_assets.training.mixtures import DEFAULT_BASELINE_URIS, read_mixture  # noqa: E402
from ito_assets.training.planner import Hardware  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", default=str(ROOT / "data/fixtures/manifests/fixture-small.json"))
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--trainers", nargs="+", default=["stage_worker", "in_process"],
                        choices=["stage_worker", "in_process"])
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = load_settings()
    manifest = Manifest.model_validate_json(Path(args.manifest).read_bytes())
    candidate = [t for i, ref in enumerate(manifest.data) for t in read_source(ref, i, settings.data_root)[0]["text"].to_list()]
    baseline = read_mixture(DEFAULT_BASELINE_URIS, settings.data_root).texts
    suite = load_suite(settings.eval_suite_path)
    walls = {}
    for trainer in args.trainers:
        with tempfile.TemporaryDirectory() as work_dir:
            started = time.perf_counter()
            result = run_decision(candidate_texts=candidate, baseline_texts=baseline, eval_items=suite.items,
                                  config=DecisionConfig(), work_dir=Path(work_dir),
                                  trainer=arm_launch(DecisionRunParams(trainer=trainer)))
            walls[trainer] = time.perf_counter() - started
        _report(trainer, result, walls[trainer], manifest, args)
    if len(walls) == 2:
        print(json.dumps({"stage_worker_over_in_process": round(walls["stage_worker"] / walls["in_process"], 2)}))


def _report(trainer: str, result, wall: float, manifest, args) -> None:
    hardware = Hardware(gpu=gpu_spec("H100-SXM"), network=network_spec("infiniband"), num_nodes=1, gpus_per_node=8, price_cents_per_gpu_hour=250)
    judged = judge_decision(result, manifest, hardware, EconomicsConfig())
    print(json.dumps({
        "trainer": trainer, "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(), "load_average_1m": os.getloadavg()[0],
        "manifest": Path(args.manifest).name, "wall_seconds": round(wall, 1), "train_wall_seconds": round(result.train_wall_seconds, 1),
        "num_runs": len(result.runs), "tokens_per_run": result.num_tokens_per_run, "model": result.model_name,
        "verdict": result.verdict.value, "difference": round(result.difference, 4),
        "half_width": None if result.half_width is None else round(result.half_width, 4),
        "candidate_mean": round(result.candidate.mean, 4), "baseline_mean": round(result.baseline.mean, 4),
        "economics": judged.economics.to_dict() if judged.economics else judged.plan_refusal,
    }, indent=1))


if __name__ == "__main__":
    main()
