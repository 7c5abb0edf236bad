"""`ito audit` answers every document and eval item exactly: each fate, ids that look like SQL or
patterns, and a warehouse whose decontamination ran again after the clean shards were written
(another eval suite): the decision the clean shards follow is never hidden behind the hits of
a decontamination that did not take effect. The stages on files, then the commands."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import duckdb
import pytest

from corpus_manifest import corpus_manifest
from data_frames import random_text
from ito_assets.api.cli import run
from ito_assets.data import stages
from ito_assets.data.config import DataPrepConfig, ScaleConfig
from ito_assets.evals.suite import load_suite
from ito_assets.manifest.verify import verify_manifest
from ito_assets.settings import PROJECT_ROOT

FIXTURES = PROJECT_ROOT / "data" / "fixtures"
SUITE = FIXTURES / "evals" / "ito-fixture-evals-v1.jsonl"
CONFIG = DataPrepConfig(scale=ScaleConfig(num_workers=1, unit_bytes=20_000, memory_limit_mb=128))
# Ids a LIKE or glob would read as patterns, or SQL would read as code, and ids differing only
# in case or Unicode normalisation: each must find its own record alone.
HOSTILE_IDS = ["%", "_", "*", "' OR 1=1 --", "caf\u00e9", "cafe\u0301", "Case", "case"]


def _records(rng: random.Random, a, b) -> list[dict]:
    """Ids say what each document is: one quoting item a, its exact copy, one quoting item b,
    a document and its near copy, the hostile ids, fillers."""
    base = random_text(rng, 120).split()
    near = [*base[:60], "zzchanged", *base[61:]]
    quoting_a = f"{random_text(rng, 60)} {a.question} {a.answer}"
    return [
        {"id": "quotes-a", "text": quoting_a},
        {"id": "quotes-a-copy", "text": quoting_a},
        {"id": "quotes-b", "text": f"{random_text(rng, 60)} {b.question} {b.answer}"},
        {"id": "base", "text": " ".join(base)},
        {"id": "near", "text": " ".join(near)},
        *({"id": record_id, "text": random_text(rng, 80)} for record_id in HOSTILE_IDS),
        *({"id": f"filler-{i}", "text": random_text(rng, 80)} for i in range(8)),
    ]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> dict:
    """The stages run once against the committed suite; then the suite loses item a and the
    decontamination runs again, which the clean stage refuses (EVAL_SUITE_MISMATCH): the
    warehouse holds the new hits beside the decisions the clean shards follow."""
    from os.path import realpath

    root = Path(realpath(tmp_path_factory.mktemp("hostile")))
    suite = load_suite(SUITE)
    a, b = suite.items[0], suite.items[1]
    verified = corpus_manifest(root, _records(random.Random(7), a, b))
    state, warehouse = root / "state", root / "state" / "warehouse.duckdb"
    source = stages.run_sources(verified, root, state, warehouse, CONFIG)
    decontam = stages.run_decontam(verified, suite, source, state, warehouse, CONFIG)
    dedup = stages.run_dedup(source, decontam.actions, state, warehouse, CONFIG)
    stages.run_clean(verified, source, dedup, decontam, state, warehouse, CONFIG)
    fresh = root / "fresh"
    fresh.mkdir()
    (fresh / "warehouse.duckdb").write_bytes(warehouse.read_bytes())  # before the suite changes
    changed = root / "changed.jsonl"
    changed.write_text("".join(line for line in SUITE.read_text().splitlines(keepends=True) if a.id not in line))
    # Deduplication run again alone with a stricter threshold, on a copy: the near copy (J ~0.92)
    # is kept by it, while the clean shards still follow the decision that removed it.
    rededuped = root / "rededuped"
    rededuped.mkdir()
    (rededuped / "warehouse.duckdb").write_bytes(warehouse.read_bytes())
    stricter = dataclasses.replace(CONFIG, dedup=dataclasses.replace(CONFIG.dedup, threshold=0.95))
    stages.run_dedup(source, decontam.actions, rededuped, rededuped / "warehouse.duckdb", stricter)
    stages.run_decontam(verified, load_suite(changed), source, state, warehouse, CONFIG)
    return {"fresh": fresh, "stale": state, "rededuped": rededuped, "root": root, "a": a.id, "b": b.id,
            "key": verified.short_digest}


def _audit(monkeypatch, state: Path, *argv: str) -> tuple[dict, int]:
    monkeypatch.setenv("ITO_STATE_DIR", str(state))
    return run(["audit", *argv, "--json"])


def _entry(monkeypatch, state: Path, *argv: str) -> dict:
    report, status = _audit(monkeypatch, state, "doc", *argv)
    assert status == 0, report
    [entry] = report["data"]["manifests"]
    return entry


def test_every_fate_is_answered_with_its_reason(prepared, monkeypatch) -> None:
    fresh = prepared["fresh"]
    entries = {r: _entry(monkeypatch, fresh, r) for r in ("quotes-a", "quotes-a-copy", "quotes-b", "base", "near")}
    assert {e["state"] for e in entries.values()} == {"kept", "duplicate", "contaminated"}
    # A contaminated duplicate: removed as the copy of its twin, and its own match on record.
    copy = next(e for r, e in entries.items() if r.startswith("quotes-a") and e["state"] == "duplicate")
    assert copy["eval_item_ids"] == [prepared["a"]] and copy["action"] == "drop" and copy["method"] == "exact"
    assert copy["duplicate_of_record_id"] in {"quotes-a", "quotes-a-copy"}
    assert [h["eval_item_id"] for h in copy["contamination_hits"]] == [prepared["a"]]
    near = entries["near"] if entries["near"]["state"] == "duplicate" else entries["base"]
    assert near["method"] == "near" and 0.8 <= near["similarity"] < 1
    assert near["duplicate_of_record_id"] in {"base", "near"}
    assert entries["quotes-b"]["state"] == "contaminated" and entries["quotes-b"]["eval_item_ids"] == [prepared["b"]]
    assert not any(e["stale"] for e in entries.values())


@pytest.mark.parametrize("record_id", HOSTILE_IDS)
def test_an_id_that_looks_like_a_pattern_or_sql_finds_its_record_alone(prepared, monkeypatch, record_id: str) -> None:
    assert _entry(monkeypatch, prepared["fresh"], record_id)["source_record_id"] == record_id


def test_a_decision_is_not_mixed_with_hits_of_a_later_decontamination(prepared, monkeypatch) -> None:
    """Item a left the suite; the clean shards still follow the decision made against it."""
    entry = _entry(monkeypatch, prepared["stale"], "quotes-a-copy")
    assert entry["eval_item_ids"] == [prepared["a"]] and entry["contamination_hits"] == []
    assert entry["stale"] and f"materialize clean_shards again for partition {prepared['key']}" in entry["stale_reason"]
    # Item b is in both suites: its document's hits and decision agree.
    assert not _entry(monkeypatch, prepared["stale"], "quotes-b")["stale"]
    text, _ = run(["audit", "doc", "quotes-a-copy"])
    assert any(line.startswith("  warning: the contamination hits on record (none)") for line in text["_text"])


def test_an_item_lists_the_documents_removed_for_it_though_its_hits_were_replaced(prepared, monkeypatch) -> None:
    """Not `0 matching document(s)`: both copies were decided against item a."""
    report, status = _audit(monkeypatch, prepared["stale"], "eval-item", prepared["a"])
    assert status == 0, report
    data = report["data"]
    assert data["num_documents"] == 2 and data["stale"] is True
    assert sorted(h["source_record_id"] for h in data["hits"]) == ["quotes-a", "quotes-a-copy"]
    assert all(h["stale"] and h["matched_ngram"] is None for h in data["hits"])
    report, _ = _audit(monkeypatch, prepared["stale"], "eval-item", prepared["b"])
    assert report["data"]["stale"] is False and [h["source_record_id"] for h in report["data"]["hits"]] == ["quotes-b"]
    report, _ = _audit(monkeypatch, prepared["fresh"], "eval-item", prepared["a"])
    assert report["data"]["num_documents"] == 2 and not any(h["stale"] for h in report["data"]["hits"])


def test_a_manifest_report_says_when_its_counts_mix_two_runs(prepared, monkeypatch) -> None:
    """The report's hits come from the later decontamination, its states from the decisions the
    clean shards follow: it says so, with the documents in disagreement by step."""
    report, status = _audit(monkeypatch, prepared["fresh"], "manifest", prepared["key"])
    assert status == 0 and report["data"]["stale"] is False
    assert report["data"]["stale_documents"] == {"decontamination": 0, "deduplication": 0}
    report, status = _audit(monkeypatch, prepared["stale"], "manifest", prepared["key"])
    assert status == 0 and report["data"]["stale"] is True
    assert report["data"]["stale_documents"] == {"decontamination": 2, "deduplication": 0}  # item a's two documents
    text, _ = run(["audit", "manifest", prepared["key"]])
    assert text["_text"][-1].startswith("warning: the decisions the clean shards follow disagree with the rows on "
                                        "record for documents (2 by its decontamination: a step ran again since)")
    report, _ = _audit(monkeypatch, prepared["rededuped"], "manifest", prepared["key"])
    assert report["data"]["stale_documents"] == {"decontamination": 0, "deduplication": 1}  # the near copy


# Linux's MAX_ARG_STRLEN: one argument holds at most 131,072 bytes, its own NUL included.
ARG_MAX_BYTES = 131_071
LONG_IDS = {"at-limit": "x" * ARG_MAX_BYTES, "over-limit": "y" * (ARG_MAX_BYTES + 1), "nul": "nul\0id"}


@pytest.fixture(scope="module")
def long_ids(tmp_path_factory) -> Path:
    """A corpus holding ids at the argument limit, one byte over it and one with a NUL."""
    from os.path import realpath

    root = Path(realpath(tmp_path_factory.mktemp("long-ids")))
    rng = random.Random(11)
    records = [{"id": record_id, "text": random_text(rng, 80)} for record_id in LONG_IDS.values()]
    records += [{"id": f"filler-{i}", "text": random_text(rng, 80)} for i in range(4)]
    verified = corpus_manifest(root, records)
    stages.run_sources(verified, root, root / "state", root / "state" / "warehouse.duckdb", CONFIG)
    return root


def _spawn(state: Path, *argv: str):
    import os
    import subprocess
    import sys

    command = [sys.executable, "-c", "import sys; from ito_assets.api.cli import main; sys.exit(main())", *argv]
    return subprocess.run(command, env={**os.environ, "ITO_STATE_DIR": str(state)}, capture_output=True, timeout=120)


def test_an_id_at_the_argument_limit_is_taken_and_one_over_it_cannot_be_an_argument(long_ids) -> None:
    """Either side of the limit, as a user's shell runs the command: the limit is the system's."""
    done = _spawn(long_ids / "state", "audit", "doc", LONG_IDS["at-limit"], "--json")
    assert done.returncode == 0
    assert json.loads(done.stdout)["data"]["manifests"][0]["source_record_id"] == LONG_IDS["at-limit"]
    with pytest.raises(OSError, match="Argument list too long"):
        _spawn(long_ids / "state", "audit", "doc", LONG_IDS["over-limit"], "--json")


@pytest.mark.parametrize("name", sorted(LONG_IDS))
def test_every_record_id_is_audited_from_a_file(long_ids, monkeypatch, name: str) -> None:
    """No argument can hold the id over the limit, nor the one with a NUL: --id-file reads its bytes exactly."""
    id_file = long_ids / f"{name}.id"
    id_file.write_bytes(LONG_IDS[name].encode())
    entry = _entry(monkeypatch, long_ids / "state", "--id-file", str(id_file))
    assert entry["source_record_id"] == LONG_IDS[name] and entry["matched_by"] == "source_record_id"


@pytest.mark.parametrize(("argv", "message"), [
    ([], "one of the two"), (["x", "--id-file", "/dev/null"], "one of the two"),
    (["--id-file", "/nonexistent/id"], "--id-file cannot be read"), (["--id-file", "BADUTF8"], "not UTF-8"),
])
def test_the_id_is_given_once_as_text(long_ids, monkeypatch, argv: list[str], message: str) -> None:
    bad = long_ids / "bad.id"
    bad.write_bytes(b"\xff\xfe")
    argv = [str(bad) if a == "BADUTF8" else a for a in argv]
    for verb in ("doc", "eval-item"):
        report, status = _audit(monkeypatch, long_ids / "state", verb, *argv)
        assert status == 2 and report["error"]["code"] == "USAGE_ERROR", report
        assert message in report["error"]["message"]


def test_the_sources_step_run_again_keeps_the_suite_the_hits_come_from(prepared, monkeypatch, tmp_path) -> None:
    """The sources step writes the manifest's row again; the decontamination it recorded (suite
    and settings) still holds for the same data's hits and decisions."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "warehouse.duckdb").write_bytes((prepared["fresh"] / "warehouse.duckdb").read_bytes())
    before, _ = _audit(monkeypatch, state, "manifest", prepared["key"])
    verified = verify_manifest(str(prepared["root"] / "manifest.json"))
    stages.run_sources(verified, prepared["root"], state, state / "warehouse.duckdb", CONFIG)
    after, _ = _audit(monkeypatch, state, "manifest", prepared["key"])
    head = after["data"]["manifest"]
    assert head["eval_suite_id"] == before["data"]["manifest"]["eval_suite_id"] is not None
    assert head["eval_suite_digest"] == before["data"]["manifest"]["eval_suite_digest"]
    assert _entry(monkeypatch, state, "quotes-a")["eval_suite_id"] == head["eval_suite_id"]


def test_a_copy_of_a_near_duplicate_names_the_copy_and_a_missing_id_reads_as_none(tmp_path, monkeypatch) -> None:
    """The removal of an exact copy of a near-duplicate was judged on the copy it repeats: the
    audit names that copy. A record without an id reads `(none)`, never as the id "None"."""
    from os.path import realpath

    root = Path(realpath(tmp_path))
    rng = random.Random(11)
    base = random_text(rng, 120).split()
    near = " ".join([*base[:60], "zzchanged", *base[61:]])
    records = [{"id": "base", "text": " ".join(base)}, {"id": "near", "text": near}, {"id": "near-again", "text": near},
               {"id": None, "text": random_text(rng, 80)}, {"id": "None", "text": random_text(rng, 80)},
               *({"id": f"filler-{i}", "text": random_text(rng, 80)} for i in range(4))]
    verified = corpus_manifest(root, records)
    state, warehouse = root / "state", root / "state" / "warehouse.duckdb"
    suite = load_suite(SUITE)
    source = stages.run_sources(verified, root, state, warehouse, CONFIG)
    decontam = stages.run_decontam(verified, suite, source, state, warehouse, CONFIG)
    dedup = stages.run_dedup(source, decontam.actions, state, warehouse, CONFIG)
    stages.run_clean(verified, source, dedup, decontam, state, warehouse, CONFIG)
    near_entry, again = _entry(monkeypatch, state, "near"), _entry(monkeypatch, state, "near-again")
    assert (near_entry["method"], near_entry["exact_copy_of"]) == ("near", None)
    assert (again["method"], again["duplicate_of"], again["exact_copy_of"]) == ("near", near_entry["duplicate_of"],
                                                                              near_entry["doc_id"])
    text, _ = run(["audit", "doc", "near-again"])
    assert f"its text is an exact copy of {near_entry['doc_id']}" in text["_text"][2]
    text, _ = run(["audit", "doc", "None"])
    assert text["_text"][0].endswith(f"(your id None) in manifest {verified.digest}")
    with duckdb.connect(str(warehouse), read_only=True) as con:  # found by its internal id alone
        [(nameless,)] = con.execute("SELECT doc_id FROM documents WHERE source_record_id IS NULL").fetchall()
    text, _ = run(["audit", "doc", nameless])
    assert text["_text"][0] == f"document {nameless} (your id (none)) in manifest {verified.digest}"
