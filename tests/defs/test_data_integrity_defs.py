"""The data stage's integrity refusals in Dagster: a shard that no longer verifies fails the step
that reads it with SHARD_CORRUPT (and the check on it with the code), a full disk with
STORAGE_FULL, and a corrupt warehouse is rebuilt with a warning in the run's log and metadata —
or, its lineage incomplete, refused by `ito audit` with WAREHOUSE_CORRUPT and the fix."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from ito_assets.api.cli import run as cli
from ito_assets.defs.data.assets import DATA_ASSETS, clean_shards, deduplicated_documents, source_documents
from ito_assets.defs.data.checks import DATA_CHECKS, conservation_holds, document_provenance_present, zero_residual_contamination
from ito_assets.defs.manifest.assets import eval_suite, training_manifest
from ito_assets.defs.resources import ItoSettingsResource
from ito_assets.manifest.secure_read import read_manifest_bytes
from ito_assets.settings import PROJECT_ROOT, Settings

FIXTURES = PROJECT_ROOT / "data" / "fixtures"
WORDS = [f"w{i}" for i in range(3000)]


def _settings(root: Path) -> Settings:
    """A small manifest of two sources (copies, and documents that quote eval questions)."""
    suite_path = root / "evals" / "ito-fixture-evals-v1.jsonl"
    suite_path.parent.mkdir()
    shutil.copyfile(FIXTURES / "evals" / "ito-fixture-evals-v1.jsonl", suite_path)
    questions = [json.loads(line)["question"] for line in suite_path.read_text().splitlines()[:2]]
    rng = random.Random(11)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(30, 90))) for _ in range(40)]
    texts += [texts[1], texts[2]] + [f"{texts[5]} {q} {texts[6]}" for q in questions]
    data_root = root / "data"
    data_root.mkdir()
    manifest = json.loads((FIXTURES / "manifests" / "fixture-small.json").read_text())
    provenance = manifest["data"][0]["decontamination"]
    manifest["data"] = []
    for index, part in enumerate((texts[::2], texts[1::2])):
        path = data_root / f"part-{index}.jsonl"
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in part))
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        manifest["data"].append({"uri": f"dataroot://{path.name}", "sha256": digest, "license": "CC0-1.0", "format": "jsonl", "decontamination": provenance})
    manifests = root / "manifests"
    manifests.mkdir()
    (manifests / "small.json").write_text(json.dumps(manifest))
    (manifests / "small.json").chmod(0o644)
    return Settings(project_root=root, state_dir=root / ".ito", data_root=data_root, manifests_dir=manifests, eval_suite_path=suite_path)


def _materialize(settings: Settings, instance, key: str, selection=None) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        [eval_suite, training_manifest, *DATA_ASSETS, *DATA_CHECKS],
        selection=selection,
        instance=instance,
        resources={"ito": ItoSettingsResource.from_settings(settings)},
        partition_key=key,
        raise_on_error=False,
    )


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    root = Path(os.path.realpath(tmp_path_factory.mktemp("integrity-chain")))
    settings = _settings(root)
    key = read_manifest_bytes(str(settings.manifests_dir / "small.json")).sha256_hex[:12]
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("manifests", [key])
        result = _materialize(settings, instance, key)
        assert result.success
        yield settings, instance, key, result


def _failure(result: dg.ExecuteInProcessResult, step: str):
    (event,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE" and e.step_key == step]
    return event.event_specific_data.user_failure_data


def test_a_tampered_source_shard_fails_the_step_that_reads_it_with_its_code(chain) -> None:
    settings, instance, key, first = chain
    shard = first.output_for_node("source_documents").shards.shards[0]
    path = Path(shard.path)
    original = path.read_bytes()
    frame = pl.read_parquet(path)
    frame.slice(0, frame.height - 1).write_parquet(path)  # other valid Parquet of the same schema
    try:
        result = _materialize(settings, instance, key, selection=[deduplicated_documents])
        provenance = document_provenance_present(first.output_for_node("source_documents"), first.output_for_node("training_manifest"))
    finally:
        path.write_bytes(original)
    assert not result.success
    failure = _failure(result, "deduplicated_documents")
    assert failure.metadata["error_code"].value == "SHARD_CORRUPT"
    assert f"SHARD_CORRUPT: shard {key}/source/documents-00000.parquet does not hash" in failure.description
    assert str(settings.state_dir) not in failure.description
    assert not provenance.passed and provenance.metadata["error_code"].value == "SHARD_CORRUPT"


def test_a_changed_clean_shard_fails_its_checks_with_the_code(chain) -> None:
    settings, instance, key, first = chain
    path = Path(first.output_for_node("clean_shards").shards.shards[0].path)
    original = path.read_bytes()
    path.write_bytes(original[:-10])
    try:
        clean, suite, report = (first.output_for_node(n) for n in ("clean_shards", "eval_suite", "contamination_report"))
        verdicts = {"conservation_holds": conservation_holds(clean), "zero_residual_contamination": zero_residual_contamination(clean, suite, report)}
    finally:
        path.write_bytes(original)
    for name in ("conservation_holds", "zero_residual_contamination"):
        assert not verdicts[name].passed and verdicts[name].metadata["error_code"].value == "SHARD_CORRUPT", name
    assert f"shard changed: {key}/clean/shards/clean-00000.parquet" in verdicts["conservation_holds"].metadata["problems"].value


def _audit(settings: Settings, monkeypatch, key: str) -> tuple[dict, int]:
    monkeypatch.setenv("ITO_STATE_DIR", str(settings.state_dir))
    return cli(["audit", "manifest", key, "--json"])


def test_a_corrupt_warehouse_is_rebuilt_with_a_warning_in_the_run(chain, monkeypatch) -> None:
    settings, instance, key, _ = chain
    before, status = _audit(settings, monkeypatch, key)
    assert status == 0 and before["ok"]
    settings.warehouse_path.write_bytes(b"\xff" * 8192)
    result = _materialize(settings, instance, key, selection=[clean_shards])
    assert result.success
    (materialization,) = result.get_asset_materialization_events()
    metadata = materialization.materialization.metadata
    assert metadata["warehouse_rebuilt"].value is True and "rebuilt from its lineage" in metadata["warehouse_warning"].value
    warnings = [e.user_message for e in instance.all_logs(result.run_id) if e.level == logging.WARNING and "rebuilt from its lineage" in e.user_message]
    assert len(warnings) == 1 and "warehouse.duckdb was corrupt" in warnings[0]
    after, status = _audit(settings, monkeypatch, key)
    assert status == 0 and after["data"] == before["data"]  # the same answers as before


def test_ito_audit_refuses_a_corrupt_warehouse_whose_lineage_is_incomplete(chain, monkeypatch) -> None:
    settings, instance, key, first = chain
    decisions = Path(first.output_for_node("clean_shards").decisions.path)
    warehouse = settings.warehouse_path
    saved = {p: p.read_bytes() for p in (decisions, warehouse)}
    decisions.unlink()
    warehouse.write_bytes(b"garbage")
    try:
        document, status = _audit(settings, monkeypatch, key)
    finally:
        for p, data in saved.items():
            p.write_bytes(data)
    assert status != 0 and document["error"]["code"] == "WAREHOUSE_CORRUPT"
    assert document["error"]["message"].endswith(f"one-line fix: delete warehouse.duckdb and re-materialize clean_shards (partition {key})")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full, where every write fails with ENOSPC")
def test_a_full_disk_under_the_warehouse_fails_the_step_with_storage_full(chain) -> None:
    settings, instance, key, _ = chain
    wal = settings.warehouse_path.with_name(settings.warehouse_path.name + ".wal")
    wal.symlink_to("/dev/full")
    try:
        result = _materialize(settings, instance, key, selection=[deduplicated_documents])
    finally:
        wal.unlink()
    failure = _failure(result, "deduplicated_documents")
    assert failure.metadata["error_code"].value == "STORAGE_FULL" and "retry once space returns" in failure.description
    assert _materialize(settings, instance, key, selection=[deduplicated_documents]).success


def _assert_the_named_step_brings_the_answers_back(settings, instance, key, monkeypatch, before: dict) -> None:
    """The fix a refused audit names (materialize source_documents), then the audit again."""
    assert _materialize(settings, instance, key, selection=[source_documents]).success
    after, status = _audit(settings, monkeypatch, key)
    for report in (before, after):  # the sources step writes the manifest's row again, at its own time
        report["data"]["manifest"].pop("recorded_at")
    assert status == 0 and after["data"] == before["data"]


def test_ito_audit_leaves_a_warehouse_deleted_by_hand_to_the_data_step_it_names(chain, monkeypatch) -> None:
    """An audit only reads: it rebuilt a missing warehouse itself, and a rebuild drops from the
    journal every record whose file does not verify at that moment. It names the fix instead,
    and the fix, as the message says it, brings the same answers back."""
    settings, instance, key, _ = chain
    before, status = _audit(settings, monkeypatch, key)
    assert status == 0
    saved = settings.warehouse_path.read_bytes()
    settings.warehouse_path.unlink()
    try:
        refused, status = _audit(settings, monkeypatch, key)
        assert status != 0 and refused["error"]["code"] == "WAREHOUSE_NOT_FOUND"
        assert "materialize source_documents" in refused["error"]["message"]
        assert not settings.warehouse_path.exists()
        _assert_the_named_step_brings_the_answers_back(settings, instance, key, monkeypatch, before)
    finally:
        settings.warehouse_path.write_bytes(saved)


def test_ito_audit_leaves_a_corrupt_warehouse_to_the_data_step_it_names(chain, monkeypatch) -> None:
    """A corrupt warehouse was rebuilt by the audit that found it: a read that wrote the file and
    set aside the journal records that did not verify at that moment. It is refused with the
    fix, the file left as it was, and the fix brings the same answers back."""
    settings, instance, key, _ = chain
    before, status = _audit(settings, monkeypatch, key)
    assert status == 0
    saved = settings.warehouse_path.read_bytes()
    garbage = b"not a database" * 64
    settings.warehouse_path.write_bytes(garbage)
    try:
        refused, status = _audit(settings, monkeypatch, key)
        assert status != 0 and refused["error"]["code"] == "WAREHOUSE_CORRUPT"
        assert "materialize source_documents" in refused["error"]["message"]
        assert str(settings.warehouse_path.parent) not in refused["error"]["message"]
        assert settings.warehouse_path.read_bytes() == garbage
        assert not settings.warehouse_path.with_name(settings.warehouse_path.name + ".corrupt").exists()
        _assert_the_named_step_brings_the_answers_back(settings, instance, key, monkeypatch, before)
    finally:
        settings.warehouse_path.write_bytes(saved)


def test_ito_audit_calls_only_a_held_lock_busy(chain, monkeypatch) -> None:
    """Every DuckDB IOException was WAREHOUSE_BUSY, retryable: a script that honours `retryable`
    looped for ever on a file this user cannot read. Only DuckDB's lock is a wait."""
    import duckdb

    from ito_assets.data import warehouse

    settings, _, key, _ = chain
    for error, code in ((duckdb.IOException('IO Error: Could not set lock on file "w": Conflicting lock'), "WAREHOUSE_BUSY"),
                        (duckdb.IOException("IO Error: Cannot open file: Permission denied"), "INTERNAL_ERROR")):
        monkeypatch.setattr(warehouse, "connect", lambda path, read_only=False, error=error: (_ for _ in ()).throw(error))
        document, status = _audit(settings, monkeypatch, key)
        assert status != 0 and document["error"]["code"] == code
        assert document["error"]["retryable"] is (code == "WAREHOUSE_BUSY")
    monkeypatch.undo()
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # as for a file of another user's, to root too
    document, status = _audit(settings, monkeypatch, key)
    monkeypatch.undo()
    assert status != 0 and document["error"]["code"] == "PERMISSION_DENIED" and not document["error"]["retryable"]
