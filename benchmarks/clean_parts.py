"""The clean stage writing its shards in parts on the step's workers, against its one pass, in the
same run.

The corpus is data_scaling.py's generated one at each of `--scales` (default 64 and 128x the
fixtures). A first subprocess runs the sources, decontamination and deduplication stages once
(one worker) and keeps their results; then each configuration runs the clean stage
(`stages.run_clean`) on them in a fresh subprocess with one polars thread:
- baseline: one worker, which cleans the kept shards in one pass, a batch at a time, streamed
  into the clean shards;
- two workers, which clean each kept shard as a task, then write each clean shard as a task.
Printed per configuration: wall seconds of the stage (its decisions table, account and lineage
tables too), of its two phases where it has them, the process's peak RSS and its largest
worker's, and whether every clean shard's SHA-256 is the baseline's.

    .venv/bin/python benchmarks/clean_parts.py [--scales 64 128] [--out benchmarks/results/clean_parts.json]
"""

from __future__ import annotations

import pickle
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import data_scaling  # noqa: E402  (also puts the project on the path)

# (label, workers)
CONFIGS = (("baseline: one pass, 1 worker", 1), ("parts, 2 workers", 2))
SHARD_ROWS = 5_000  # kept shards of 5,000 rows: tens of tasks at 64x (the default 50,000 gives four)


def _config(workers: int):
    from ito_assets.data.config import DataPrepConfig, ScaleConfig

    return DataPrepConfig(scale=ScaleConfig(**data_scaling.BENCH_SCALE, num_workers=workers), shard_max_rows=SHARD_ROWS)


def upstream(spec: dict) -> dict:
    """The three stages before the clean one, pickled to `spec["upstream"]`."""
    from ito_assets.data import stages
    from ito_assets.evals.suite import load_suite
    from ito_assets.manifest.verify import verify_manifest

    verified, work = verify_manifest(spec["manifest"]), Path(spec["work"])
    config, warehouse = _config(1), work / "warehouse.duckdb"
    source = stages.run_sources(verified, Path(spec["manifest"]).parent, work, warehouse, config)
    decontam = stages.run_decontam(verified, load_suite(data_scaling.SUITE), source, work, warehouse, config)
    dedup = stages.run_dedup(source, decontam.actions, work, warehouse, config)
    Path(spec["upstream"]).write_bytes(pickle.dumps((verified, source, decontam, dedup)))
    return {"kept_shards": len(dedup.kept.shards), "kept_rows": dedup.kept.num_rows}


def child(spec: dict) -> dict:
    if spec.get("upstream_only"):
        return upstream(spec)
    from ito_assets.data import clean_units, stages

    phases: dict = {}
    clean_units.map_units = data_scaling.timed(clean_units.map_units, lambda seconds, args, kwargs: phases.update(
        {kwargs["phase"]: round(seconds, 2)}))
    verified, source, decontam, dedup = pickle.loads(Path(spec["upstream"]).read_bytes())
    work = Path(spec["work"])
    start = time.perf_counter()
    stage = stages.run_clean(verified, source, dedup, decontam, work, work / "warehouse.duckdb", _config(spec["workers"]))
    seconds = time.perf_counter() - start
    main_mb, worker_mb = data_scaling.peak_rss_mb()
    return {"seconds": round(seconds, 2), "rows_seconds": phases.get("clean rows"), "shard_seconds": phases.get("clean shards"),
            "peak_rss_mb": round(main_mb, 1), "worker_peak_rss_mb": round(worker_mb, 1) if spec["workers"] > 1 else None,
            "clean_rows": stage.conservation.num_clean_rows, "shards": [s.sha256 for s in stage.shards.shards]}


def main() -> None:
    args = data_scaling.scales_or_child(child)
    if args is None:
        return
    rows = data_scaling.runs_on_upstream(__file__, args.scales, "clean-parts-", CONFIGS)
    data_scaling.report_shards(args, rows, differs="a configuration wrote other clean shards than the one pass", columns={
        "scale": lambda r: f"{r['scale']}x", "kept rows": lambda r: r["kept_rows"], "kept shards": lambda r: r["kept_shards"],
        "configuration": lambda r: r["config"], "seconds": lambda r: r["seconds"], "cleaning s": lambda r: r["rows_seconds"] or "-"})


if __name__ == "__main__":
    main()
