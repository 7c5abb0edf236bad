"""Which digest a checkpoint's files get, by measurement: hash throughput per core, the resume
verification time it implies at 70B scale, and what hashing while writing adds to a DCP save.

1. Writes `--gb` GB of random files (250 MB each) to a temporary folder and hashes them with
   hashlib sha256 and blake2b and, where importable, xxhash (xxh3_128, xxh3_64) and blake3: in
   memory, from the files with one thread, and with two (the GIL is released on large buffers).
   The files sit in the page cache, so this is the CPU's rate, not the disk's.
2. Projects the resume check of a `--total-tb` TB checkpoint verified by `--ranks` ranks, each
   its share: one file per rank (DCP's default, one thread per file) and `--threads` files per
   rank hashed by as many threads; beside today's serial check on rank 0, the 300 s start-up
   bound and the 60 s goal. The read rate each rank then needs from storage is printed too.
3. Times `dcp.save` of a `--save-gb` GB state dict with the plain FileSystemWriter against the
   hashing writer (`DigestingWriter`), `--repeats` runs each: to disk with fsync (DCP's default),
   and to /dev/shm without, where the hashing's CPU time is the largest share it can be.

    .venv/bin/python benchmarks/checkpoint_digest.py [--gb 2] [--save-gb 1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

from ito_assets.runtime.checkpoint.digest_writer import DigestingWriter  # noqa: E402
from ito_assets.runtime.checkpoint.file_digest import ALGORITHMS  # noqa: E402

FILE_BYTES = 250_000_000
CHUNK = 8 << 20
BOUND_S, GOAL_S = 300.0, 60.0


def _hashers() -> dict:
    found = {"sha256": hashlib.sha256, "blake2b": hashlib.blake2b}
    try:
        import xxhash
        found |= {"xxh3_128": xxhash.xxh3_128, "xxh3_64": xxhash.xxh3_64}
    except ImportError:
        pass
    try:
        import blake3
        found["blake3"] = blake3.blake3  # one thread: its own multithreading is off by default
    except ImportError:
        pass
    return found


def _write_files(folder: Path, gb: float) -> list[Path]:
    rng = np.random.default_rng(0)
    paths = []
    for i in range(max(1, round(gb * 1e9 / FILE_BYTES))):
        path = folder / f"file-{i:03d}.bin"
        path.write_bytes(rng.integers(0, 256, FILE_BYTES, dtype=np.uint8).tobytes())
        paths.append(path)
    return paths


def _hash_file(factory, path: Path) -> str:
    hasher, buffer = factory(), bytearray(CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while count := handle.readinto(buffer):
            hasher.update(view[:count])
    return hasher.hexdigest()


def _in_memory(factory, data: memoryview) -> float:
    hasher, started = factory(), time.perf_counter()
    for start in range(0, len(data), CHUNK):
        hasher.update(data[start:start + CHUNK])
    return len(data) / (time.perf_counter() - started) / 1e9


def _files(factory, paths: list[Path], threads: int) -> float:
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(lambda p: _hash_file(factory, p), paths))
    return sum(p.stat().st_size for p in paths) / (time.perf_counter() - started) / 1e9


def throughput(folder: Path, gb: float) -> dict[str, tuple[float, float, float]]:
    paths = _write_files(folder, gb)
    for path in paths:
        path.read_bytes()  # into the page cache before any timing
    data = memoryview(np.random.default_rng(1).integers(0, 256, FILE_BYTES, dtype=np.uint8).tobytes())
    rates = {name: (_in_memory(f, data), _files(f, paths, 1), _files(f, paths, 2)) for name, f in _hashers().items()}
    print(f"\n1. Hash throughput, {len(paths)} files of {FILE_BYTES / 1e6:.0f} MB ({len(paths) * FILE_BYTES / 1e9:.2f} GB, "
          f"page cache), GB/s")
    print(f"{'algorithm':<10} {'memory, 1 core':>15} {'files, 1 thread':>16} {'files, 2 threads':>17}")
    for name, (memory, one, two) in rates.items():
        print(f"{name:<10} {memory:>15.2f} {one:>16.2f} {two:>17.2f}")
    return rates


def projection(rates: dict, total_tb: float, ranks: int, threads: int) -> None:
    total_gb = total_tb * 1000
    share = total_gb / ranks
    print(f"\n2. Resume verification of {total_tb} TB, CPU-bound (files, 1 thread rate per core); "
          f"bound {BOUND_S:.0f} s, goal {GOAL_S:.0f} s")
    print(f"{'algorithm':<10} {'rank 0 alone':>13} {f'{ranks} ranks, 1 file':>18} "
          f"{f'{ranks} x {threads} threads':>18} {'read GB/s per rank':>19}")
    for name, (_, per_core, _) in rates.items():
        serial, one_file, threaded = total_gb / per_core, share / per_core, share / (per_core * threads)
        flag = "ok" if one_file <= GOAL_S else "over goal" if one_file <= BOUND_S else "over bound"
        print(f"{name:<10} {serial:>12.0f}s {one_file:>17.1f}s {threaded:>17.1f}s {share / threaded:>19.1f}  {flag}")
    print(f"   ({share:.1f} GB per rank; the flag is the 1-file column against the goal; the threaded column needs the writer to leave {threads} files per rank "
          "and storage to deliver the last column's rate to every rank at once)")


def _state(save_gb: float) -> dict:
    count = 16
    numel = int(save_gb * 1e9 / 4 / count)
    generator = torch.Generator().manual_seed(0)
    return {f"layer{i}.weight": torch.randn(numel, generator=generator) for i in range(count)}


def _timed_save(state: dict, folder: Path, writer) -> float:
    shutil.rmtree(folder, ignore_errors=True)
    os.sync()  # the last save's dirty pages are written back before this one's clock starts
    started = time.perf_counter()
    dcp.save(state, storage_writer=writer, no_dist=True)
    return time.perf_counter() - started


def _targets(folder: Path) -> list[tuple[str, Path, bool]]:
    """(label, folder, fsync): the disk as DCP writes by default, and memory without fsync, where
    nothing hides the CPU the hashing costs (the worst case for its share)."""
    found = [("disk, fsync", folder / "save", True)]
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        found.append(("/dev/shm", Path(tempfile.mkdtemp(dir=shm)) / "save", False))
    return found


def write_overhead(folder: Path, save_gb: float, repeats: int) -> None:
    state = _state(save_gb)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    print(f"\n3. dcp.save of {nbytes / 1e9:.2f} GB, plain FileSystemWriter vs hashing writer, {repeats} runs each "
          "(interleaved): seconds, min and median; the change against plain")
    print(f"{'target':<12} {'writer':<10} {'min s':>6} {'median s':>9} {'GB/s':>6} {'min':>8} {'median':>8}")
    for label, target, sync in _targets(folder):
        kinds = {"plain": lambda: dcp.FileSystemWriter(target, sync_files=sync)}
        kinds |= {name: (lambda n=name: DigestingWriter(target, algorithm=n, sync_files=sync)) for name in ALGORITHMS}
        times: dict[str, list[float]] = {name: [] for name in kinds}
        _timed_save(state, target, kinds["plain"]())  # warm-up: the first save allocates and plans
        for _ in range(repeats):
            for name, make in kinds.items():  # interleaved, so drift hits every writer alike
                times[name].append(_timed_save(state, target, make()))
        shutil.rmtree(target.parent if label == "/dev/shm" else target, ignore_errors=True)
        best, middle = min(times["plain"]), statistics.median(times["plain"])
        for name, seconds in times.items():
            low, median = min(seconds), statistics.median(seconds)
            print(f"{label:<12} {name:<10} {low:>6.2f} {median:>9.2f} {nbytes / low / 1e9:>6.2f} "
                  f"{low / best - 1:>+8.1%} {median / middle - 1:>+8.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=2.0)
    parser.add_argument("--save-gb", type=float, default=1.0)
    parser.add_argument("--total-tb", type=float, default=1.1)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the files go (default: the system's temporary folder)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    print(f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, torch {torch.__version__}")
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        rates = throughput(Path(folder), args.gb)
        projection(rates, args.total_tb, args.ranks, args.threads)
        write_overhead(Path(folder), args.save_gb, args.repeats)


if __name__ == "__main__":
    main()
