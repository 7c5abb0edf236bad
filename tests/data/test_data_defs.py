"""The data stage in Dagster: the chain materialised on the committed fixtures into a temporary
instance, every check green, the gates refusing, the eval-suite sensor, and the audit verbs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
import yaml

from ito_assets.api.cli import build_parser, run
from ito_assets.data.config import DedupConfig
from ito_assets.defs import manifest
from ito_assets.defs.data import defs as data_defs
from ito_assets.defs.data.assets import DATA_ASSETS
from ito_assets.defs.data.checks import DATA_CHECKS, zero_residual_contamination
from ito_assets.defs.manifest.assets import eval_suite, training_manifest
from ito_assets.defs.resources import ItoSettingsResource
from ito_assets.manifest.secure_read import read_manifest_bytes
from ito_assets.settings import PROJECT_ROOT, Settings
from sensors.eval_suite import eval_suite_changed, run_key

FIXTURES = PROJECT_ROOT / "data" / "fixtures"
# The embedded instance's Python-log capture, as `make run` and `make ui` use it.
LOCAL_PYTHON_LOGS = yaml.safe_load((PROJECT_ROOT / "deploy/local/dagster.yaml").read_text())["python_logs"]
EXPECTED_CHECKS = {
    "source_digests_match", "document_provenance_present", "duplicate_rate_plausible",
    "eval_suite_digest_recorded", "conservation_holds", "zero_residual_contamination",
}


def _settings(root: Path, fixtures: Path, manifest_name: str = "fixture-small.json") -> Settings:
    manifests = root / "manifests"
    manifests.mkdir(exist_ok=True)
    shutil.copyfile(fixtures / "manifests" / manifest_name, manifests / manifest_name)
    (manifests / manifest_name).chmod(0o644)
    suite = root / "evals" / "ito-fixture-evals-v1.jsonl"
    suite.parent.mkdir(exist_ok=True)
    shutil.copyfile(fixtures / "evals" / "ito-fixture-evals-v1.jsonl", suite)
    return Settings(project_root=root, state_dir=root / ".ito", data_root=fixtures.parent, manifests_dir=manifests, eval_suite_path=suite)


def _materialize(settings: Settings, instance, manifest_name: str = "fixture-small.json",
                 run_config: dict | None = None) -> tuple[str, dg.ExecuteInProcessResult]:
    key = read_manifest_bytes(str(settings.manifests_dir / manifest_name)).sha256_hex[:12]
    instance.add_dynamic_partitions("manifests", [key])
    result = dg.materialize(
        [eval_suite, training_manifest, *DATA_ASSETS, *DATA_CHECKS],
        instance=instance,
        resources={"ito": ItoSettingsResource.from_settings(settings)},
        partition_key=key,
        raise_on_error=False,
        run_config=run_config,
    )
    return key, result


@pytest.fixture(scope="module")
def chain(tmp_path_factory, fixtures_dir):
    """One materialisation of the whole chain on fixture-small, shared by the tests below."""
    root = Path(str(tmp_path_factory.mktemp("chain"))).resolve()
    settings = _settings(root, fixtures_dir)
    with dg.instance_for_test(overrides={"python_logs": LOCAL_PYTHON_LOGS}) as instance:
        key, result = _materialize(settings, instance)
        yield settings, instance, key, result


def test_the_data_steps_log_their_progress_in_the_run(chain) -> None:
    _, instance, _, result = chain
    lines = [e.user_message for e in instance.all_logs(result.run_id) if e.dagster_event is None]
    for phase, unit in (("decontamination seeds", "work units"), ("decontamination hits", "work units")):
        done = [line for line in lines if line.startswith(f"[{phase}] ") and f" {unit} (100%), " in line]
        assert done, f"no final progress line for {phase}"
        assert " s to go" in done[-1] or "time to go unknown" in done[-1]
    # The fixture's 1.6 MB of text are deduplicated in memory: one line says so, with the limit.
    assert "[dedup] in memory: 1.6 MB of text in 3,041 documents (in_memory_mb 32)" in lines


def test_a_failed_dedup_step_run_again_resumes_from_its_finished_units(tmp_path, fixtures_dir, monkeypatch) -> None:
    """A data engineer runs the partition again after a step failed mid-way: the step finds the
    units its failed attempt finished, says so in the run's log, and does only the rest."""
    import functools

    from ito_assets.data import dedup_units

    settings = _settings(tmp_path.resolve(), fixtures_dir)
    key = read_manifest_bytes(str(settings.manifests_dir / "fixture-small.json")).sha256_hex[:12]
    calls: list[int] = []
    broken = [True]  # unit 3's file, until the engineer fixes it
    original = dedup_units.signature_unit

    @functools.wraps(original)  # the marker's key names the unit's function
    def fails_at_unit_3(task):
        calls.append(task.unit.index)
        if task.unit.index == 3 and broken[0]:
            raise OSError("the unit's file is unreadable")
        return original(task)

    monkeypatch.setattr(dedup_units, "signature_unit", fails_at_unit_3)
    # Small units, and band-join partitions of 10,000 band rows: several, each resumable too.
    # The sources in pieces of 100 kB on two workers, each a task; the clean shards in parts.
    small_units = {"ops": {"deduplicated_documents": {"config": {"unit_bytes": 100_000, "partition_rows": 10_000, "in_memory_mb": 0}},
                           "source_documents": {"config": {"unit_bytes": 100_000, "num_workers": 2}},
                           "clean_shards": {"config": {"num_workers": 2}}}}
    with dg.instance_for_test(overrides={"python_logs": LOCAL_PYTHON_LOGS}) as instance:
        instance.add_dynamic_partitions("manifests", [key])

        def attempt() -> dg.ExecuteInProcessResult:
            return dg.materialize([eval_suite, training_manifest, *DATA_ASSETS], instance=instance, run_config=small_units,
                                  resources={"ito": ItoSettingsResource.from_settings(settings)}, partition_key=key, raise_on_error=False)

        failed = attempt()
        assert not failed.success and calls == [0, 1, 2, 3]
        calls.clear()
        broken[0] = False
        again = attempt()
        assert again.success
        assert calls[0] == 3 and len(calls) >= 2  # units 0-2 not redone
        lines = [e.user_message for e in instance.all_logs(again.run_id) if e.dagster_event is None]
        assert any(line.startswith("3 of ") and "finished by an earlier attempt in dedup-arrays" in line for line in lines)
        # The UI says it too: the source shard's exact-copy keys and signature units 0-2.
        resumed = {e.asset_key.to_user_string(): e.step_materialization_data.materialization.metadata["num_units_resumed"].value
                   for e in again.get_asset_materialization_events()
                   if e.asset_key.to_user_string() in ("contamination_report", "deduplicated_documents")}
        assert resumed == {"contamination_report": 0, "deduplicated_documents": 4}
        dedup = next(e for e in again.get_asset_materialization_events() if e.asset_key.to_user_string() == "deduplicated_documents")
        metadata = dedup.step_materialization_data.materialization.metadata
        # One per 10,000 band rows of the distinct texts (fewer than the documents).
        assert 3 < metadata["num_band_join_partitions"].value <= -(-metadata["num_input"].value * DedupConfig().bands // 10_000)
        sources = next(e for e in again.get_asset_materialization_events() if e.asset_key.to_user_string() == "source_documents")
        assert sources.step_materialization_data.materialization.metadata["num_source_pieces"].value > 10
        cleaned = next(e for e in again.get_asset_materialization_events() if e.asset_key.to_user_string() == "clean_shards")
        clean_metadata = cleaned.step_materialization_data.materialization.metadata
        assert clean_metadata["conservation_holds"].value and clean_metadata["num_units_resumed"].value == 0


@pytest.fixture(scope="module")
def fixtures_dir() -> Path:
    if not (FIXTURES / "manifests" / "fixture-small.json").is_file():
        pytest.skip("the committed fixtures are missing")
    return FIXTURES


def test_definitions_load_with_jobs_and_checks() -> None:
    merged = dg.Definitions.merge(manifest.defs(), data_defs(), dg.Definitions(resources={"ito": ItoSettingsResource.from_settings(Settings(project_root=Path("/x"), state_dir=Path("/x"), data_root=Path("/x"), manifests_dir=Path("/x"), eval_suite_path=Path("/x")))}))
    graph = merged.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert {"source_documents", "deduplicated_documents", "contamination_report", "clean_shards"} <= keys
    assert {c.name for c in graph.asset_check_keys} >= EXPECTED_CHECKS
    # A check must load its own run's partition only (not every manifest's): partitioned like its asset.
    assert all(spec.partitions_def is not None for check in DATA_CHECKS for spec in check.check_specs)
    assert merged.resolve_job_def("decontamination_job")
    assert {a.key.to_user_string(): a.group_names_by_key[a.key] for a in DATA_ASSETS} == dict.fromkeys(keys - {"eval_suite", "training_manifest"}, "data")


def test_chain_materialises_with_every_check_green(chain) -> None:
    settings, _, key, result = chain
    assert result.success
    verdicts = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert EXPECTED_CHECKS <= set(verdicts) and all(verdicts[c] for c in EXPECTED_CHECKS), verdicts
    clean = result.output_for_node("clean_shards")
    c = clean.conservation
    assert c.num_input == 3041 and c.num_kept + c.num_duplicate + c.num_contaminated == c.num_input
    assert c.num_contaminated == 60
    assert all(Path(s.path).is_relative_to(settings.state_dir / "shards" / key) for s in clean.shards.shards)
    metadata = result.get_asset_materialization_events()[-1].materialization.metadata
    assert metadata["conservation_holds"].value is True
    report = next(e for e in result.get_asset_materialization_events() if e.asset_key.to_user_string() == "contamination_report")
    meta = report.materialization.metadata
    assert json.loads(json.dumps(meta["contamination_by_benchmark"].value)) == {b: {"documents": 20, "eval_items": 20} for b in ("arith-words", "code-reading", "py-trivia")}
    assert meta["config.ngram_size"].value == 13
    assert [c.name for c in meta["sample_hits"].schema.columns] == ["doc", "eval item", "view", "matched n-gram", "chars",
                                                                   "overlap %", "action"]
    assert len(meta["sample_hits"].records) == 10
    assert meta["contamination_chart"].value.startswith("![contamination by benchmark](data:image/png;base64,")
    dedup = next(e for e in result.get_asset_materialization_events()
                 if e.asset_key.to_user_string() == "deduplicated_documents").materialization.metadata
    assert dedup["similarity_chart"].value.startswith("![near-duplicate similarity](data:image/png;base64,")
    assert [c.name for c in dedup["similarity_histogram"].schema.columns] == ["Jaccard from", "Jaccard to", "candidate pairs"]
    assert sum(r.data["candidate pairs"] for r in dedup["similarity_histogram"].records) == dedup["num_candidate_pairs"].value
    assert dedup["num_band_join_partitions"].value == 0  # the fixture is deduplicated in memory
    sources = next(e for e in result.get_asset_materialization_events()
                   if e.asset_key.to_user_string() == "source_documents").materialization.metadata
    assert [c.name for c in sources["sources"].schema.columns] == ["uri", "licence", "format", "documents", "size MB", "sha256"]
    assert [c.name for c in sources["shards"].schema.columns] == ["shard", "rows", "sha256"]
    assert sources["num_source_pieces"].value == sources["num_sources"].value  # one worker: a piece a source
    assert sources["num_units_resumed"].value == 0


def test_unverified_manifest_is_refused(real_tmp: Path, fixtures) -> None:
    settings = _settings(real_tmp, fixtures)
    path = settings.manifests_dir / "fixture-small.json"
    document = json.loads(path.read_text())
    del document["name"]  # reads fine, fails the schema: the verdict carries MANIFEST_INVALID
    path.write_text(json.dumps(document))
    with dg.instance_for_test() as instance:
        _, result = _materialize(settings, instance)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert failure.step_key == "source_documents"
    assert "MANIFEST_INVALID" in str(failure.event_specific_data.error)
    assert not (settings.state_dir / "shards").exists()


def test_eval_suite_sensor_requests_a_deterministic_run(chain) -> None:
    settings, instance, key, _ = chain
    resources = {"ito": ItoSettingsResource.from_settings(settings)}
    context = dg.build_sensor_context(instance=instance, resources=resources)
    assert eval_suite_changed(context).run_requests == []
    original = settings.eval_suite_path.read_bytes()
    settings.eval_suite_path.write_bytes(original + b'{"id": "extra/1", "benchmark": "extra", "question": "A brand new question for the changed suite?", "answer": "yes"}\n')
    try:
        (request,) = eval_suite_changed(dg.build_sensor_context(instance=instance, resources=resources)).run_requests
        (again,) = eval_suite_changed(dg.build_sensor_context(instance=instance, resources=resources)).run_requests
    finally:
        settings.eval_suite_path.write_bytes(original)
    manifest_digest = "sha256:" + read_manifest_bytes(str(settings.manifests_dir / "fixture-small.json")).sha256_hex
    assert request.partition_key == key and request.run_key == again.run_key
    assert request.run_key.startswith(manifest_digest + "+sha256:") and request.run_key == run_key(manifest_digest, request.tags["ito/eval_suite_digest"])


def _audit(settings: Settings, monkeypatch, *argv: str) -> tuple[dict, int]:
    monkeypatch.setenv("ITO_STATE_DIR", str(settings.state_dir))
    parser = build_parser()
    if "audit" not in parser._subparsers._group_actions[0].choices:  # noqa: SLF001 - until cli.py registers it
        from ito_assets.api.commands import audit

        monkeypatch.setattr("ito_assets.api.cli.build_parser", lambda: _with_audit(audit))
    return run(list(argv))


def _with_audit(audit_module):
    from ito_assets.api.cli import _Parser
    from ito_assets.api.commands import manifest as manifest_commands

    parser = _Parser(prog="ito")
    verbs = parser.add_subparsers(dest="verb", parser_class=_Parser, required=True)
    manifest_commands.register(verbs)
    audit_module.register(verbs)
    return parser


def test_audit_verbs_answer_the_auditors_questions(chain, monkeypatch, capsys) -> None:
    settings, _, key, _ = chain
    import duckdb

    with duckdb.connect(str(settings.warehouse_path), read_only=True) as con:
        duplicate = con.execute("SELECT doc_id, duplicate_of, source_record_id FROM duplicates WHERE method = 'near' ORDER BY doc_id LIMIT 1").fetchone()
        hit = con.execute("SELECT doc_id, eval_item_id FROM contamination_hits ORDER BY doc_id LIMIT 1").fetchone()
    document, status = _audit(settings, monkeypatch, "audit", "doc", duplicate[0], "--json")
    assert status == 0 and document["ok"] and document["live_api_contacted"] is False
    (entry,) = document["data"]["manifests"]
    assert entry["state"] == "duplicate" and entry["duplicate_of"] == duplicate[1] and entry["clean_pieces"] == []
    assert entry["matched_by"] == "doc_id" and entry["source_record_id"] == duplicate[2] and entry["duplicate_of_record_id"]
    # Its family holds it and the document it duplicates, each with the user's id.
    assert {duplicate[0], duplicate[1]} <= {m["doc_id"] for m in entry["family"]} and all(m["source_record_id"] for m in entry["family"])
    # By the user's own id, the same document, saying how it matched.
    document, status = _audit(settings, monkeypatch, "audit", "doc", duplicate[2], "--json")
    (by_record,) = document["data"]["manifests"]
    assert status == 0 and by_record["matched_by"] == "source_record_id" and by_record["doc_id"] == duplicate[0]
    document, status = _audit(settings, monkeypatch, "audit", "eval-item", hit[1], "--json")
    assert status == 0 and hit[0] in {h["doc_id"] for h in document["data"]["hits"]}
    # An item of the suite that matched nothing is 0 documents; an id of no suite is not found.
    with duckdb.connect(str(settings.warehouse_path), read_only=True) as con:
        (unmatched,) = con.execute("SELECT eval_item_id FROM eval_items WHERE eval_item_id NOT IN "
                                   "(SELECT eval_item_id FROM contamination_hits) ORDER BY 1 LIMIT 1").fetchone()
    monkeypatch.setenv("ITO_EVAL_SUITE", "/nonexistent/suite.jsonl")  # the warehouse alone must know it
    document, status = _audit(settings, monkeypatch, "audit", "eval-item", unmatched, "--json")
    assert status == 0 and document["data"]["num_documents"] == 0
    document, status = _audit(settings, monkeypatch, "audit", "eval-item", "nope/999", "--json")
    assert status == 1 and document["error"]["code"] == "AUDIT_NOT_FOUND"
    document, status = _audit(settings, monkeypatch, "audit", "manifest", key, "--json")
    states = {(s["state"], s["detail"]): s["num_documents"] for s in document["data"]["states"]}
    assert status == 0 and sum(states.values()) == 3041 and states[("contaminated", "drop")] == 60
    document, status = _audit(settings, monkeypatch, "audit", "doc", "0" * 16, "--json")
    assert status == 1 and document["error"]["code"] == "AUDIT_NOT_FOUND"
    # Any text is looked up, as a record's own id may be any (a control character, any length);
    # bytes that are not UTF-8 (as argv hands them over) are refused.
    for absent in ("x" * 256, "x" * 257, "not\aan-id"):
        document, status = _audit(settings, monkeypatch, "audit", "doc", absent, "--json")
        assert status == 1 and document["error"]["code"] == "AUDIT_NOT_FOUND"
    document, status = _audit(settings, monkeypatch, "audit", "doc", "not\udcffutf8", "--json")
    assert status == 2 and document["error"]["code"] == "USAGE_ERROR" and "not\\udcff" not in json.dumps(document)
    text, _ = _audit(settings, monkeypatch, "audit", "doc", duplicate[0])
    assert any("removed as near duplicate" in line for line in text["_text"])


def test_lineage_tables_hold_every_document_and_every_clean_row(chain) -> None:
    settings, _, _, _ = chain
    import duckdb

    with duckdb.connect(str(settings.warehouse_path), read_only=True) as con:
        num_documents, num_ids = con.execute("SELECT count(*), count(DISTINCT doc_id) FROM documents").fetchone()
        num_placed, num_unplaced = con.execute(
            "SELECT count(*), count(*) FILTER (s.shard_sha256 IS NULL) FROM clean_pieces p "
            "LEFT JOIN clean_shards s USING (manifest_digest, shard_path, shard_sha256)"
        ).fetchone()
        num_clean_rows = con.execute("SELECT sum(num_rows) FROM clean_shards").fetchone()[0]
        doc_id, num_chars, shard_path = con.execute("SELECT doc_id, num_chars, shard_path FROM documents ORDER BY doc_id LIMIT 1").fetchone()
        num_decisions, num_duplicates = con.execute("SELECT count(*), count(*) FILTER (state = 'duplicate') FROM decisions").fetchone()
        assert con.execute("SELECT count(*) FROM duplicates").fetchone()[0] == num_duplicates > 0
    assert num_documents == num_ids == num_decisions == 3041
    assert num_placed == num_clean_rows > 0 and num_unplaced == 0
    text = pl.read_parquet(shard_path).filter(pl.col("doc_id") == doc_id)["text"][0]
    assert num_chars == len(text)


def test_the_residual_check_refuses_changed_ignored_seeds(chain) -> None:
    _, _, _, result = chain
    clean, suite, report = (result.output_for_node(n) for n in ("clean_shards", "eval_suite", "contamination_report"))
    assert zero_residual_contamination(clean, suite, report).passed
    seeds = Path(report.ignored_seeds.path)
    original = seeds.read_bytes()
    try:
        pl.DataFrame({"seed": [1], "view": [0]}, schema={"seed": pl.UInt64, "view": pl.Int32}).write_parquet(seeds)
        verdict = zero_residual_contamination(clean, suite, report)
    finally:
        seeds.write_bytes(original)
    assert not verdict.passed and "ignored seeds changed" in verdict.metadata["problems"].value


def test_the_residual_check_scans_against_the_suite_the_report_used_or_fails(chain) -> None:
    """`eval_suite` is one output for every partition: another run may have stored another suite
    since. Scanned against it, a clean corpus failed (an item quoting a kept document) and a
    contaminated one would pass; now the check fails with EVAL_SUITE_MISMATCH and names the suite."""
    import dataclasses

    from ito_assets.evals.suite import EvalItem

    _, _, _, result = chain
    clean, suite, report = (result.output_for_node(n) for n in ("clean_shards", "eval_suite", "contamination_report"))
    kept = pl.read_parquet(clean.shards.shards[0].path)["text"][0]
    other = dataclasses.replace(suite, suite_id="another", digest="sha256:" + "1" * 64,
                                items=(EvalItem(id="x/0", benchmark="x", question=kept, answer="a"),))
    verdict = zero_residual_contamination(clean, other, report)
    assert not verdict.passed and verdict.metadata["error_code"].value == "EVAL_SUITE_MISMATCH"
    assert verdict.metadata["eval_suite_id"].value == "another"
    passed = zero_residual_contamination(clean, suite, report)
    assert passed.passed and passed.metadata["eval_suite_digest"].value == report.eval_suite_digest


def test_the_asset_and_the_audit_report_one_count_of_removals(chain, monkeypatch) -> None:
    """The deduplicated_documents asset's metadata and `ito audit manifest` give the same number
    of exact and of near removals for a partition, and the documents' states agree with both."""
    settings, _, key, _ = chain
    event = next(e for e in chain[3].get_asset_materialization_events() if e.asset_key.to_user_string() == "deduplicated_documents")
    shown = {method: event.materialization.metadata[f"num_{method}_removed"].value for method in ("exact", "near")}
    document, status = _audit(settings, monkeypatch, "audit", "manifest", key, "--json")
    assert status == 0 and document["data"]["removed_by_method"] == shown
    states = {s["detail"]: s["num_documents"] for s in document["data"]["states"] if s["state"] == "duplicate"}
    assert states == shown and shown["exact"] > 0 and shown["near"] > 0
    # The case that once split the two counts: an exact copy of a document removed as near.
    import duckdb

    with duckdb.connect(str(settings.warehouse_path), read_only=True) as con:
        (twins,) = con.execute("SELECT count(*) FROM duplicates WHERE method = 'near' AND exact_copy_of IS NOT NULL").fetchone()
    deduplicated = chain[3].output_for_node("deduplicated_documents")
    assert twins > 0 and deduplicated.counts.exact.num_removed == shown["exact"] + twins


@pytest.mark.parametrize("step, fields, named", [
    ("deduplicated_documents", {"threshold": 0.0}, "threshold"),
    ("deduplicated_documents", {"warn_duplicate_rate": 0.0}, "warn_duplicate_rate"),
    ("contamination_report", {"min_overlap": 0.0}, "min_overlap"),
    ("decision_run", {"seeds": []}, "seeds"),
    ("decision_run", {"num_threads": -1}, "num_threads"),
    ("decision_run", {"num_threads": 1025}, "num_threads"),
])
def test_a_launchpad_value_the_core_refuses_stops_the_run_at_its_first_step(tmp_path, fixtures_dir, step, fields, named) -> None:
    """Dagster checks a step's config for its types; the core's ranges refused a later step's
    value only when that step ran, after the steps before it (a raw ValueError, no code)."""
    settings = _settings(tmp_path.resolve(), fixtures_dir)
    with dg.instance_for_test() as instance:
        _, result = _materialize(settings, instance, run_config={"ops": {step: {"config": fields}}} if step != "decision_run"
                                 else None)
        if step == "decision_run":  # not in this job: its config is judged the same way, by the same table
            from ito_assets.defs.run_config import check_run_config

            with pytest.raises(dg.Failure) as refused:
                check_run_config({"ops": {step: {"config": fields}}})
            failure = refused.value
        else:
            assert not result.success
            [event] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
            assert event.step_key == "source_documents"
            assert not result.get_asset_materialization_events() or {
                e.asset_key.to_user_string() for e in result.get_asset_materialization_events()} <= {"eval_suite", "training_manifest"}
            failure = event.event_specific_data.user_failure_data
    assert failure.metadata["error_code"].value == "USAGE_ERROR"
    assert f"the run config of {step}: " in failure.description and named in failure.description
