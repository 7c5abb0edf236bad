"""Every document is decontaminated, duplicates too, and a duplicate cluster's survivor is chosen
knowing contamination: the stages on files, then the auditor's commands on the warehouse."""

from __future__ import annotations

import random
from pathlib import Path

import duckdb
import polars as pl
import pytest

from corpus_manifest import corpus_manifest
from data_frames import random_text
from ito_assets.api.cli import run
from ito_assets.data import stages
from ito_assets.data.config import DataPrepConfig, DecontamConfig, ScaleConfig
from ito_assets.evals.suite import load_suite
from ito_assets.settings import PROJECT_ROOT

FIXTURES = PROJECT_ROOT / "data" / "fixtures"
SCALE = ScaleConfig(num_workers=1, unit_bytes=20_000, memory_limit_mb=128)


def _records(question: str) -> list[dict]:
    """Ids say what each document is. A planted document and its near copy, both contaminated;
    a contaminated document that comes first in source order and a clean near copy of it after;
    fillers."""
    rng = random.Random(3)
    clean_text = random_text(rng, 220)
    planted = f"{random_text(rng, 200)} {question}"
    return [
        {"id": "planted", "text": planted},
        {"id": "planted-copy", "text": planted.replace(planted.split()[5], "changed", 1)},
        {"id": "contaminated-first", "text": f"{clean_text} {question}"},
        {"id": "clean-later", "text": clean_text},
        *({"id": f"filler-{i}", "text": random_text(rng, 80)} for i in range(20)),
    ]


def _prepare(root: Path, action: str):
    suite = load_suite(FIXTURES / "evals" / "ito-fixture-evals-v1.jsonl")
    item = suite.items[0]
    verified = corpus_manifest(root, _records(item.question))
    state, warehouse = root / "state", root / "state" / "warehouse.duckdb"
    config = DataPrepConfig(decontam=DecontamConfig(action=action), scale=SCALE)
    source = stages.run_sources(verified, root, state, warehouse, config)
    decontam = stages.run_decontam(verified, suite, source, state, warehouse, config)
    dedup = stages.run_dedup(source, decontam.actions, state, warehouse, config)
    clean = stages.run_clean(verified, source, dedup, decontam, state, warehouse, config)
    return item, clean, warehouse


def _final_by_record(clean: stages.CleanStage) -> dict[str, dict]:
    return {r["source_record_id"]: r for r in pl.read_parquet(clean.decisions.path).iter_rows(named=True)}


@pytest.mark.parametrize("action", ["drop", "cut"])
def test_a_clean_document_survives_its_contaminated_duplicate(real_tmp: Path, action: str) -> None:
    item, clean, _ = _prepare(real_tmp, action)
    final = _final_by_record(clean)
    assert clean.conservation.holds, clean.conservation.problems
    # planted-copy and contaminated-first: removed as duplicates, their hits on record.
    assert clean.conservation.num_duplicate_contaminated == 2
    # Without contamination in the keep order, the first in source order would have survived.
    later, first = final["clean-later"], final["contaminated-first"]
    assert later["state"] == "kept" and later["eval_item_ids"] is None
    assert first["state"] == "duplicate" and first["duplicate_of"] == later["doc_id"]
    # It was scanned all the same: its hits and decontamination's action are on record.
    assert first["eval_item_ids"] == [item.id] and first["action"] == action
    assert final["clean-later"]["family_id"] == final["contaminated-first"]["family_id"] == later["doc_id"]
    texts = clean.shards.read(["doc_id", "text"])
    assert later["doc_id"] in texts["doc_id"].to_list()


def test_auditors_see_a_contaminated_duplicate_by_eval_item_and_by_their_own_id(real_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    item, clean, warehouse = _prepare(real_tmp, "drop")
    final = _final_by_record(clean)
    assert final["planted"]["state"] == "contaminated" and final["planted-copy"]["state"] == "duplicate"
    monkeypatch.setenv("ITO_STATE_DIR", str(warehouse.parent))
    report, status = run(["audit", "eval-item", item.id, "--json"])
    assert status == 0
    states = {h["source_record_id"]: h["state"] for h in report["data"]["hits"]}
    # Every document that quotes the item, the two removed as duplicates included.
    assert states == {"planted": "contaminated", "planted-copy": "duplicate", "contaminated-first": "duplicate"}
    assert report["data"]["num_documents"] == 3
    # The user's own id is enough to ask why a document is gone.
    shown, status = run(["audit", "doc", "planted-copy"])
    text = "\n".join(shown["_text"])
    assert status == 0
    assert f"duplicate of {final['planted']['doc_id']} (your id planted;" in text and f"it also matched {item.id} (decontamination would drop it)" in text
    with duckdb.connect(str(warehouse), read_only=True) as con:
        (num_rows,) = con.execute("SELECT count(*) FROM contamination_hits WHERE source_record_id IS NULL").fetchone()
    assert num_rows == 0
