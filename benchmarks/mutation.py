"""Mutation score of the modules that enforce the promises (`make mutation`), with mutmut.

mutmut changes one thing at a time in a copy of the code (`>` into `>=`, `+=` into `=`, a constant,
a dropped argument...) and runs the tests that reach the changed function; a mutant that every
test survives is a change of behaviour nobody would notice. Each target below pairs modules with
the fast, in-process tests that exercise them: mutmut maps tests to functions by tracing the test
process, so a test that reaches a module only through a subprocess (the API server, a torchrun
worker) cannot kill its mutants and is left out of the selection.

Each target runs in its own scratch copy (benchmarks/out/mutation/<target>), so the work tree is
never changed. Prints one row per module (killed / mutants, the score against the 90 % goal) and
every surviving mutant with its diff; writes the same as JSON.

    .venv/bin/python benchmarks/mutation.py [--targets control manifest ...] [--modules cost.py ...]

mutmut mutates the bodies of functions and methods only, not module-level constants (a threshold
such as the secret scanner's entropy bits): those are pinned by boundary tests instead. Statements
that raise an error (or return an ItoError) are not mutated: their type and code are what callers
rely on, and the only changes mutmut could make there are to the wording of the message.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "out" / "mutation"
GOAL = 0.90  # the kill rate asked of every module that enforces a promise

# What the copy needs to import and test the package.
COPIED = ("ito_assets", "sensors", "definitions.py", "tests", "data", "pyproject.toml")
# In the copy only: Hypothesis generates the same examples every run (scores comparable across
# runs) and does not shrink a failure (a killed mutant must not cost minutes).
HYPOTHESIS_PROFILE = """

from hypothesis import Phase, settings as _mutation_settings
_mutation_settings.register_profile("mutation", phases=[Phase.explicit, Phase.generate], derandomize=True,
                                    database=None)
_mutation_settings.load_profile("mutation")
"""
NOT_MUTATED = (r"raise \w*Error\(", r"return ItoError\(")


@dataclass(frozen=True)
class Target:
    modules: tuple[str, ...]
    tests: tuple[str, ...]
    # "fork" forks each mutant's run from the process that collected the tests (fastest);
    # "forkserver" from a clean one: polars' thread pool hangs in a child forked after it ran.
    isolation: str = "fork"


TARGETS: dict[str, Target] = {
    "control": Target(
        modules=tuple(f"ito_assets/control/{name}.py" for name in (
            "authorization", "bookings", "cancel", "cleanup", "confirm_request", "confirmations", "cost",
            "create_run", "entitlement", "fingerprint", "idempotency", "identity", "intake", "outcome",
            "policy", "runs", "states", "validation")),
        # The PostgreSQL variants run the same Python code as the SQLite ones, a schema slower each;
        # the booking-lock test is kept: FOR UPDATE is a no-op on SQLite, so only it can tell.
        tests=("tests/control", "-k", "not postgres or booking_lock"),
    ),
    "manifest": Target(
        modules=tuple(f"ito_assets/manifest/{name}.py" for name in (
            "discovery", "schema", "secrets", "secure_read", "strict_json", "verify")),
        tests=("tests/manifest",),
    ),
    "data": Target(
        modules=("ito_assets/data/clean.py", "ito_assets/data/near_dedup.py", "ito_assets/data/decontam.py"),
        tests=("tests/data/test_clean.py", "tests/data/test_dedup.py", "tests/data/test_decontam.py",
               "tests/data/test_conservation_account.py", "tests/data/test_thresholds.py"),
        isolation="forkserver",
    ),
    "runtime": Target(
        modules=("ito_assets/runtime/checkpoint/markers.py", "ito_assets/runtime/supervision/supervisor.py",
                 "ito_assets/runtime/supervision/spikes.py", "ito_assets/runtime/stage/eval_gate.py"),
        tests=("tests/runtime/test_restart_budget.py", "tests/runtime/test_markers.py",
               "tests/runtime/test_runtime_thresholds.py", "tests/runtime/test_spike_proposals.py",
               "tests/runtime/test_eval_gates.py",
               # real torchrun workers: too slow to run once per mutant, and out of process anyway
               "--deselect",
               "tests/runtime/test_spike_proposals.py::test_a_real_worker_proposes_on_a_spike_and_keeps_training"),
    ),
    "planner": Target(
        modules=("ito_assets/training/planner.py",),
        tests=("tests/training/test_planner.py", "tests/training/test_planner_boundaries.py"),
    ),
}

# mutmut's exit codes, as its own `mutmut results` names them (mutmut/stats.py).
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped",
          36: "timeout", 24: "timeout", -24: "timeout", 152: "timeout", 255: "timeout",
          -11: "segfault", -9: "segfault", 37: "caught by type check", None: "not checked"}
DETECTED = {"killed", "timeout", "segfault"}  # a timeout or a crash is a test noticing the change


def toml_list(values) -> str:
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"


def prepare(name: str, target: Target) -> Path:
    """A scratch copy of the project with a [tool.mutmut] section for this target only."""
    work = OUT / name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for entry in COPIED:
        source = ROOT / entry
        if source.is_dir():
            shutil.copytree(source, work / entry, ignore=ignore)
        elif source.exists():
            shutil.copy2(source, work / entry)
    section = (
        "\n[tool.mutmut]\n"
        f"source_paths = {toml_list(target.modules)}\n"
        f"pytest_add_cli_args_test_selection = {toml_list(target.tests)}\n"
        f"also_copy = {toml_list(COPIED[:-1])}\n"
        f"do_not_mutate_patterns = {toml_list(NOT_MUTATED)}\n"
        f"process_isolation = {json.dumps(target.isolation)}\n"
    )
    with open(work / "pyproject.toml", "a") as file:
        file.write(section)
    with open(work / "tests" / "conftest.py", "a") as file:
        file.write(HYPOTHESIS_PROFILE)
    return work


def statuses(work: Path, module: str) -> dict[str, str]:
    meta = work / "mutants" / f"{module}.meta"
    if not meta.exists():
        return {}
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    return {key: STATUS.get(code, "suspicious") for key, code in codes.items()}


def diff_of(work: Path, mutmut: str, mutant: str) -> str:
    shown = subprocess.run([mutmut, "show", mutant], cwd=work, capture_output=True, text=True).stdout
    changed = [line for line in shown.splitlines() if re.match(r"^[-+](?![-+])", line)]
    return " | ".join(line.strip() for line in changed)[:300]


def run_target(name: str, target: Target, mutmut: str, max_children: int) -> dict:
    work = prepare(name, target)
    started = time.monotonic()
    with open(work / "mutmut.log", "w") as log:
        done = subprocess.run([mutmut, "run", "--max-children", str(max_children)], cwd=work, stdout=log,
                              stderr=subprocess.STDOUT)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        tail = (work / "mutmut.log").read_text(errors="replace").replace("\r", "\n").splitlines()[-30:]
        raise SystemExit(f"mutmut failed on {name} (exit {done.returncode}):\n" + "\n".join(tail))
    modules = []
    for module in target.modules:
        found = statuses(work, module)
        counted = Counter(found.values())
        total = sum(n for status, n in counted.items() if status != "skipped")
        detected = sum(counted[s] for s in DETECTED)
        survivors = sorted(k for k, s in found.items() if s in ("survived", "no tests", "suspicious"))
        modules.append({
            "module": module, "mutants": total, "detected": detected,
            "score": detected / total if total else None, "statuses": dict(counted),
            "survivors": [{"mutant": k, "status": found[k], "diff": diff_of(work, mutmut, k)} for k in survivors],
        })
    return {"target": name, "seconds": round(seconds, 1), "tests": list(target.tests), "modules": modules}


def print_table(results: list[dict]) -> None:
    print(f"{'module':44} {'mutants':>7} {'detected':>8} {'score':>6}  vs goal {GOAL:.0%}")
    for result in results:
        for row in result["modules"]:
            score = row["score"]
            shown = "-" if score is None else f"{score:.1%}"
            verdict = "-" if score is None else ("ok" if score >= GOAL else "BELOW")
            print(f"{row['module']:44} {row['mutants']:7d} {row['detected']:8d} {shown:>6}  {verdict}")
        print(f"  ({result['target']}: {result['seconds']:.0f} s, tests: {' '.join(result['tests'])})")
    all_rows = [row for result in results for row in result["modules"]]
    total = sum(r["mutants"] for r in all_rows)
    detected = sum(r["detected"] for r in all_rows)
    if total:
        print(f"{'all':44} {total:7d} {detected:8d} {detected / total:6.1%}")
    print("\nsurviving mutants:")
    for row in all_rows:
        for survivor in row["survivors"]:
            print(f"  {survivor['mutant']} [{survivor['status']}]: {survivor['diff']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="*", default=list(TARGETS), choices=list(TARGETS))
    parser.add_argument("--modules", nargs="*", default=None,
                        help="only these modules of the targets (file names such as cost.py)")
    parser.add_argument("--max-children", type=int, default=2)
    args = parser.parse_args()
    mutmut = shutil.which("mutmut", path=str(Path(sys.executable).parent)) or "mutmut"
    chosen = {name: TARGETS[name] for name in args.targets}
    if args.modules:
        chosen = {name: replace(t, modules=tuple(m for m in t.modules if Path(m).name in args.modules))
                  for name, t in chosen.items()}
        chosen = {name: t for name, t in chosen.items() if t.modules}
    results = [run_target(name, target, mutmut, args.max_children) for name, target in chosen.items()]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "results.json").write_text(json.dumps(results, indent=2))
    print_table(results)
    print(f"\nresults: {OUT / 'results.json'}; mutmut's own logs: {OUT}/<target>/mutmut.log")
    below = [r for result in results for r in result["modules"] if r["score"] is not None and r["score"] < GOAL]
    return 1 if below else 0


if __name__ == "__main__":
    sys.exit(main())
