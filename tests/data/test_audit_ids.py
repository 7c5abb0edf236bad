"""`ito audit` takes every id the pipeline can produce (a record's own id: any text; an eval item's:
1-256 characters of any kind) and refuses only what could never be one; the records skipped for an
empty text are counted where a user looks (`ito audit manifest`) and named when `ito audit doc`
finds no document. The stages on files, then the auditor's commands on the warehouse."""

from __future__ import annotations

import json
import random
from pathlib import Path

import duckdb
import pytest

from corpus_manifest import corpus_manifest, FIXTURE_MANIFEST
from data_frames import random_text
from ito_assets.api.cli import run
from ito_assets.data import stages
from ito_assets.data.config import DataPrepConfig, ScaleConfig
from ito_assets.evals.suite import load_suite
from ito_assets.settings import PROJECT_ROOT

FIXTURES = PROJECT_ROOT / "data" / "fixtures"
SCALE = ScaleConfig(num_workers=1, unit_bytes=20_000, memory_limit_mb=128)
# Ids a suite accepts that the old pattern (printable ASCII, no space) refused.
ITEM_IDS = ["my item/0", "ü/1", "tab\there", "z" * 256]
# Record ids the sources keep (`sources.record_id`) that the old pattern (no control character,
# at most 256) refused, and some it took.
RECORD_IDS = ["a\tb", "x" * 300, "line\nbreak", "with space", "ü/ß", "O'Brien \"quoted\" \\ $HOME"]
BLANK_IDS = ["w1", "w2", "w3"]


def _items() -> list[dict]:
    """The committed suite's first items under the odd ids."""
    committed = load_suite(FIXTURES / "evals" / "ito-fixture-evals-v1.jsonl").items
    return [{**item.model_dump(), "id": item_id} for item_id, item in zip(ITEM_IDS, committed)]


def _prepare(root: Path, *, blanks: bool) -> tuple[Path, str]:
    """A corpus of the odd ids (the first quoting the first item), fillers and, with `blanks`,
    three records with an empty or whitespace-only text; its stages run into a warehouse."""
    rng = random.Random(5)
    items = _items()
    suite_path = root / "odd.jsonl"
    suite_path.write_text("".join(json.dumps(r) + "\n" for r in [{"suite_id": "odd-v1"}, *items]))
    suite = load_suite(suite_path)
    records = [{"id": record_id, "text": random_text(rng, 60)} for record_id in RECORD_IDS]
    records[0]["text"] += f" {items[0]['question']} {items[0]['answer']}"
    records += [{"id": 7, "text": random_text(rng, 60)}, *({"id": f"filler-{i}", "text": random_text(rng, 60)} for i in range(10))]
    if blanks:
        records += [{"id": i, "text": t} for i, t in zip(BLANK_IDS, ["", "   ", "\u3000\n"])]
    fixture = json.loads(FIXTURE_MANIFEST.read_text())["data"][0]["decontamination"]
    verified = corpus_manifest(root, records, decontamination={**fixture, "eval_suite_id": suite.suite_id,
                                                               "eval_suite_sha256": suite.digest})
    state, warehouse = root / "state", root / "state" / "warehouse.duckdb"
    config = DataPrepConfig(scale=SCALE)
    source = stages.run_sources(verified, root, state, warehouse, config)
    decontam = stages.run_decontam(verified, suite, source, state, warehouse, config)
    dedup = stages.run_dedup(source, decontam.actions, state, warehouse, config)
    stages.run_clean(verified, source, dedup, decontam, state, warehouse, config)
    return warehouse, verified.short_digest


@pytest.fixture(scope="module")
def blanks(tmp_path_factory) -> tuple[Path, str]:
    from os.path import realpath

    return _prepare(Path(realpath(tmp_path_factory.mktemp("blanks"))), blanks=True)


@pytest.fixture
def audit(blanks, monkeypatch):
    monkeypatch.setenv("ITO_STATE_DIR", str(blanks[0].parent))
    return lambda *argv: run(["audit", *argv, "--json"])


@pytest.mark.parametrize("record_id", RECORD_IDS + ["7"])
def test_every_record_id_the_sources_keep_is_audited(audit, record_id: str) -> None:
    report, status = audit("doc", record_id)
    assert status == 0, report
    assert [(m["matched_by"], m["source_record_id"]) for m in report["data"]["manifests"]] == [("source_record_id", record_id)]


def test_the_contaminated_document_names_the_item_that_audit_then_takes(audit) -> None:
    report, _ = audit("doc", RECORD_IDS[0])
    assert report["data"]["manifests"][0]["eval_item_ids"] == [ITEM_IDS[0]]
    report, status = audit("eval-item", ITEM_IDS[0])
    assert status == 0 and [h["source_record_id"] for h in report["data"]["hits"]] == [RECORD_IDS[0]]


@pytest.mark.parametrize("item_id", ITEM_IDS)
def test_every_item_id_a_suite_holds_is_audited(audit, item_id: str) -> None:
    report, status = audit("eval-item", item_id)
    assert status == 0 and report["data"]["eval_item_id"] == item_id, report


@pytest.mark.parametrize("item_id", ["", "z" * 257, "ü" * 257, "bad\udcffbytes"])
def test_what_no_suite_can_hold_is_a_usage_error_that_echoes_nothing(audit, item_id: str) -> None:
    report, status = audit("eval-item", item_id)
    assert status == 2 and report["error"]["code"] == "USAGE_ERROR" and "1-256 characters" in report["error"]["message"]


@pytest.mark.parametrize("item_id", ["q", "z" * 255, "ü" * 256])
def test_an_id_within_the_bound_that_no_suite_holds_is_not_found(audit, item_id: str) -> None:
    report, status = audit("eval-item", item_id)
    assert status == 1 and report["error"]["code"] == "AUDIT_NOT_FOUND"


def test_bytes_that_are_not_utf8_are_no_document_id(audit) -> None:
    """As argv hands them to Python (surrogateescape): no id in the warehouse is such text."""
    report, status = audit("doc", "bad\udcffbytes")
    assert status == 2 and report["error"]["code"] == "USAGE_ERROR" and "bytes" not in report["error"]["message"]


def test_the_manifest_counts_the_empty_records_it_skipped(audit, blanks) -> None:
    report, status = audit("manifest", blanks[1])
    assert status == 0
    data = report["data"]
    documents = len(RECORD_IDS) + 11
    assert data["records"] == {"read": documents + 3, "documents": documents, "empty_skipped": 3}
    assert [(s["num_documents"], s["num_empty_skipped"]) for s in data["sources"]] == [(documents, 3)]
    assert sum(s["num_documents"] for s in data["states"]) == documents
    text, _ = run(["audit", "manifest", blanks[1]])
    assert f"records read: {documents + 3} = {documents} documents + 3 skipped" in "\n".join(text["_text"])


@pytest.mark.parametrize("record_id", BLANK_IDS)
def test_a_skipped_empty_record_is_pointed_at_when_no_document_is_found(audit, blanks, record_id: str) -> None:
    report, status = audit("doc", record_id)
    assert status == 1 and report["error"]["code"] == "AUDIT_NOT_FOUND"
    message = report["error"]["message"]
    assert "empty or whitespace-only text (3 by manifest " + blanks[1] in message and f"ito audit manifest {blanks[1]}" in message


def test_without_skipped_records_not_found_says_no_more(real_tmp, monkeypatch) -> None:
    warehouse, _ = _prepare(real_tmp, blanks=False)
    monkeypatch.setenv("ITO_STATE_DIR", str(warehouse.parent))
    report, status = run(["audit", "doc", "w1", "--json"])
    assert status == 1 and report["error"]["message"] == "no document with this id or record id is in the warehouse"


def test_a_warehouse_written_before_the_count_still_audits(real_tmp, monkeypatch) -> None:
    """Read-only, the audit finds no such column: the count is unknown, not an error (the next
    write of the sources adds the column)."""
    warehouse, key = _prepare(real_tmp, blanks=True)
    with duckdb.connect(str(warehouse)) as con:
        con.execute("ALTER TABLE sources DROP COLUMN num_empty_skipped")
    monkeypatch.setenv("ITO_STATE_DIR", str(warehouse.parent))
    report, status = run(["audit", "manifest", key, "--json"])
    assert status == 0 and report["data"]["records"]["read"] is None and report["data"]["sources"][0]["num_empty_skipped"] is None
    report, status = run(["audit", "doc", "w1", "--json"])
    assert status == 1 and report["error"]["message"] == "no document with this id or record id is in the warehouse"
