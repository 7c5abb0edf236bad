"""Deduplication speed, side by side in one run on the same corpora and parameters (word 5-gram
shingles, 20 bands x 6 rows = 120 permutations, threshold 0.8), with each method's quality:

- ito: the production path end to end: the sources step's `SourceRead` (snapshot and sha256 of
  the file, parse, NFC, ids) writing source shards, then `deduplicate_units` (exact copies,
  signatures, band join, exact verification, keep rule) writing the decisions file; these corpora
  are under its `in_memory_mb` (32), so it deduplicates them in memory (`dedup_memory`);
- ito-streamed: the same with `in_memory_mb` 0, the streamed path (work units, DuckDB) that
  corpora past it take, one worker;
- rensa (Rust MinHash, `pip install 'rensa>=0.5,<0.6'`): read, NFC, word 5-grams in Python,
  `RMinHash.from_token_sets`, `RMinHashLSH` candidates kept at an estimated Jaccard >= 0.8,
  union-find, decisions written;
- datasketch: read, NFC, word 5-grams in Python, `MinHash.bulk`, `MinHashLSH` query-then-insert,
  decisions written;
- datatrove (where `--datatrove-python` exists): its four-stage MinHash pipeline, run in a
  separate virtual environment (`dedup_datatrove_runner.py`), speed only.

Corpora (`dedup_corpus.py`): "short" (documents of 100-600 bytes), "man" (the same cut from this
machine's manual pages, when it has them) and "long" (~1 kB documents).

Every method runs in a fresh process on one core (POLARS_MAX_THREADS, RAYON_NUM_THREADS and the
BLAS pools at 1; DuckDB runs one thread with one worker) and is measured in CPU seconds of that
process and its children, imports excluded, so that other load on a shared machine counts as
little as it can; the best of `--repeat` runs is reported, the methods taking turns. MB is the UTF-8 text of the corpus.
Quality: the share of removals whose exact Jaccard with the document they are recorded against
is >= 0.8 (justified), and the pairs of kept documents with exact Jaccard >= 0.8 (residual), both
against `dedup_quality.truth_pairs`.

    .venv/bin/python benchmarks/dedup_speed.py [--corpora short,man,long] [--short-docs 60000] [--docs 20000]
"""

from __future__ import annotations

import os

for _name in ("POLARS_MAX_THREADS", "RAYON_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_name] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import unicodedata  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import dedup_corpus  # noqa: E402

BANDS, ROWS, SHINGLE, THRESHOLD = 20, 6, 5, 0.8
METHODS = ("ito", "ito-streamed", "rensa", "datasketch")
_WORD = re.compile(r"[^\W_]+")


def machine() -> str:
    """CPU model, cores, Python: the line every benchmark prints first."""
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        model = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")), model)
    return f"machine: {model}, {os.cpu_count()} cores visible, 1 used; Python {platform.python_version()}, numpy {np.__version__}, polars {pl.__version__}"


def cpu_seconds() -> float:
    """User + system CPU of this process and its waited-for children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def shingles(text: str) -> list[str]:
    """Word 5-grams as the peers get them, in Python: the words ito dedups on, joined by spaces (a
    document under 5 words is one shingle). A list with repeats: MinHash is a set function."""
    words = _WORD.findall(text.lower())
    if len(words) < SHINGLE:
        return [" ".join(words)] if words else []
    return list(map(" ".join, zip(*(words[i:] for i in range(SHINGLE)))))


def read_records(corpus: Path) -> list[dict]:
    with corpus.open("rb") as handle:
        return [json.loads(line) for line in handle]


def write_decisions(path: Path, against: list[int]) -> None:
    """One line per document: -1 when kept, else the document it was removed against."""
    with path.open("w") as handle:
        handle.writelines(f"{i}\t{a}\n" for i, a in enumerate(against))


# Each returns, per document (line of the corpus), -1 when kept or the document it was removed against.

def run_ito(corpus: Path, out: Path, in_memory_mb: int = 32) -> tuple[float, list[int]]:
    from ito_assets.data.config import DedupConfig, ScaleConfig
    from ito_assets.data.dedup_units import deduplicate_units
    from ito_assets.data.scratch import scratch_space
    from ito_assets.data.shards import verified_paths, write_shard_stream
    from ito_assets.data.sources import DOCUMENT_SCHEMA, SourceRead, doc_id
    from ito_assets.digests import file_sha256
    from ito_assets.manifest.schema import DataReference

    start = cpu_seconds()
    ref = DataReference(uri=f"file://{corpus}", sha256=file_sha256(corpus), license="CC0-1.0", format="jsonl")
    scale, config = ScaleConfig(num_workers=1, in_memory_mb=in_memory_mb), DedupConfig(bands=BANDS, rows=ROWS, num_perm=BANDS * ROWS, shingle_size=SHINGLE, threshold=THRESHOLD)
    with scratch_space(out / "sources-scratch", scale) as scratch:
        read = SourceRead(ref, 0, Path("/"), scratch.folder)
        shards = write_shard_stream(read.frames(), out / "source", prefix="documents", max_rows=50_000, schema=DOCUMENT_SCHEMA)
    with scratch_space(out / "dedup-scratch", scale) as scratch:
        verified_paths(shards.shards)  # as the step does before its work
        deduplicate_units(scratch, shards.shards, config, out / "decisions.parquet")
    seconds = cpu_seconds() - start
    decisions = pl.read_parquet(out / "decisions.parquet", columns=["doc_id", "duplicate_of"])
    line = {doc_id(ref.sha256, i): i for i in range(corpus.read_bytes().count(b"\n"))}
    against = [-1] * len(line)
    for doc, of in decisions.filter(pl.col("duplicate_of").is_not_null()).iter_rows():
        against[line[doc]] = line[of]
    return seconds, against


def run_rensa(corpus: Path, out: Path) -> tuple[float, list[int]]:
    from rensa import RMinHash, RMinHashLSH

    start = cpu_seconds()
    records = read_records(corpus)
    sets = [shingles(unicodedata.normalize("NFC", r["text"])) for r in records]
    signatures = RMinHash.from_token_sets(sets, num_perm=BANDS * ROWS, seed=1)
    lsh = RMinHashLSH(threshold=THRESHOLD, num_perm=BANDS * ROWS, num_bands=BANDS)
    lsh.insert_many(signatures)
    parent = list(range(len(records)))

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i, candidates in enumerate(lsh.query_all(signatures)):
        for j in candidates:
            if j != i and signatures[i].jaccard(signatures[j]) >= THRESHOLD:
                a, b = root(i), root(j)
                if a != b:
                    parent[max(a, b)] = min(a, b)  # the earliest document represents its set
    against = [-1 if root(i) == i else root(i) for i in range(len(records))]
    write_decisions(out / "rensa-decisions.tsv", against)
    return cpu_seconds() - start, against


def run_datasketch(corpus: Path, out: Path) -> tuple[float, list[int]]:
    from datasketch import MinHash, MinHashLSH

    start = cpu_seconds()
    records = read_records(corpus)
    sets = [[g.encode() for g in set(shingles(unicodedata.normalize("NFC", r["text"])))] for r in records]
    signatures = MinHash.bulk(sets, num_perm=BANDS * ROWS)
    lsh = MinHashLSH(num_perm=BANDS * ROWS, params=(BANDS, ROWS))
    against = []
    for i, signature in enumerate(signatures):
        found = lsh.query(signature)
        against.append(min(found) if found else -1)
        if not found:
            lsh.insert(i, signature)
    write_decisions(out / "datasketch-decisions.tsv", against)
    return cpu_seconds() - start, against


RUNNERS = {"ito": run_ito, "ito-streamed": lambda corpus, out: run_ito(corpus, out, in_memory_mb=0), "rensa": run_rensa, "datasketch": run_datasketch}


def run_datatrove(python: str, corpus: Path, out: Path) -> dict:
    """dedup_datatrove_runner.py's result, with the CPU seconds of its process as "cpu"."""
    work = out / "datatrove"
    shutil.rmtree(work, ignore_errors=True)
    runner = Path(__file__).with_name("dedup_datatrove_runner.py")
    start = cpu_seconds()
    done = subprocess.run([python, str(runner), str(corpus), str(work), str(BANDS), str(ROWS)], capture_output=True, text=True, env=os.environ, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {**result, "cpu": cpu_seconds() - start}


def run_once(method: str, corpus: Path, out: Path) -> tuple[float, list[int]]:
    """One run of `method` in a fresh process -> (CPU seconds, decisions)."""
    folder = Path(tempfile.mkdtemp(prefix=f"{method}-", dir=out))
    done = subprocess.run([sys.executable, __file__, "--one", method, str(corpus), str(folder)], capture_output=True, text=True, check=True)
    shutil.rmtree(folder, ignore_errors=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["cpu"], result["against"]


def measured(corpus: Path, out: Path, repeat: int) -> dict[str, tuple[float, list[int]]]:
    """Each method's best CPU seconds of `repeat` runs and its last run's decisions. The methods
    take turns, a run each per round, so that a shared machine's slow spell weighs on all of
    them alike rather than on whichever ran then."""
    best: dict[str, tuple[float, list[int]]] = {}
    for _ in range(repeat):
        for method in METHODS:
            seconds, against = run_once(method, corpus, out)
            best[method] = (min(seconds, best.get(method, (float("inf"),))[0]), against)
    return best


def kernels(corpus: Path) -> dict[str, float]:
    """The signature kernels alone, M shingles/s/core: ito's `kernels.minhash` (in C where it was
    built) and rensa's R-MinHash on the same shingle hashes, datasketch's `MinHash.bulk` on its
    first 5,000 documents."""
    from datasketch import MinHash
    from rensa import RMinHash

    from ito_assets.data.minhash import MinHasher, shingle_lists
    from ito_assets.data.text import word_hashes

    texts = [r["text"] for r in read_records(corpus)]
    grams = shingle_lists(word_hashes(pl.Series(texts)), SHINGLE)
    sets = [[g.encode() for g in set(shingles(t))] for t in texts[:5000]]
    runs = {
        "ito": (len(grams.hashes), lambda: MinHasher(num_perm=BANDS * ROWS).signatures(grams)),
        "rensa": (len(grams.hashes), lambda: RMinHash.digest_matrix_from_flat_token_hashes(grams.hashes, grams.offsets, BANDS * ROWS, 1)),
        "datasketch": (sum(len(s) for s in sets), lambda: MinHash.bulk(sets, num_perm=BANDS * ROWS)),
    }
    speeds = {}
    for name, (count, run) in runs.items():
        best = float("inf")
        for _ in range(3):
            start = time.process_time()
            run()
            best = min(best, time.process_time() - start)
        speeds[name] = count / best / 1e6
    return speeds


def quality(against: list[int], sets: list[frozenset], truth: set[tuple[int, int]]) -> tuple[int, float, int]:
    """(removed, share of removals justified, residual J >= 0.8 pairs among the kept)."""
    from dedup_quality import jaccard

    removed = [(r, a) for r, a in enumerate(against) if a >= 0]
    justified = sum(1 for r, a in removed if jaccard(sets[r], sets[a]) >= THRESHOLD - 1e-12)
    residual = sum(1 for i, j in truth if against[i] < 0 and against[j] < 0)
    return len(removed), justified / len(removed) if removed else 1.0, residual


def bench_corpus(name: str, corpus: Path, out: Path, repeat: int, datatrove: str | None) -> dict:
    from dedup_quality import shingle_set, truth_pairs

    records = read_records(corpus)
    mb = sum(len(r["text"].encode()) for r in records) / 1e6
    sets = [shingle_set(r["text"]) for r in records]
    truth = truth_pairs(sets, THRESHOLD)
    print(f"\n{name}: {len(records)} documents, {mb:.1f} MB of text, median {int(np.median([len(r['text'].encode()) for r in records]))} bytes; {len(truth)} pairs with exact J >= {THRESHOLD}")
    rows = {}
    for method, (seconds, against) in measured(corpus, out, repeat).items():
        removed, justified, residual = quality(against, sets, truth)
        rows[method] = {"cpu": seconds, "mb_per_s": mb / seconds, "removed": removed, "justified": justified, "residual": residual}
    if datatrove:
        rows["datatrove"] = {"cpu": (cpu := run_datatrove(datatrove, corpus, out)["cpu"]), "mb_per_s": mb / cpu}
    print(f"  {'method':12s} {'CPU s':>7s} {'MB/s/core':>10s} {'ito faster':>11s} {'removed':>8s} {'justified':>10s} {'residual pairs':>15s}")
    for method, row in rows.items():
        ratio = row["cpu"] / rows["ito"]["cpu"]
        tail = f" {row['removed']:8d} {row['justified']:10.2%} {row['residual']:15d}" if "removed" in row else ""
        print(f"  {method:12s} {row['cpu']:7.2f} {row['mb_per_s']:10.2f} {ratio:10.2f}x{tail}")
    speeds = kernels(corpus)
    print("  signature kernel alone, M shingles/s/core: " + ", ".join(f"{k} {v:.2f}" for k, v in speeds.items()))
    return {"documents": len(records), "mb": mb, "truth_pairs": len(truth), "methods": rows, "kernel_m_shingles_per_s": speeds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpora", default="short,man,long")
    parser.add_argument("--short-docs", type=int, default=60_000, help="documents in the short and man corpora")
    parser.add_argument("--docs", type=int, default=20_000, help="documents in the long corpus")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--datatrove-python", default="/tmp/bench-venv/bin/python")
    parser.add_argument("--json", help="write the figures here too")
    parser.add_argument("--one", nargs=3, metavar=("METHOD", "CORPUS", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        method, corpus, folder = args.one
        seconds, against = RUNNERS[method](Path(corpus), Path(folder))
        print(json.dumps({"cpu": seconds, "against": against}))
        return
    print(machine())
    print(f"word {SHINGLE}-grams, {BANDS} bands x {ROWS} rows, threshold {THRESHOLD}; CPU seconds, best of {args.repeat} runs each")
    out = Path(tempfile.mkdtemp(prefix="ito-dedup-speed-"))
    datatrove = args.datatrove_python if Path(args.datatrove_python).is_file() else None
    results = {}
    try:
        for name in args.corpora.split(","):
            if name == "man" and not dedup_corpus.man_pages():
                print(f"\nman: skipped, no manual pages under {dedup_corpus.MAN}")
                continue
            docs = args.docs if name == "long" else args.short_docs
            corpus = dedup_corpus.write(out / f"{name}.jsonl", docs, mode=name)
            results[name] = bench_corpus(name, corpus, out, args.repeat, datatrove)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "date": time.strftime("%Y-%m-%d"), "corpora": results}, indent=1))


if __name__ == "__main__":
    main()
