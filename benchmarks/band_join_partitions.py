"""The LSH band join in hash partitions, against one partition, in the same run.

The corpus is data_scaling.py's generated one at each of `--scales` (default 64 and 128x the
fixtures; reposts and near copies, so the join has real candidate pairs), parsed once
(`stages.run_sources`). Each configuration then deduplicates its source shards
(`dedup_units.deduplicate_units`, as the dedup stage runs it) in a fresh subprocess, under
data_scaling's BENCH_SCALE (units of 1 MiB, DuckDB capped at 128 MB) but with the stages' default
verification batch (16,384 pairs: BENCH_SCALE's 1,024 made every partition map each unit's files
16x as often), and one polars thread per process:
- baseline: one partition on one worker, the band join and its verification in the step's own
  process, as before the join was partitioned;
- 2 partitions on 2 workers, and about 8 partitions on 2 workers (smaller tasks, more of them).
Printed per configuration: wall seconds of the whole deduplication and of its band-join phase
(the partitions' tasks, the keep rule and the families), the step's peak RSS and its largest
worker's, and the SHA-256 of the decisions file, which must be the baseline's.

    .venv/bin/python benchmarks/band_join_partitions.py [--scales 64 128] [--out benchmarks/results/band_join_partitions.json]
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import data_scaling  # noqa: E402  (also puts the project on the path)

from ito_assets.data.config import DedupConfig  # noqa: E402

# (label, workers, partitions wanted): partition_rows is chosen to give about that many.
CONFIGS = (("baseline: 1 partition, 1 worker", 1, 1), ("2 partitions, 2 workers", 2, 2), ("~8 partitions, 2 workers", 2, 8))


def child(spec: dict) -> dict:
    from ito_assets.data import band_join, dedup_units
    from ito_assets.data.config import ScaleConfig
    from ito_assets.data.scratch import scratch_space
    from ito_assets.data.shards import Shard

    seen: dict = {}
    dedup_units.near_duplicates_out_of_core = data_scaling.timed(band_join.near_duplicates_out_of_core, lambda seconds, args, kwargs: seen.update(
        band_join_seconds=seconds, partitions=args[6]))
    bench = data_scaling.BENCH_SCALE | {"pair_batch": ScaleConfig().pair_batch}
    scale = ScaleConfig(**bench, num_workers=spec["workers"], partition_rows=spec["partition_rows"])
    work = Path(spec["work"])
    start = time.perf_counter()
    with scratch_space(work / "_scratch", scale) as scratch:
        decisions, counts = dedup_units.deduplicate_units(scratch, [Shard(**s) for s in spec["shards"]], DedupConfig(), work / "decisions.parquet")
    seconds = time.perf_counter() - start
    main_mb, worker_mb = data_scaling.peak_rss_mb()
    return {"seconds": round(seconds, 2), "band_join_seconds": round(seen["band_join_seconds"], 2), "partitions": seen["partitions"],
            "num_candidate_pairs": counts.near.num_candidate_pairs, "num_removed": counts.num_removed,
            "peak_rss_mb": round(main_mb, 1), "worker_peak_rss_mb": round(worker_mb, 1) if spec["workers"] > 1 else None,
            "decisions_sha256": hashlib.sha256(Path(decisions.path).read_bytes()).hexdigest()}


def source_shards(manifest: str, folder: Path) -> tuple[list[dict], int]:
    from ito_assets.data import stages
    from ito_assets.data.config import DataPrepConfig
    from ito_assets.manifest.verify import verify_manifest

    source = stages.run_sources(verify_manifest(manifest), Path(manifest).parent, folder / "state", folder / "warehouse.duckdb",
                                DataPrepConfig(shard_max_rows=data_scaling.SHARD_ROWS))
    return source.shards.as_dicts(), source.shards.num_rows


def main() -> None:
    args = data_scaling.scales_or_child(child)
    if args is None:
        return
    rows: list[dict] = []
    bands = DedupConfig().bands
    for scale, _, folder, manifest in data_scaling.corpora(args.scales, "band-join-"):
        shards, num_docs = source_shards(manifest, folder)
        for label, workers, wanted in CONFIGS:
            spec = {"shards": shards, "workers": workers, "partition_rows": -(-num_docs * bands // wanted), "work": str(folder / f"run-{workers}-{wanted}")}
            data_scaling.add_run(rows, __file__, {"scale": scale, "num_docs": num_docs, "config": label}, spec)
    data_scaling.report(
        args, rows, speedups={"band_join_speedup": "band_join_seconds", "dedup_speedup": "seconds"}, same=("same_decisions", "decisions_sha256"),
        differs="a partitioned run wrote other decisions than the baseline", columns={
        "scale": lambda r: f"{r['scale']}x", "configuration": lambda r: r["config"], "partitions": lambda r: r["partitions"],
        "dedup s": lambda r: r["seconds"], "band join s": lambda r: r["band_join_seconds"],
        "band join speedup": lambda r: f"{r['band_join_speedup']}x", "step peak MB": lambda r: r["peak_rss_mb"],
        "worker peak MB": lambda r: r["worker_peak_rss_mb"] or "-", "same decisions": lambda r: r["same_decisions"]})


if __name__ == "__main__":
    main()
