"""Runs datatrove's n-gram decontamination (NGramsDecontIndexer + NGramsDecontFilter) over JSONL
documents; prints the flagged documents and the filter's wall time as JSON. Run it with the
interpreter of a separate virtual environment that has datatrove (never the project's .venv):

    /tmp/bench-venv/bin/python benchmarks/decontam_datatrove_runner.py SUITE.jsonl CORPUS.jsonl WORKDIR N QUERY(0|1)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main(suite: str, corpus: str, workdir: str, n: int, query_ngrams: bool) -> None:
    from datatrove.data import Document
    from datatrove.pipeline.decont.n_grams import NGramsDecontConfig, NGramsDecontFilter, NGramsDecontIndexer

    import datatrove.pipeline.base as base
    import numpy as np

    config = NGramsDecontConfig(n_grams=n, find_query_ngrams=query_ngrams, find_overlap_ngrams=True)
    items = [json.loads(line) for line in Path(suite).read_text().splitlines() if line.strip()]
    # One index "task" per item, so that a hit names its item ('/' is not allowed in a file name).

    # NGramsDecontIndexer.run always imports lighteval (to read lighteval tasks), which this
    # benchmark does not use: the index is written here with the indexer's own compute_hashes and
    # the same file layout as its run() (one `<task>.index.hashes` array per task).
    check = base.check_required_dependencies
    base.check_required_dependencies = lambda *args, **kwargs: None
    indexer = NGramsDecontIndexer(output_folder=str(Path(workdir) / "index"), config=config)
    base.check_required_dependencies = check
    index = Path(workdir) / "index"
    index.mkdir(parents=True, exist_ok=True)
    for item in items:
        hashes = set(indexer.compute_hashes(item["answer"], item["question"]))
        task = "ito:" + item["id"].replace("/", "__")
        np.array(sorted(hashes), dtype=config.hash_config.np_descr).tofile(index / f"{task}.index.hashes")
    step = NGramsDecontFilter(index_folder=str(Path(workdir) / "index"), config=config)
    step.load_index_hashes()
    docs = [json.loads(line) for line in Path(corpus).read_text().splitlines() if line.strip()]
    flagged = {}
    start = time.perf_counter()
    for record in docs:
        doc = Document(text=record["text"], id=record["id"])
        if step.filter(doc) is not True:
            flagged[record["id"]] = doc.metadata["contaminated_task"].removeprefix("ito:").replace("__", "/")
    print(json.dumps({"seconds": time.perf_counter() - start, "flagged": flagged}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] == "1")
