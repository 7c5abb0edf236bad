"""Decontamination quality and speed on the planted fixtures, side by side with datatrove.

- Recall per planted style (verbatim_qa, question_only, edited_question, case_punct): a plant is
  found when its document is flagged with the planted eval item (datatrove's filter reports one
  item per document: the first n-gram it meets); a second line counts a plant flagged at all.
- False positives: flagged documents among the clean ones: every fixture document that is not a
  plant (hard negatives included), plus a larger synthetic corpus built from the PSF fixture
  texts only (`dedup_corpus`, forum posts excluded, so that it holds no plant).
- Throughput: MB of text per second per core for the whole scan (tokenise, n-grams, match,
  evidence, offsets), on the synthetic corpus; datatrove with query n-grams on and off.
  Everything on one core (POLARS_MAX_THREADS=1).

    .venv/bin/python benchmarks/decontam.py [--docs 20000] [--datatrove-python /tmp/bench-venv/bin/python]
"""

from __future__ import annotations

import os

os.environ["POLARS_MAX_THREADS"] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

import polars as pl  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(ROOT / "tests"))  # reference_impl

import dedup_corpus  # noqa: E402
from dedup_speed import machine  # noqa: E402
from ito_assets.data.config import DecontamConfig  # noqa: E402
from ito_assets.data.eval_index import build_index  # noqa: E402
from ito_assets.evals.suite import load_suite  # noqa: E402
from reference_impl import scan  # noqa: E402

FIXTURES = ROOT / "data" / "fixtures"
SUITE = FIXTURES / "evals" / "ito-fixture-evals-v1.jsonl"
STYLES = ("verbatim_qa", "question_only", "edited_question", "case_punct")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def fixture_documents() -> list[dict]:
    docs = []
    for path in sorted((FIXTURES / "corpora").glob("*.jsonl")):
        docs += [{"id": f"{path.name}:{r['id']}", "text": r["text"]} for r in read_jsonl(path)]
    return docs


def run_ito(docs: list[dict]) -> tuple[dict[str, set[str]], float]:
    frame = pl.DataFrame({"doc_id": [d["id"] for d in docs], "text": [d["text"] for d in docs]})
    start = time.perf_counter()
    config = DecontamConfig()
    hits, _ = scan(frame, build_index(load_suite(SUITE), config), config)
    seconds = time.perf_counter() - start
    flagged: dict[str, set[str]] = {}
    for doc, item in hits.select("doc_id", "eval_item_id").iter_rows():
        flagged.setdefault(doc, set()).add(item)
    return flagged, seconds


def run_datatrove(python: str, docs: list[dict], query: bool, work: Path) -> tuple[dict[str, set[str]], float]:
    corpus = work / f"corpus-{len(docs)}.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in docs))
    runner = Path(__file__).with_name("decontam_datatrove_runner.py")
    done = subprocess.run(
        [python, str(runner), str(SUITE), str(corpus), str(work / f"dt-{query}-{len(docs)}"), "13", "1" if query else "0"],
        capture_output=True, text=True, check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {k: {v} for k, v in result["flagged"].items()}, result["seconds"]


def quality(flagged: dict[str, set[str]], truth: list[dict], clean_ids: set[str]) -> dict:
    found = Counter(t["style"] for t in truth if t["eval_item_id"] in flagged.get(f"{t['source']}:{t['id']}", set()))
    total = Counter(t["style"] for t in truth)
    anywhere = Counter(t["style"] for t in truth if f"{t['source']}:{t['id']}" in flagged)
    false_positives = sorted(d for d in flagged if d in clean_ids)
    return {
        "recall": {s: found[s] / total[s] for s in STYLES},
        "recall_any_item": {s: anywhere[s] / total[s] for s in STYLES},
        "false_positives": false_positives,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=20_000)
    parser.add_argument("--datatrove-python", default="/tmp/bench-venv/bin/python")
    args = parser.parse_args()
    print(machine())
    work = Path(tempfile.mkdtemp(prefix="ito-decontam-"))
    truth = read_jsonl(FIXTURES / "truth" / "planted_contamination.jsonl")
    planted = {f"{t['source']}:{t['id']}" for t in truth}
    fixtures = fixture_documents()
    synthetic = [{"id": f"synthetic:{r['id']}", "text": r["text"]} for r in dedup_corpus.build(args.docs, seed=1, exclude=("forum_posts.jsonl",))]
    clean_ids = {d["id"] for d in fixtures + synthetic} - planted
    mb = sum(len(d["text"].encode()) for d in synthetic) / 1e6
    print(f"fixtures: {len(fixtures)} documents, {len(truth)} plants; clean documents: {len(clean_ids)}; "
          f"throughput corpus: {len(synthetic)} documents, {mb:.1f} MB; n = 13")
    runs = {"ito": lambda docs: run_ito(docs)}
    if Path(args.datatrove_python).is_file():
        runs["datatrove (query n-grams on)"] = lambda docs: run_datatrove(args.datatrove_python, docs, True, work)
        runs["datatrove (query n-grams off)"] = lambda docs: run_datatrove(args.datatrove_python, docs, False, work)
    header = f"{'method':32s} " + " ".join(f"{s:>15s}" for s in STYLES) + f" {'FP docs':>8s} {'FP rate':>9s} {'MB/s/core':>10s}"
    print(header)
    for name, run in runs.items():
        flagged, _ = run(fixtures)
        flagged_synthetic, seconds = run(synthetic)
        result = quality({**flagged, **flagged_synthetic}, truth, clean_ids)
        fp = result["false_positives"]
        print(f"{name:32s} " + " ".join(f"{result['recall'][s]:15.3f}" for s in STYLES) + f" {len(fp):8d} {len(fp) / len(clean_ids):9.4%} {mb / seconds:10.2f}")
        print(f"{'  flagged at all (any item)':32s} " + " ".join(f"{result['recall_any_item'][s]:15.3f}" for s in STYLES))
        if fp:
            print(f"    false positives: {fp[:5]}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
