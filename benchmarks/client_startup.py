"""How fast `ito status` answers against a local `ito serve` (goal: well under half a
second).

Starts a throwaway server on a free loopback port with its own state folder, creates one run
through the client, then times fresh processes (median and p90 of --repeat runs):
  baseline      python -c pass                       (interpreter start)
  import        python -c "import ito_assets.api.cli" (the client's import cost)
  status        ito status RUN --json                 (start, token file, one HTTP round trip)
after one warm-up run each (bytecode cached, as for an installed client), and reports which heavy packages (dagster, torch, polars) a status call imported: none expected.

    .venv/bin/python benchmarks/client_startup.py [--repeat 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "api")]

HEAVY = ("dagster", "torch", "polars")
PROBE = (
    "import sys; from ito_assets.api import cli; doc, code = cli.run(sys.argv[1:]); "
    f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))"
)


def timed(argv: list[str], env: dict, repeat: int) -> list[float]:
    samples = []
    subprocess.run(argv, env=env, capture_output=True)  # warm-up: writes the bytecode cache
    for _ in range(repeat):
        start = time.perf_counter()
        done = subprocess.run(argv, env=env, capture_output=True)
        samples.append(time.perf_counter() - start)
        if done.returncode != 0:
            raise SystemExit(f"failed: {' '.join(argv[:4])}: {done.stdout[-300:]!r} {done.stderr[-300:]!r}")
    return samples


def describe(name: str, samples: list[float]) -> str:
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]
    return f"{name:<9} median {statistics.median(samples) * 1000:7.1f} ms   p90 {p90 * 1000:7.1f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    from api_harness import Client, Server  # the test harness: a real server and client

    with tempfile.TemporaryDirectory(prefix="ito-bench-") as folder:
        root = Path(os.path.realpath(folder))
        server = Server(root / "server")
        try:
            client = Client(server, root / "client")
            _booking, run_id = client.started_run()
            env = {**os.environ, **{k: v for k, v in client.env("account").items() if v is not None}}
            # Measure an installed client: with bytecode caching on (some sandboxes turn it off,
            # which makes every start recompile every module).
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            python = sys.executable
            results = {
                "baseline": timed([python, "-c", "pass"], env, args.repeat),
                "import": timed([python, "-c", "import ito_assets.api.cli"], env, args.repeat),
                "status": timed([python, "-m", "ito_assets.api.cli", "status", run_id, "--json"], env, args.repeat),
            }
            probe = subprocess.run([python, "-c", PROBE, "status", run_id, "--json"], env=env,
                                   capture_output=True, text=True, check=True)
        finally:
            server.stop()
    for name, samples in results.items():
        print(describe(name, samples))
    over = statistics.median(results["status"]) - statistics.median(results["baseline"])
    print(f"status over baseline: {over * 1000:.1f} ms (target: status well under 500 ms)")
    print(f"heavy packages imported by `ito status`: {json.loads(probe.stdout.strip().replace(chr(39), chr(34)))}")
    return 0 if statistics.median(results["status"]) < 0.5 else 1


if __name__ == "__main__":
    sys.exit(main())
