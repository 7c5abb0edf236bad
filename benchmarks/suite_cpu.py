"""Where `make test`'s CPU goes: each test's own CPU and that of the processes it started and
waited for (stage workers, torchrun, CLIs), as a pytest plugin, then a summary.

The suite is bound by the two cores of a CI machine, not by its waits, so a cut is worth its CPU,
not its wall time (which the other workers' load inflates). Record, then summarize:

    PYTHONPATH=benchmarks .venv/bin/python -m pytest -q -n 3 --dist loadfile -p suite_cpu
    .venv/bin/python benchmarks/suite_cpu.py [ITO_SUITE_CPU file] [--top 30]

Each xdist worker appends to the file named by ITO_SUITE_CPU (default benchmarks/out/suite_cpu.jsonl);
delete it before a new recording. A process a test kills rather than waits for is not counted.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import time
from pathlib import Path

import pytest

DEFAULT = Path(__file__).resolve().parent / "out" / "suite_cpu.jsonl"


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    own, children, started = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN), time.monotonic()
    yield
    row = {"id": item.nodeid, "self": _cpu(resource.RUSAGE_SELF) - own,
           "children": _cpu(resource.RUSAGE_CHILDREN) - children, "wall": time.monotonic() - started}
    path = Path(os.environ.get("ITO_SUITE_CPU", DEFAULT))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:  # one short line a write: the workers' appends do not interleave
        out.write(json.dumps(row) + "\n")


def summarize(path: Path, top: int) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    cpu = {row["id"]: row["self"] + row["children"] for row in rows}
    folders: collections.Counter = collections.Counter()
    for test, seconds in cpu.items():
        parts = test.split("::")[0].split("/")
        folders[parts[1] if len(parts) > 2 else parts[-1]] += seconds
    print(f"{len(rows)} tests, {sum(cpu.values()):,.0f} CPU-seconds (own and waited-for children's)")
    for folder, seconds in folders.most_common():
        print(f"  {seconds:8.1f}  {folder}")
    print(f"the {top} costliest tests:")
    for test, seconds in sorted(cpu.items(), key=lambda item: -item[1])[:top]:
        print(f"  {seconds:8.1f}  {test}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument("--top", type=int, default=30)
    arguments = parser.parse_args()
    summarize(arguments.path, arguments.top)
