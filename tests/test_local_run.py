"""`make run`'s driver on the shipped fixtures, in a temporary state dir: the headless path."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(1200)  # the whole lineage twice: about 5 minutes on an idle 2-core machine
def test_local_run_materializes_the_fixtures_then_finds_nothing_new(tmp_path):
    env = {**os.environ, "ITO_STATE_DIR": str(tmp_path / "state"), "DAGSTER_HOME": str(tmp_path / "state" / "dagster")}
    (tmp_path / "state" / "dagster").mkdir(parents=True)
    (tmp_path / "state" / "dagster" / "dagster.yaml").write_text((ROOT / "deploy/local/dagster.yaml").read_text())

    def run() -> str:
        result = subprocess.run(
            [sys.executable, "-m", "ito_assets.local_run"], cwd=ROOT, env=env,
            capture_output=True, text=True, timeout=900,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return result.stdout

    first = run()
    launched = int(re.search(r"runs launched: (\d+)", first).group(1))
    # One preparation run per reviewed manifest, one training run for the ledger run the API created.
    assert launched == len(list((ROOT / "data/fixtures/manifests").glob("*.json"))) + 1
    assert re.search(r"ledger: .*; run run_\w+ \(key walkthrough-\w+\) is succeeded", first)
    assert re.search(r"checks passed: [1-9]\d*, failed: 0", first)
    assert "training_manifest [" in first
    assert str(tmp_path / "state" / "dagster") in first
    second = run()
    assert "runs launched: 0" in second and "nothing new" in second
