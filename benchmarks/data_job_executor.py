"""The data job's executor: wall time of `data_preparation_job` against the sum of its steps' own
durations, under Dagster's in-process executor and its multiprocess executor (the embedded
default of the other jobs), on a generated corpus of about 25 MB.

The corpus is `data_scaling.generate` at `--scale` (15: ~25 MB of JSONL from the fixtures, with
exact and near copies and the planted eval items), one JSONL source named by a data manifest
against the committed eval suite, written as `ito data prepare` writes it. Each executor gets a
fresh state folder and Dagster instance (the SQLite embedded default) and runs the job through
`dagster.execute_job`, as the daemon's run worker would; the step durations are the instance's
own (`get_run_step_stats`: STEP_START to STEP_SUCCESS of every asset and check step, which leaves
out the start of a step's process). Wall is the run's start to its end in the instance; "ratio"
is wall / step work. The multiprocess executor runs up to two steps at once here (a check beside
the next asset), so its ratio can stay near 1 while each step's process adds seconds of imports;
CPU is the user + system time of the run's process and every step process it waited for. Each run
is a fresh process (Dagster caches a job it has loaded by its pointer: a second run in one process
would reuse the first one's executor). Trials alternate the executors' order, so that a busy
neighbour on a shared machine weighs on both.

    .venv/bin/python benchmarks/data_job_executor.py [--scale 15] [--trials 2] [--executors in_process multiprocess] [--out benchmarks/results/data_job_executor.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import dagster as dg  # noqa: E402

SUITE = ROOT / "data" / "fixtures" / "evals" / "ito-fixture-evals-v1.jsonl"
EXECUTOR_ENV = "BENCH_DATA_EXECUTOR"
RESULT = "result: "


def data_job() -> dg.JobDefinition:
    """The data job bound to the settings in the environment, under the executor named in
    BENCH_DATA_EXECUTOR (reconstructed by name in every step process of the multiprocess executor)."""
    from ito_assets.defs import data, manifest
    from ito_assets.defs.executors import executor_for
    from ito_assets.defs.jobs import DATA_PREPARATION_JOB, data_preparation_job
    from ito_assets.defs.resources import ItoSettingsResource
    from ito_assets.settings import load_settings

    job = data_preparation_job(executor_for(os.environ[EXECUTOR_ENV]))
    resources = {"ito": ItoSettingsResource.from_settings(load_settings())}
    defs = dg.Definitions.merge(manifest.defs(), data.defs(), dg.Definitions(jobs=[job], resources=resources))
    return defs.resolve_job_def(DATA_PREPARATION_JOB)


def write_corpus(scale: int, folder: Path) -> Path:
    from data_scaling import generate

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "corpus.jsonl"
    path.write_bytes("".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(generate(scale))).encode())
    return path


def run_once(executor: str, corpus_path: Path, work: Path) -> dict:
    from ito_assets.data import corpus
    from ito_assets.evals.suite import load_suite
    from ito_assets.settings import load_settings

    os.environ.update({EXECUTOR_ENV: executor, "ITO_STATE_DIR": str(work / "state"), "DAGSTER_HOME": str(work / "dagster")})
    (work / "dagster").mkdir(parents=True)
    (work / "dagster" / "dagster.yaml").write_bytes((ROOT / "deploy" / "local" / "dagster.yaml").read_bytes())
    settings = load_settings()
    suite = load_suite(SUITE)
    document = corpus.data_manifest("bench", corpus.describe([corpus_path]), suite, "CC0-1.0")
    key = corpus.store_manifest(settings.data_manifests_dir, document).stem
    with dg.DagsterInstance.get() as instance:
        instance.add_dynamic_partitions("manifests", [key])
        cpu = _cpu_seconds()
        started = time.perf_counter()
        with dg.execute_job(dg.reconstructable(data_job), instance, tags={"dagster/partition": key},
                            run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}}) as result:
            success = result.success
        seconds = time.perf_counter() - started
        cpu = _cpu_seconds() - cpu
        record = instance.get_run_record_by_id(result.run_id)
        stats = sorted(instance.get_run_step_stats(result.run_id), key=lambda s: s.start_time)
        num_processes = len({event.dagster_event.pid for event in instance.all_logs(result.run_id) if event.dagster_event})
    steps = {s.step_key: round(s.end_time - s.start_time, 2) for s in stats}
    wall = record.end_time - record.start_time
    work_s = sum(steps.values())
    return {"executor": executor, "success": success, "wall_s": round(wall, 2), "execute_job_s": round(seconds, 2),
            "step_work_s": round(work_s, 2), "ratio": round(wall / work_s, 2), "cpu_s": round(cpu, 2),
            "num_steps": len(steps), "num_processes": num_processes, "steps": steps}


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=15)
    parser.add_argument("--executors", nargs="+", default=["in_process", "multiprocess"])
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", nargs=3, metavar=("EXECUTOR", "CORPUS", "WORK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        executor, corpus_path, work = args.child
        print(RESULT + json.dumps(run_once(executor, Path(corpus_path), Path(work))))
        return
    with tempfile.TemporaryDirectory(prefix="ito-data-job-") as folder:
        root = Path(folder).resolve()
        corpus_path = write_corpus(args.scale, root / "corpus")
        size_mb = corpus_path.stat().st_size / 1e6
        rows = []
        for trial in range(args.trials):
            order = args.executors if trial % 2 == 0 else args.executors[::-1]
            for executor in order:
                child = [sys.executable, __file__, "--child", executor, str(corpus_path), str(root / f"{executor}-{trial}")]
                done = subprocess.run(child, capture_output=True, text=True, check=True)
                line = next(x for x in done.stdout.splitlines() if x.startswith(RESULT))  # step workers print too
                rows.append(dict(json.loads(line[len(RESULT):]), trial=trial))
    result = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, dagster {dg.__version__}",
              "corpus_mb": round(size_mb, 1), "scale": args.scale, "runs": rows}
    print(f"corpus: {size_mb:.1f} MB (scale {args.scale})")
    print("| executor | trial | wall (s) | step work (s) | wall / step work | CPU (s) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['executor']} | {r['trial']} | {r['wall_s']} | {r['step_work_s']} | {r['ratio']} | {r['cpu_s']}{'' if r['success'] else ' (FAILED)'} |")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
