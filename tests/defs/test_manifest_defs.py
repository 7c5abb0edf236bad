"""The manifest domain in Dagster: sensor registration, blocking checks, no secrets in logs."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from helpers import CANARIES, QUICK_DECISION
from definitions import build_definitions
from ito_assets.defs.manifest.partitions import manifests_partitions
from ito_assets.local_run import RunSummary, evaluate_sensor
from ito_assets.manifest.discovery import ManifestVerdict


def _tick(defs: dg.Definitions, instance) -> dg.SensorResult:
    context = dg.build_sensor_context(
        instance=instance, sensor_name="reviewed_manifest_sensor", definitions=defs, resources=defs.resources
    )
    return defs.resolve_sensor_def("reviewed_manifest_sensor")(context)


def test_sensor_registers_manifests_with_stable_run_keys(installation, instance):
    installation.manifest("alpha")
    installation.manifest("beta")
    defs = build_definitions(installation.settings)
    first, second = _tick(defs, instance), _tick(defs, instance)
    keys = sorted(r.run_key for r in first.run_requests)
    assert keys == sorted(r.run_key for r in second.run_requests)
    assert all(k.startswith("sha256:") and len(k) == 71 for k in keys)
    assert {r.partition_key for r in first.run_requests} == {k[7:19] for k in keys}
    (added,) = first.dynamic_partitions_requests
    assert sorted(added.partition_keys) == sorted(k[7:19] for k in keys)


def test_sensor_skips_unreadable_files_without_failing(installation, instance):
    (installation.manifests_dir / "unsafe.json").write_text("{}")
    (installation.manifests_dir / "unsafe.json").chmod(0o666)
    result = _tick(build_definitions(installation.settings), instance)
    assert result.run_requests == [] and result.skip_reason


def test_the_sensor_prepares_each_manifest_by_its_declared_kind(installation, instance, monkeypatch):
    from ito_assets.manifest import discovery

    installation.manifest("trains")
    installation.data_manifest("cleans")
    (installation.manifests_dir / "broken.json").write_text('{"kind": "data", "kind": "data"}')  # not strict JSON
    (installation.manifests_dir / "broken.json").chmod(0o600)
    # Left alone long enough not to be a file still being written (which waits for a later tick).
    modified = (installation.manifests_dir / "broken.json").stat().st_mtime
    monkeypatch.setattr(discovery, "_clock", lambda: modified + discovery.SETTLE_SECONDS)
    requests = _tick(build_definitions(installation.settings), instance).run_requests
    jobs = {Path(locate(installation, r.partition_key)).stem: r.job_name for r in requests}
    # A file that is not strict JSON goes to the whole preparation, whose blocking checks say why.
    assert jobs == {"trains": "preparation_job", "cleans": "data_preparation_job", "broken": "preparation_job"}


def locate(installation, key: str) -> str:
    from ito_assets.manifest.discovery import locate as find

    return find(installation.manifests_dir, key, max_bytes=installation.settings.max_manifest_bytes)


def test_a_data_manifest_in_the_inbox_is_prepared_without_decision_or_plan(installation, instance):
    installation.data_manifest("cleans")
    summary = RunSummary()
    evaluate_sensor(build_definitions(installation.settings, decision_run_config=QUICK_DECISION), instance,
                    "reviewed_manifest_sensor", summary)
    assert summary.num_runs_launched == 1 and summary.num_runs_failed == 0 and summary.checks_failed == []
    assets = {name.split(" ")[0] for name in summary.materialized}
    assert assets == {"eval_suite", "training_manifest", "source_documents", "contamination_report",
                      "deduplicated_documents", "clean_shards"}  # no decision proxies, no plan
    (run,) = instance.get_runs()
    assert run.job_name == "data_preparation_job"


def test_valid_manifest_passes_every_check(installation, instance):
    installation.manifest("alpha")
    summary = RunSummary()
    evaluate_sensor(build_definitions(installation.settings, decision_run_config=QUICK_DECISION), instance, "reviewed_manifest_sensor", summary)
    assert summary.num_runs_launched == 1 and summary.num_runs_failed == 0
    assert summary.checks_failed == []
    assert sum(name.startswith("training_manifest:") for name in summary.checks_passed) == 4
    assert any(name.startswith("training_manifest") for name in summary.materialized)
    again = RunSummary()
    evaluate_sensor(build_definitions(installation.settings, decision_run_config=QUICK_DECISION), instance, "reviewed_manifest_sensor", again)
    assert again.num_runs_launched == 0 and again.num_runs_skipped == 1


@dg.asset(partitions_def=manifests_partitions, deps=["training_manifest"])
def downstream_step() -> None:
    """Stands in for the data stage: must never run after a failed blocking check."""


def _run_with_downstream(installation, instance, key: str) -> dg.ExecuteInProcessResult:
    base = build_definitions(installation.settings)
    defs = dg.Definitions.merge(base, dg.Definitions(assets=[downstream_step]))
    selection = dg.AssetSelection.groups("manifest") | dg.AssetSelection.assets(downstream_step)
    job = dg.define_asset_job("with_downstream", selection=selection, partitions_def=manifests_partitions)
    defs = dg.Definitions.merge(defs, dg.Definitions(jobs=[job]))
    instance.add_dynamic_partitions("manifests", [key])
    return defs.resolve_job_def("with_downstream").execute_in_process(
        instance=instance, partition_key=key, raise_on_error=False
    )


def _key(path: str) -> str:
    from ito_assets.manifest.secure_read import read_manifest_bytes

    return read_manifest_bytes(path).sha256_hex[:12]


def test_failing_provenance_check_stops_downstream(installation, instance):
    key = _key(installation.manifest("no-provenance", provenance=False))
    result = _run_with_downstream(installation, instance, key)
    verdicts = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert verdicts["provenance_present"] is False
    assert verdicts["manifest_verified"] is True
    materialized = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    assert "downstream_step" not in materialized
    assert not result.success


def test_passing_checks_let_downstream_run(installation, instance):
    key = _key(installation.manifest("alpha"))
    result = _run_with_downstream(installation, instance, key)
    assert result.success
    assert "downstream_step" in {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}


def test_eval_suite_digest_mismatch_blocks(installation, instance):
    path = installation.manifest("stale")
    (installation.data_root / "evals" / "ito-fixture-evals-v1.jsonl").write_text(
        '{"id": "q9", "benchmark": "b", "question": "Changed suite?", "answer": "yes"}\n'
    )
    result = _run_with_downstream(installation, instance, _key(path))
    verdicts = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert verdicts["eval_suite_digest_matches"] is False
    assert "downstream_step" not in {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}


def test_secret_manifest_fails_closed_and_never_reaches_the_event_log(installation, instance):
    path = installation.manifest("leaky", hf_token=CANARIES["hugging_face"])
    result = _run_with_downstream(installation, instance, _key(path))
    verdicts = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert verdicts["manifest_has_no_secrets"] is False and verdicts["manifest_verified"] is False
    output: ManifestVerdict = result.output_for_node("training_manifest")
    assert output.error_code == "MANIFEST_CONTAINS_SECRET" and output.verified is None
    records = instance.all_logs(result.run_id)
    text = "\n".join(repr(r) for r in records)
    assert CANARIES["hugging_face"] not in text


@pytest.mark.parametrize("content", [
    '{"schema_version": 1, "kind": "training", "name": "half-writ',  # a file still being written
    '{"name": "a", "name": "b"}',  # a key twice: not strict JSON, never scanned
])
def test_a_manifest_the_scan_never_read_whole_does_not_pass_the_secret_check(installation, instance, content):
    """The secret scan runs on a manifest parsed as strict JSON: one that is not was shown green,
    "no credential anywhere", whatever it held."""
    path = installation.manifests_dir / "unread.json"
    path.write_text(content)
    path.chmod(0o644)
    result = _run_with_downstream(installation, instance, _key(str(path)))
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert checks["manifest_verified"].passed is False and checks["manifest_has_no_secrets"].passed is False
    assert checks["manifest_has_no_secrets"].metadata["error_code"].value == "MANIFEST_INVALID"
    assert "not scanned whole" in checks["manifest_has_no_secrets"].description


@pytest.mark.parametrize("name", [CANARIES["github"], "ops-notes"])
def test_the_manifest_and_suite_files_are_named_in_metadata_unless_the_name_is_a_credential(installation, instance, name):
    """The sensor's log withholds a file name that looks like a credential; the asset's metadata
    showed it. And under `path` the IO manager recorded where it stored the output, in place of
    the file read."""
    path = installation.manifest(name)
    result = _run_with_downstream(installation, instance, _key(path))
    events = {e.asset_key.to_user_string(): e.step_materialization_data.materialization.metadata
              for e in result.get_asset_materialization_events()}
    manifest, suite = events["training_manifest"], events["eval_suite"]
    assert suite["suite_path"].value == str(installation.settings.eval_suite_path)
    if name == CANARIES["github"]:
        assert CANARIES["github"] not in repr(manifest) and CANARIES["github"] not in repr(instance.all_logs(result.run_id))
        assert manifest["file_name"].value == "(a name that looks like a credential, withheld)"
    else:
        assert manifest["manifest_path"].value == path and manifest["file_name"].value == "ops-notes.json"


def test_a_manifest_the_schema_refuses_was_scanned_and_holds_no_secret(installation, instance):
    """The scan runs once the bytes parse as strict JSON, before the schema: such a manifest was
    read whole, and the secret check says so while `manifest_verified` says why it failed."""
    path = installation.manifest("unknown-key", not_a_field=1)
    result = _run_with_downstream(installation, instance, _key(path))
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert checks["manifest_verified"].passed is False
    assert checks["manifest_verified"].metadata["error_code"].value == "MANIFEST_INVALID"
    assert checks["manifest_has_no_secrets"].passed is True
