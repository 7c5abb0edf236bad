"""What completion markers cost: the data plane's resumable phases with and without them, in one
run, on the same work units.

A corpus of `--scale` times the fixture corpus (data_scaling.generate: exact copies, near copies
and new documents of fixture sentences) is cut into work units of 1 MiB (data_scaling's
BENCH_SCALE). Each resumable phase then runs over those units in this process, one worker, as
`map_units` does it:
- "plain": the unit function alone, the baseline;
- "marked": with completion markers, as the steps run it now (the key hashes every input file,
  the worker hashes what it wrote, the marker and any result frame are written);
- "resumed": the same call again with every unit finished: what a rerun pays to trust the finished
  units (every marker read, every output hashed again) instead of redoing them.
Phases: dedup signatures (SignatureTask, four arrays a unit) and decontamination seeds (MatchTask,
one matches file and a frame result). The best of `--repeat` runs of each is reported.

    .venv/bin/python benchmarks/unit_markers.py [--scale 8] [--repeat 3] [--out benchmarks/results/unit_markers.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import polars as pl  # noqa: E402

from data_scaling import BENCH_SCALE, SUITE, generate  # noqa: E402
from ito_assets.data.completion import CompletionMarkers  # noqa: E402
from ito_assets.data.config import DecontamConfig, DedupConfig  # noqa: E402
from ito_assets.data.decontam_units import MatchTask, match_unit  # noqa: E402
from ito_assets.data.dedup_units import SignatureTask, signature_unit  # noqa: E402
from ito_assets.data.eval_index import build_index  # noqa: E402
from ito_assets.data.units import map_units, write_units  # noqa: E402
from ito_assets.evals.suite import load_suite  # noqa: E402


def timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def phase_figures(name: str, function, make_tasks, folder: Path, repeat: int) -> dict:
    best = {"plain": float("inf"), "marked": float("inf"), "resumed": float("inf")}
    for _ in range(repeat):
        shutil.rmtree(folder, ignore_errors=True)
        plain = CompletionMarkers(folder)  # only its folder: the units write there either way
        best["plain"] = min(best["plain"], timed(lambda: map_units(function, make_tasks(plain.folder), None, phase=name)))
        shutil.rmtree(folder)
        markers = CompletionMarkers(folder)
        tasks = make_tasks(markers.folder)
        best["marked"] = min(best["marked"], timed(lambda: map_units(function, tasks, None, phase=name, markers=markers)))
        best["resumed"] = min(best["resumed"], timed(lambda: map_units(function, tasks, None, phase=name, markers=markers)))
    return {"phase": name, **{k: round(v, 3) for k, v in best.items()},
            "marked_over_plain": round(best["marked"] / best["plain"], 3),
            "resumed_over_plain": round(best["resumed"] / best["plain"], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    texts = generate(args.scale)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        frame = pl.DataFrame({"doc_id": [f"d{i}" for i in range(len(texts))], "text": texts})
        units = write_units([frame], root / "units", BENCH_SCALE["unit_bytes"])
        num_bytes = sum(u.num_bytes for u in units)
        print(f"{len(texts):,} documents, {num_bytes / 2**20:.1f} MiB of text, {len(units)} work units")
        dedup = DedupConfig()
        index = build_index(load_suite(SUITE), DecontamConfig())
        rows = [
            phase_figures("dedup signatures", signature_unit,
                          lambda out: [SignatureTask(unit=u, folder=str(out), config=dedup, num_partitions=1) for u in units], root / "arrays", args.repeat),
            phase_figures("decontamination seeds", match_unit,
                          lambda out: [MatchTask(unit=u, index=index, matches_path=str(out / f"matches-{u.index:05d}.parquet")) for u in units],
                          root / "matches", args.repeat),
        ]
    print(f"{'phase':<24}{'plain s':>9}{'marked s':>10}{'resumed s':>11}{'marked/plain':>14}{'resumed/plain':>15}")
    for row in rows:
        print(f"{row['phase']:<24}{row['plain']:>9.3f}{row['marked']:>10.3f}{row['resumed']:>11.3f}"
              f"{row['marked_over_plain']:>14.3f}{row['resumed_over_plain']:>15.3f}")
    if args.out:
        args.out.write_text(json.dumps({"scale": args.scale, "documents": len(texts), "text_mib": round(num_bytes / 2**20, 1),
                                        "units": len(units), "repeat": args.repeat, "phases": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
