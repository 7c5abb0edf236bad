"""SFT rows for the stage worker: the time and peak memory of turning pairs into the rows file,
against the way it was built before (the baseline, in the same run).

Baseline: every pair encoded twice (once for the rows' length, once through `response_batch`, whose
torch tensors were then copied into the rows), and the rows saved to an in-memory buffer whose
bytes were written out (two more copies of the rows). Now: `sft_rows` encodes each pair once
straight into the rows, and `write_atomic` saves the array to the file itself.

Pairs: the package descriptions of this virtual environment (`sft_rows_cut.documentation_pairs`),
repeated to `--pairs`. Peak memory is tracemalloc's (numpy's buffers and Python objects), seconds
the best of `--trials` alternating trials, one torch thread.

    .venv/bin/python benchmarks/posttraining_rows.py [--pairs 20000] [--trials 3]
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ito_assets.posttraining.sft import response_batch, sft_rows  # noqa: E402
from ito_assets.posttraining.vocab import CharVocab  # noqa: E402
from ito_assets.runtime.record.storage import write_atomic  # noqa: E402
from ito_assets.runtime.worker.batches import IGNORE  # noqa: E402
from sft_rows_cut import documentation_pairs  # noqa: E402


def baseline(codec, pairs, path: Path) -> np.ndarray:
    width = max(1 + len(codec.encode(p.prompt)) + len(codec.encode(p.response)) for p in pairs)
    rows = np.full((len(pairs), 2, width), IGNORE, dtype=np.int32)
    rows[:, 0] = codec.pad_id
    for i, pair in enumerate(pairs):
        tokens, mask = response_batch(codec, [pair.prompt], [pair.response])
        used = tokens.shape[1] - 1
        rows[i, 0, :used] = tokens[0, :-1].numpy()
        rows[i, 1, :used] = np.where(mask[0].numpy() > 0, tokens[0, 1:].numpy(), IGNORE)
    buffer = io.BytesIO()
    np.save(buffer, rows)
    write_atomic(path, buffer.getvalue())
    return rows


def current(codec, pairs, path: Path) -> np.ndarray:
    rows = sft_rows(codec, pairs)
    write_atomic(path, lambda handle: np.save(handle, rows))
    return rows


def measure(build, codec, pairs, folder: Path) -> tuple[float, int, np.ndarray]:
    """(seconds, peak bytes above the start, the rows file's array)."""
    path = folder / f"{build.__name__}.npy"
    tracemalloc.start()
    started = time.perf_counter()
    build(codec, pairs, path)
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return seconds, peak, np.load(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20_000)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    source = documentation_pairs(args.pairs)
    pairs = [replace(source[i % len(source)], pair_id=str(i)) for i in range(args.pairs)]
    codec = CharVocab()
    results: dict[str, list[tuple[float, int]]] = {"baseline": [], "current": []}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.trials):
            found = {}
            for build in (baseline, current):
                seconds, peak, rows = measure(build, codec, pairs, Path(folder))
                results[build.__name__].append((seconds, peak))
                found[build.__name__] = rows
            assert np.array_equal(found["baseline"], found["current"]), "the rows differ"
    rows = found["current"]
    print(f"{len(pairs):,} pairs ({len(source):,} distinct paragraphs), rows {rows.shape} int32 = "
          f"{rows.nbytes / 2**20:.1f} MiB; the two rows files are identical")
    for name, runs in results.items():
        best = min(s for s, _ in runs)
        peak = max(p for _, p in runs)
        print(f"{name:9s} best {best:6.2f} s, peak {peak / 2**20:7.1f} MiB ({peak / rows.nbytes:.2f}x the rows)")
    ratio = min(s for s, _ in results["baseline"]) / min(s for s, _ in results["current"])
    memory = max(p for _, p in results["baseline"]) / max(p for _, p in results["current"])
    print(f"current: {ratio:.2f}x as fast, {memory:.2f}x less peak memory")


if __name__ == "__main__":
    main()
