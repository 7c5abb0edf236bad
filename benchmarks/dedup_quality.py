"""Deduplication quality against an exact-Jaccard ground truth, side by side with the peers.

Ground truth: every pair of documents whose word 5-gram shingle sets have exact Jaccard >= 0.8,
found with an all-pairs prefix-filter join (Bayardo et al. 2007, "Scaling up all pairs
similarity search"; Chaudhuri et al. 2006): shingles ordered by global frequency, each document
indexed by its first |x| - ceil(t|x|) + 1 shingles, candidates checked with the size filter and
then exactly with Python sets. It uses its own tokeniser and hashing, nothing from ito_assets.

Metrics: (a) justified removals: share of removed documents whose exact Jaccard with the
kept document they are recorded against is >= 0.8; (b) residual near-duplicates: pairs of kept
documents with J >= 0.8, as a share of the input's J >= 0.8 pairs; (c) "same cluster" pair
precision and recall against the J >= 0.8 pairs.

    .venv/bin/python benchmarks/dedup_quality.py --docs 20000 [--datatrove-python /tmp/bench-venv/bin/python]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import sys
import tempfile
import time
import unicodedata
from collections import Counter, defaultdict
from itertools import combinations
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))  # reference_impl

import dedup_corpus  # noqa: E402
from dedup_speed import BANDS, ROWS, SHINGLE, machine, run_datatrove  # noqa: E402
from ito_assets.data.config import DedupConfig  # noqa: E402
from ito_assets.data.sources import DOCUMENT_SCHEMA  # noqa: E402
from reference_impl import deduplicate  # noqa: E402

THRESHOLD = 0.8
_WORD = re.compile(r"[^\W_]+")


def shingle_set(text: str) -> frozenset[str]:
    words = _WORD.findall(unicodedata.normalize("NFC", text).lower())
    grams = {" ".join(words[i : i + SHINGLE]) for i in range(len(words) - SHINGLE + 1)}
    return frozenset(grams or ({" ".join(words)} if words else set()))


def jaccard(x: frozenset, y: frozenset) -> float:
    union = len(x | y)
    return len(x & y) / union if union else 0.0


def truth_pairs(sets: list[frozenset], t: float) -> set[tuple[int, int]]:
    """All pairs with exact J >= t, by prefix filtering."""
    frequency = Counter(g for s in sets for g in s)
    index: dict[str, list[int]] = defaultdict(list)
    candidates: set[tuple[int, int]] = set()
    order = sorted(range(len(sets)), key=lambda i: len(sets[i]))  # by size: the size filter is one-sided
    for i in order:
        x = sets[i]
        if not x:
            continue
        tokens = sorted(x, key=lambda g: (frequency[g], g))
        prefix = tokens[: len(x) - math.ceil(t * len(x)) + 1]
        for g in prefix:
            for j in index[g]:
                if len(sets[j]) >= t * len(x):
                    candidates.add((min(i, j), max(i, j)))
            index[g].append(i)
    return {(i, j) for i, j in candidates if jaccard(sets[i], sets[j]) >= t - 1e-12}


def score(name: str, removed_against: dict[int, int], clusters: dict[int, int], sets: list[frozenset], truth: set[tuple[int, int]], seconds: float) -> dict:
    """removed_against: removed doc -> the kept doc it is recorded against (or its cluster's kept
    representative); clusters: doc -> cluster label."""
    justified = sum(1 for r, k in removed_against.items() if k is not None and jaccard(sets[r], sets[k]) >= THRESHOLD - 1e-12)
    kept = set(range(len(sets))) - set(removed_against)
    residual = sum(1 for i, j in truth if i in kept and j in kept)
    members: dict[int, list[int]] = defaultdict(list)
    for doc, label in clusters.items():
        members[label].append(doc)
    predicted = {(min(a, b), max(a, b)) for group in members.values() for a, b in combinations(group, 2)}
    hit = len(predicted & truth)
    return {
        "method": name,
        "removed": len(removed_against),
        "justified_removals": justified / len(removed_against) if removed_against else 1.0,
        "residual_pairs": residual / len(truth) if truth else 0.0,
        "pair_precision": hit / len(predicted) if predicted else 1.0,
        "pair_recall": hit / len(truth) if truth else 1.0,
        "seconds": seconds,
    }


def run_ito(records: list[dict]) -> tuple[dict, dict, float]:
    n = len(records)
    docs = pl.DataFrame(
        {"doc_id": [f"{i:016x}" for i in range(n)], "source_index": [0] * n, "source_uri": ["b"] * n, "source_sha256": ["0" * 64] * n,
         "license": ["x"] * n, "row": list(range(n)), "source_record_id": [r["id"] for r in records],
         "text": [unicodedata.normalize("NFC", r["text"]) for r in records]},
        schema=DOCUMENT_SCHEMA,
    )
    start = time.perf_counter()
    decisions, _ = deduplicate(docs, DedupConfig(bands=BANDS, rows=ROWS, num_perm=BANDS * ROWS, shingle_size=SHINGLE))
    seconds = time.perf_counter() - start
    removed = {int(r["doc_id"], 16): int(r["duplicate_of"], 16) for r in decisions.filter(pl.col("dedup_state") == "duplicate").iter_rows(named=True)}
    clusters = {int(r["doc_id"], 16): int(r["cluster_id"], 16) for r in decisions.iter_rows(named=True)}
    return removed, clusters, seconds


def run_datasketch(records: list[dict]) -> tuple[dict, dict, float]:
    from datasketch import MinHash, MinHashLSH

    start = time.perf_counter()
    sets = [[g.encode() for g in shingle_set(r["text"])] for r in records]
    signatures = MinHash.bulk(sets, num_perm=BANDS * ROWS)
    lsh = MinHashLSH(num_perm=BANDS * ROWS, params=(BANDS, ROWS))
    removed, clusters = {}, {}
    for i, signature in enumerate(signatures):
        found = lsh.query(signature)
        if found:
            removed[i] = min(found)
            clusters[i] = min(found)
        else:
            lsh.insert(i, signature)
            clusters[i] = i
    return removed, clusters, time.perf_counter() - start


def run_peer_datatrove(python: str, corpus: Path, records: list[dict]) -> tuple[dict, dict, float]:
    result = run_datatrove(python, corpus, corpus.parent)
    position = {r["id"]: i for i, r in enumerate(records)}
    # datatrove labels documents outside any cluster with -1: each is its own cluster.
    label = lambda r: r["cluster"] if r["cluster"] not in (None, -1) else f"self{position[r['id']]}"  # noqa: E731
    representative = {label(r): position[r["id"]] for r in result["kept"]}
    clusters = {position[r["id"]]: label(r) for r in result["kept"] + result["removed"]}
    removed = {position[r["id"]]: representative.get(label(r)) for r in result["removed"]}
    return removed, clusters, result["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=20_000)
    parser.add_argument("--datatrove-python", default="/tmp/bench-venv/bin/python")
    args = parser.parse_args()
    print(machine())
    corpus = dedup_corpus.write(Path(tempfile.mkdtemp(prefix="ito-dedup-quality-")) / "corpus.jsonl", args.docs)
    records = [json.loads(line) for line in corpus.read_text().splitlines()]
    start = time.perf_counter()
    sets = [shingle_set(r["text"]) for r in records]
    truth = truth_pairs(sets, THRESHOLD)
    print(f"corpus: {len(records)} documents; ground truth: {len(truth)} pairs with exact J >= {THRESHOLD} ({time.perf_counter() - start:.1f} s, prefix-filter join)")
    removed, clusters, seconds = run_ito(records)
    rows = [score("ito", removed, clusters, sets, truth, seconds)]
    removed, clusters, seconds = run_datasketch(records)
    rows.append(score("datasketch", removed, clusters, sets, truth, seconds))
    if Path(args.datatrove_python).is_file():
        removed, clusters, seconds = run_peer_datatrove(args.datatrove_python, corpus, records)
        rows.append(score("datatrove", removed, clusters, sets, truth, seconds))
    print(f"\n{'method':11s} {'removed':>8s} {'(a) justified':>14s} {'(b) residual':>13s} {'(c) precision':>14s} {'recall':>7s}")
    for r in rows:
        print(f"{r['method']:11s} {r['removed']:8d} {r['justified_removals']:14.2%} {r['residual_pairs']:13.2%} {r['pair_precision']:14.2%} {r['pair_recall']:7.2%}")
    print("goals: (a) >= 99% of removals justified, (b) <= 1% residual J >= 0.8 pairs")
    shutil.rmtree(corpus.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
