"""Runs datatrove's MinHash pipeline (signatures -> buckets -> cluster -> filter) on one JSONL file
with one task and one worker; prints the wall time as JSON. Run it with the interpreter of a
separate virtual environment that has datatrove (never the project's .venv):

    /tmp/bench-venv/bin/python benchmarks/dedup_datatrove_runner.py CORPUS.jsonl WORKDIR BANDS ROWS
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main(corpus: str, workdir: str, bands: int, rows: int) -> None:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.hashing import HashConfig

    work = Path(workdir)
    source = Path(corpus)
    config = MinhashConfig(n_grams=5, num_buckets=bands, hashes_per_bucket=rows, hash_config=HashConfig(precision=64))
    reader = lambda: JsonlReader(str(source.parent), glob_pattern=source.name, id_key="id")  # noqa: E731
    stages = [
        [reader(), MinhashDedupSignature(output_folder=str(work / "sigs"), config=config)],
        [MinhashDedupBuckets(input_folder=str(work / "sigs"), output_folder=str(work / "buckets"), config=config)],
        [MinhashDedupCluster(input_folder=str(work / "buckets"), output_folder=str(work / "remove"), config=config, save_cluster_id=True)],
        [
            reader(),
            MinhashDedupFilter(input_folder=str(work / "remove"), load_cluster_ids=True, exclusion_writer=JsonlWriter(str(work / "removed"), compression=None)),
            JsonlWriter(str(work / "out"), compression=None),
        ],
    ]
    times = []
    for i, pipeline in enumerate(stages):
        tasks = bands if i == 1 else 1  # the bucket stage runs one task per bucket
        start = time.perf_counter()
        LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=1, logging_dir=str(work / f"logs{i}"), skip_completed=False).run()
        times.append(time.perf_counter() - start)
    def records(folder: str) -> list[dict]:
        rows = [json.loads(line) for f in sorted((work / folder).glob("*.jsonl")) for line in f.read_text().splitlines()]
        return [{"id": r["id"], "cluster": r.get("metadata", {}).get("minhash_cluster_id")} for r in rows]

    print(json.dumps({"seconds": sum(times), "stage_seconds": times, "kept": records("out"), "removed": records("removed")}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
