"""An eval item too short to index was never looked for: `ito audit eval-item` says so, rather
than "0 matching document(s)", which would read as a corpus free of it."""

from __future__ import annotations

import json
import random
from os.path import realpath
from pathlib import Path

import pytest

from corpus_manifest import corpus_manifest
from data_frames import random_text
from ito_assets.api.cli import run
from ito_assets.data import stages
from ito_assets.data.config import DataPrepConfig, ScaleConfig
from ito_assets.evals.suite import load_suite
from ito_assets.settings import PROJECT_ROOT

FIXTURES = PROJECT_ROOT / "data" / "fixtures"
SUITE = FIXTURES / "evals" / "ito-fixture-evals-v1.jsonl"
CONFIG = DataPrepConfig(scale=ScaleConfig(num_workers=1, unit_bytes=20_000, memory_limit_mb=128))
SHORT = {"id": "short/1", "benchmark": "short", "question": "Which command lists files?", "answer": "ls"}


@pytest.fixture(scope="module")
def decontaminated(tmp_path_factory) -> dict:
    root = Path(realpath(tmp_path_factory.mktemp("not-looked-for")))
    suite_path = root / "suite.jsonl"
    suite_path.write_text(SUITE.read_text() + json.dumps(SHORT) + "\n")
    suite = load_suite(suite_path)
    long_item = suite.items[0]
    rng = random.Random(3)
    records = [{"id": "quotes-short", "text": f"{random_text(rng, 40)} {SHORT['question']} {SHORT['answer']}"},
               *({"id": f"filler-{i}", "text": random_text(rng, 80)} for i in range(6))]
    verified = corpus_manifest(root, records)
    state = root / "state"
    source = stages.run_sources(verified, root, state, state / "warehouse.duckdb", CONFIG)
    stages.run_decontam(verified, suite, source, state, state / "warehouse.duckdb", CONFIG)
    return {"state": state, "digest": verified.digest, "key": verified.short_digest, "long": long_item.id}


def _audit(monkeypatch, state: Path, *argv: str):
    monkeypatch.setenv("ITO_STATE_DIR", str(state))
    return run(["audit", *argv])


def test_an_item_too_short_to_index_is_named_not_looked_for(decontaminated, monkeypatch) -> None:
    report, status = _audit(monkeypatch, decontaminated["state"], "eval-item", SHORT["id"], "--json")
    assert status == 0 and report["data"]["num_documents"] == 0  # the document quoting it was not found
    assert report["data"]["not_looked_for_in"] == [decontaminated["digest"]]
    text, _ = _audit(monkeypatch, decontaminated["state"], "eval-item", SHORT["id"])
    assert any(line.startswith(f"warning: in manifest {decontaminated['key']}, this item was not looked for")
               for line in text["_text"])


def test_an_item_long_enough_was_looked_for(decontaminated, monkeypatch) -> None:
    report, status = _audit(monkeypatch, decontaminated["state"], "eval-item", decontaminated["long"], "--json")
    assert status == 0 and report["data"]["not_looked_for_in"] == []
    text, _ = _audit(monkeypatch, decontaminated["state"], "eval-item", decontaminated["long"])
    assert not any("not looked for" in line for line in text["_text"])
