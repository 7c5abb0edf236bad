"""The exact copies' texts compared in hash partitions on the step's workers, against the one
pass that bucket-sorts them in the step's process, in the same run.

The corpus is data_scaling.py's generated one at each of `--scales` (default 64 and 128x the
fixtures). A first subprocess writes its source shards (one worker) and keeps them; then each
configuration runs `exact_units.exact_copies` on them in a fresh subprocess with one polars thread:
- baseline: one worker: the keys, then the shared documents' texts bucket-sorted by hash in the
  step's process;
- two workers: the keys, then each source shard's shared texts spread by hash partition and each
  partition compared, a task each.
Printed per configuration: wall seconds, of which the text phase (bucket sort, or spread and
compare), the step process's peak RSS and its largest worker's, and whether the copies found
(doc_id, exact_copy_of, sorted) are the baseline's.

    .venv/bin/python benchmarks/exact_parts.py [--scales 64 128] [--out benchmarks/results/exact_parts.json]
"""

from __future__ import annotations

import hashlib
import pickle
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import data_scaling  # noqa: E402  (also puts the project on the path)

# (label, workers)
CONFIGS = (("baseline: one pass, 1 worker", 1), ("partitions, 2 workers", 2))
SHARD_ROWS = 5_000  # source shards of 5,000 rows: tens of spread tasks at 64x (the default 50,000 gives a few)


def _config(workers: int):
    from ito_assets.data.config import DataPrepConfig, ScaleConfig

    return DataPrepConfig(scale=ScaleConfig(**data_scaling.BENCH_SCALE, num_workers=workers), shard_max_rows=SHARD_ROWS)


def upstream(spec: dict) -> dict:
    """The sources stage, pickled to `spec["upstream"]`."""
    from ito_assets.data import stages
    from ito_assets.manifest.verify import verify_manifest

    verified, work = verify_manifest(spec["manifest"]), Path(spec["work"])
    source = stages.run_sources(verified, Path(spec["manifest"]).parent, work, work / "warehouse.duckdb", _config(1))
    Path(spec["upstream"]).write_bytes(pickle.dumps(source))
    return {"source_shards": len(source.shards.shards), "documents": source.num_documents}


def child(spec: dict) -> dict:
    if spec.get("upstream_only"):
        return upstream(spec)
    from ito_assets.data import exact_units
    from ito_assets.data.scratch import scratch_space

    text_seconds: list[float] = []
    record = lambda seconds, args, kwargs: text_seconds.append(seconds)  # noqa: E731
    exact_units.copies_in_parts = data_scaling.timed(exact_units.copies_in_parts, record)
    source = pickle.loads(Path(spec["upstream"]).read_bytes())
    config = _config(spec["workers"])
    start = time.perf_counter()
    with scratch_space(Path(spec["work"]) / "_scratch", config.scale) as scratch:
        counts = exact_units.exact_copies(scratch, source.shards.shards)
        copies = scratch.db.execute("SELECT doc_id, exact_copy_of FROM copies ORDER BY doc_id").fetchall()
    seconds = time.perf_counter() - start
    main_mb, worker_mb = data_scaling.peak_rss_mb()
    return {"seconds": round(seconds, 2), "text_seconds": round(text_seconds[0], 2) if spec["workers"] > 1 else None,
            "peak_rss_mb": round(main_mb, 1),
            "worker_peak_rss_mb": round(worker_mb, 1) if spec["workers"] > 1 else None,
            "copies": counts.num_removed, "groups": counts.num_groups_with_copies,
            "copies_sha256": hashlib.sha256(repr(copies).encode()).hexdigest()}


def main() -> None:
    args = data_scaling.scales_or_child(child)
    if args is None:
        return
    rows = data_scaling.runs_on_upstream(__file__, args.scales, "exact-parts-", CONFIGS)
    data_scaling.report(args, rows, speedups={"speedup": "seconds"}, same=("same_copies", "copies_sha256"),
                        differs="a configuration found other exact copies than the one pass", columns={
        "scale": lambda r: f"{r['scale']}x", "documents": lambda r: r["documents"], "source shards": lambda r: r["source_shards"],
        "copies": lambda r: r["copies"], "configuration": lambda r: r["config"], "seconds": lambda r: r["seconds"],
        "texts s (parts)": lambda r: r["text_seconds"] or "-", "speedup": lambda r: f"{r['speedup']}x",
        "peak MB": lambda r: r["peak_rss_mb"], "worker peak MB": lambda r: r["worker_peak_rss_mb"] or "-",
        "same copies": lambda r: r["same_copies"]})


if __name__ == "__main__":
    main()
