"""The sources stage parsing in pieces on the step's workers, against one pass, in the same run.

The corpus is data_scaling.py's generated one at each of `--scales` (default 64 and 128x the
fixtures; one plain JSONL file). Each configuration runs the sources stage
(`stages.run_sources`) in a fresh subprocess with one polars thread:
- baseline: one worker, which reads each verified copy in one pass, a batch at a time, streamed
  into the shards; and the same with the standard library's `json.loads` alone, as the stage
  parsed before orjson;
- two workers, which parse pieces of 8 MiB (the default unit) or of 1 MiB and then write the
  shards a part a task.
Printed per configuration: wall seconds of the stage (its lineage tables too), of its parsing and
shard-writing phases where it has them, the process's peak RSS and its largest worker's, and
whether every shard's SHA-256 is the baseline's.

    .venv/bin/python benchmarks/source_pieces.py [--scales 64 128] [--out benchmarks/results/source_pieces.json]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import data_scaling  # noqa: E402  (also puts the project on the path)

# (label, workers, unit bytes, JSON parser)
CONFIGS = (("baseline: one pass, 1 worker", 1, 8 << 20, "orjson"), ("one pass, 1 worker, json.loads", 1, 8 << 20, "json"),
           ("pieces of 8 MiB, 2 workers", 2, 8 << 20, "orjson"), ("pieces of 1 MiB, 2 workers", 2, 1 << 20, "orjson"))


def child(spec: dict) -> dict:
    from ito_assets.data import source_pieces, stages
    from ito_assets.data.config import DataPrepConfig, ScaleConfig
    from ito_assets.manifest.verify import verify_manifest

    phases: dict = {}
    source_pieces.map_units = data_scaling.timed(source_pieces.map_units, lambda seconds, args, kwargs: phases.update(
        {kwargs["phase"]: {"seconds": round(seconds, 2), "tasks": len(args[1])}}))
    if spec["parser"] == "json":  # the standard library alone, as the stage parsed before orjson
        from ito_assets.data import sources

        sources._loads = lambda line, id_field: json.loads(line)
    verified, data_root, work = verify_manifest(spec["manifest"]), Path(spec["manifest"]).parent, Path(spec["work"])
    config = DataPrepConfig(scale=ScaleConfig(unit_bytes=spec["unit_bytes"], num_workers=spec["workers"]), shard_max_rows=data_scaling.SHARD_ROWS)
    start = time.perf_counter()
    stage = stages.run_sources(verified, data_root, work, work / "warehouse.duckdb", config)
    seconds = time.perf_counter() - start
    main_mb, worker_mb = data_scaling.peak_rss_mb()
    parsing, shards = phases.get("source parsing", {}), phases.get("source shards", {})
    return {"seconds": round(seconds, 2), "pieces": stage.num_pieces, "parse_seconds": parsing.get("seconds"),
            "shard_seconds": shards.get("seconds"), "peak_rss_mb": round(main_mb, 1),
            "worker_peak_rss_mb": round(worker_mb, 1) if spec["workers"] > 1 else None, "shards": [s.sha256 for s in stage.shards.shards]}


def main() -> None:
    args = data_scaling.scales_or_child(child)
    if args is None:
        return
    rows: list[dict] = []
    for scale, texts, folder, manifest in data_scaling.corpora(args.scales, "source-pieces-"):
        size_mb = Path(manifest).with_name("bench.jsonl").stat().st_size / 1e6
        for index, (label, workers, unit_bytes, parser) in enumerate(CONFIGS):
            spec = {"manifest": manifest, "workers": workers, "unit_bytes": unit_bytes, "parser": parser, "work": str(folder / f"run-{index}")}
            data_scaling.add_run(rows, __file__, {"scale": scale, "num_docs": len(texts), "file_mb": round(size_mb, 1), "config": label}, spec)
    data_scaling.report_shards(args, rows, differs="a configuration wrote other shards than the one pass", columns={
        "scale": lambda r: f"{r['scale']}x", "file MB": lambda r: r["file_mb"], "configuration": lambda r: r["config"],
        "pieces": lambda r: r["pieces"], "seconds": lambda r: r["seconds"], "parsing s": lambda r: r["parse_seconds"] or "-"})


if __name__ == "__main__":
    main()
