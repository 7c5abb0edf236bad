"""Gate 5's pair-file shapes (`posttraining.plan.read_pair_shapes`), which every quote and
confirmation of a run with SFT or DPO steps plans with: the first read of a file (every byte
hashed and parsed), against a later read of the same bytes (the file opened and its identity
looked up). Pairs of documentation-like lines, written to a temporary folder; CPU seconds of
this process, best of `--repeats`.

    .venv/bin/python benchmarks/pair_shapes.py [--megabytes 100] [--repeats 3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ito_assets.manifest.schema import SftStep  # noqa: E402
from ito_assets.posttraining import fixtures, plan  # noqa: E402


def pair_file(path: Path, megabytes: float) -> SftStep:
    line = {"prompt": "Explain the option --quiet of the command: ", "response": "it prints nothing but errors. " * 8}
    with path.open("w") as out:
        number = 0
        while out.tell() < megabytes * 2**20:
            out.write(json.dumps({"pair_id": f"p{number}", **line}) + "\n")
            number += 1
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    time.sleep(fixtures.RACY_NS / 1e9)  # a file changed this recently is never kept
    return SftStep(kind="sft", data={"uri": f"file://{path}", "sha256": digest, "license": "CC0-1.0", "format": "jsonl"})


def cpu_seconds(read) -> float:
    started = time.process_time()
    read()
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=100.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        step = pair_file(Path(folder) / "sft.jsonl", args.megabytes)
        first, kept = [], []
        for _ in range(args.repeats):
            plan._known_shapes.clear()
            first.append(cpu_seconds(lambda: plan.read_pair_shapes([step], Path(folder))))
            kept.append(cpu_seconds(lambda: plan.read_pair_shapes([step], Path(folder))))
        shape = plan.read_pair_shapes([step], Path(folder))["sft"]
    print(f"{args.megabytes:.0f} MB, {shape.num_pairs} pairs: first read {min(first):.3f} s, "
          f"kept {min(kept) * 1e3:.3f} ms of CPU (best of {args.repeats}); {min(first) / max(min(kept), 1e-9):,.0f}x")


if __name__ == "__main__":
    main()
