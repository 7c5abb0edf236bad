"""Deduplication speed, side by side in one run on the same corpus and parameters (word 5-gram
shingles, 20 bands x 6 rows = 120 permutations, threshold 0.8):

- ito: read JSONL, NFC-normalise, exact dedup, shingle, sign (numpy), band, verify exact Jaccard,
  keep rule, write the kept documents as Parquet (`ito_assets.data`);
- datasketch: read, NFC, shingle (Python), MinHash.bulk, MinHashLSH query-then-insert, write;
- datatrove: its four-stage MinHash pipeline with LocalPipelineExecutor, 1 task, 1 worker, run in
  a separate virtual environment (`--datatrove-python`), never in the project's .venv.

Everything runs on one core (POLARS_MAX_THREADS=1, OMP/OPENBLAS threads 1). Reports MB of text per
second per core end to end, and the signature kernel in shingles per second per core.

    .venv/bin/python benchmarks/dedup_speed.py --docs 20000 [--datatrove-python /tmp/bench-venv/bin/python]
"""

from __future__ import annotations

import os

for _name in ("POLARS_MAX_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_name] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
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
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))  # reference_impl

import dedup_corpus  # noqa: E402
from ito_assets.data.config import DedupConfig  # noqa: E402
from ito_assets.data.minhash import MinHasher, shingle_lists  # noqa: E402
from ito_assets.data.sources import DOCUMENT_SCHEMA, doc_id  # noqa: E402
from ito_assets.data.text import token_hashes  # noqa: E402
from reference_impl import deduplicate, kept_documents  # noqa: E402

BANDS, ROWS, SHINGLE = 20, 6, 5
_WORD = re.compile(r"[^\W_]+")


def machine() -> str:
    """CPU model, cores, Python: the line every benchmark prints first."""
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        model = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")), model)
    return f"machine: {model}, {os.cpu_count()} cores visible, 1 used; Python {platform.python_version()}, numpy {np.__version__}, polars {pl.__version__}"


def run_ito(corpus: Path, out: Path) -> float:
    start = time.perf_counter()
    raw = pl.read_ndjson(corpus)
    texts = [unicodedata.normalize("NFC", t) for t in raw["text"].to_list()]
    n = len(texts)
    docs = pl.DataFrame(
        {"doc_id": [doc_id("0" * 64, i) for i in range(n)], "source_index": [0] * n, "source_uri": ["b"] * n, "source_sha256": ["0" * 64] * n,
         "license": ["x"] * n, "row": list(range(n)), "source_record_id": raw["id"], "text": texts},
        schema=DOCUMENT_SCHEMA,
    )
    decisions, _ = deduplicate(docs, DedupConfig(bands=BANDS, rows=ROWS, num_perm=BANDS * ROWS, shingle_size=SHINGLE))
    kept_documents(docs, decisions).write_parquet(out / "ito-kept.parquet")
    return time.perf_counter() - start


def _shingles(text: str) -> list[bytes]:
    words = _WORD.findall(text.lower())
    grams = {" ".join(words[i : i + SHINGLE]) for i in range(len(words) - SHINGLE + 1)} or ({" ".join(words)} if words else set())
    return [g.encode() for g in grams]


def run_datasketch(corpus: Path, out: Path) -> float:
    from datasketch import MinHash, MinHashLSH

    start = time.perf_counter()
    records = [json.loads(line) for line in corpus.read_text().splitlines()]
    texts = [unicodedata.normalize("NFC", r["text"]) for r in records]
    signatures = MinHash.bulk([_shingles(t) for t in texts], num_perm=BANDS * ROWS)
    lsh = MinHashLSH(num_perm=BANDS * ROWS, params=(BANDS, ROWS))
    kept = []
    for i, signature in enumerate(signatures):
        if lsh.query(signature):
            continue
        lsh.insert(i, signature)
        kept.append(records[i])
    with (out / "datasketch-kept.jsonl").open("w") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in kept)
    return time.perf_counter() - start


def run_datatrove(python: str, corpus: Path, out: Path) -> dict:
    work = out / "datatrove"
    shutil.rmtree(work, ignore_errors=True)
    runner = Path(__file__).with_name("dedup_datatrove_runner.py")
    env = {**os.environ, "POLARS_MAX_THREADS": "1"}
    done = subprocess.run([python, str(runner), str(corpus), str(work), str(BANDS), str(ROWS)], capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def kernel_ito(texts: pl.Series) -> float:
    shingles = shingle_lists(token_hashes(texts, digits_normalized=False), SHINGLE)
    hasher = MinHasher(num_perm=BANDS * ROWS)
    hasher.signatures(shingles)  # warm-up
    start = time.perf_counter()
    hasher.signatures(shingles)
    return len(shingles.hashes) / (time.perf_counter() - start)


def kernel_datasketch(texts: list[str]) -> float:
    from datasketch import MinHash

    sets = [_shingles(t) for t in texts]
    start = time.perf_counter()
    MinHash.bulk(sets, num_perm=BANDS * ROWS)
    return sum(len(s) for s in sets) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=20_000)
    parser.add_argument("--datatrove-python", default="/tmp/bench-venv/bin/python")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="ito-dedup-speed-"))
    corpus = dedup_corpus.write(out / "corpus.jsonl", args.docs)
    texts = [json.loads(line)["text"] for line in corpus.read_text().splitlines()]
    mb = sum(len(t.encode()) for t in texts) / 1e6
    print(machine())
    print(f"corpus: {args.docs} documents, {mb:.1f} MB of text; 5-gram shingles, {BANDS} bands x {ROWS} rows, threshold 0.8")
    results = {"ito": run_ito(corpus, out), "datasketch": run_datasketch(corpus, out)}
    if Path(args.datatrove_python).is_file():
        try:
            results["datatrove"] = run_datatrove(args.datatrove_python, corpus, out)["seconds"]
        except (subprocess.CalledProcessError, json.JSONDecodeError) as error:
            print(f"datatrove failed: {error}")
    print("\nend to end (read, normalise, shingle, sign, band, verify/cluster, write):")
    for name, seconds in results.items():
        print(f"  {name:11s} {seconds:8.2f} s  {mb / seconds:8.2f} MB/s/core  ({results[name] / results['ito']:.1f}x ito's time)")
    series = pl.Series(texts)
    print("\nsignature kernel (120 permutations):")
    print(f"  ito         {kernel_ito(series) / 1e6:8.2f} M shingles/s/core")
    print(f"  datasketch  {kernel_datasketch(texts) / 1e6:8.2f} M shingles/s/core (MinHash.bulk)")
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    np.seterr(over="ignore")
    main()
