"""The decision domain's Dagster shell: graph shape, blocking checks, and the assets invoked on a
small installation (the micro model, so that it runs in seconds)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from helpers import valid_manifest
from ito_assets.data import lineage, warehouse
from ito_assets.data.shards import write_shards
from ito_assets.data.stages import CleanStage
from ito_assets.defs import data, decision, manifest
from ito_assets.defs.decision.assets import data_decision, decision_run, training_plan
from ito_assets.defs.decision.checks import (
    decision_baseline_bound, decision_is_go, plan_not_refused, plan_within_budget_cap, plan_within_max_incremental,
)
from ito_assets.defs.decision.params import DataDecisionParams, DecisionRunParams
from ito_assets.defs.decision.resources import BookedHardwareResource
from ito_assets.defs.resources import ItoSettingsResource
from ito_assets.evals.suite import load_suite
from ito_assets.manifest.discovery import judge
from ito_assets.settings import load_settings
from ito_assets.manifest.schema import BaselineFile
from ito_assets.training.decision_gate import decision_gate, judge_decision
from ito_assets.training.economics import EconomicsConfig
from ito_assets.training.mixtures import MixtureSource
from ito_assets.training.verdict import Verdict

FIXTURES = Path(__file__).resolve().parents[2] / "data" / "fixtures"


def test_graph_groups_deps_and_blocking_checks():
    shell = dg.Definitions(resources={"ito": ItoSettingsResource.from_settings(load_settings())})
    defs = dg.Definitions.merge(manifest.defs(), data.defs(), decision.defs(), shell)
    graph = defs.resolve_asset_graph()
    groups = {k.to_user_string(): graph.get(k).group_name for k in graph.get_all_asset_keys()}
    assert {k: groups[k] for k in ("decision_run", "data_decision", "training_plan")} == dict.fromkeys(
        ("decision_run", "data_decision", "training_plan"), "decision")
    deps = {k.to_user_string(): {p.to_user_string() for p in graph.get(k).parent_keys} for k in graph.get_all_asset_keys()}
    assert deps["decision_run"] == {"training_manifest", "eval_suite", "clean_shards"}
    assert deps["data_decision"] == {"training_manifest", "decision_run"}
    assert deps["training_plan"] == {"training_manifest", "data_decision"}
    checks = {(k.asset_key.to_user_string(), k.name): graph.get_check_spec(k).blocking for k in graph.asset_check_keys}
    for key in [("data_decision", "decision_is_go"), ("training_plan", "plan_not_refused"),
                ("training_plan", "plan_within_budget_cap"), ("training_plan", "plan_within_max_incremental")]:
        assert checks[key] is True
    assert checks[("data_decision", "decision_baseline_bound")] is False  # a warning: the run config's baseline


@pytest.fixture
def world(installation, tmp_path):
    # The installation's suite has one item per benchmark, too few for any decision (INCONCLUSIVE):
    # its reviewers accept that too, so that the wiring below runs to the plan.
    manifest_path = installation.manifest("decision-defs", data_decision={
        "accepted_verdicts": ["NO_GO", "WITHIN_NOISE", "INCONCLUSIVE"], "reason": "unit test", "reviewed_by": "tests"})
    verdict = judge(manifest_path, _short_key(manifest_path), max_bytes=installation.settings.max_manifest_bytes)
    assert verdict.ok, verdict.error_message
    texts = [json.loads(line)["text"] for name in ("pydoc_topics", "forum_posts")
             for line in list((FIXTURES / "corpora" / f"{name}.jsonl").open())[:200]]
    shards = write_shards(pl.DataFrame({"text": texts}), tmp_path / "clean", prefix="clean", max_rows=100)
    clean = CleanStage(manifest_digest=verdict.digest, shards=shards, decisions=shards.shards[0], conservation=None)
    garbage = tmp_path / "garbage.jsonl"
    # Printable bytes drawn at random: no language at all, so the clean arm is better on every seed.
    rng = random.Random(0)
    garbage.write_text("".join(json.dumps({"text": "".join(chr(rng.randrange(32, 127)) for _ in t)}) + "\n" for t in texts))
    return installation, verdict, clean, f"file://{garbage}"


def _columns(table) -> list[str]:
    return [c.name for c in table.schema.columns]


def _short_key(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]


def test_assets_decide_plan_and_check(world):
    installation, verdict, clean, baseline_uri = world
    ito = ItoSettingsResource.from_settings(installation.settings)
    hardware = BookedHardwareResource()
    suite = load_suite(installation.settings.eval_suite_path)  # the one the manifest's data was decontaminated against
    params = DecisionRunParams(model_name="micro", vocab_size=512, seeds=[0, 1], num_steps=20, batch_size=8,
                               sequence_length=64, learning_rate=1e-2, baseline_uris=[baseline_uri], num_threads=1)
    context = dg.build_asset_context(partition_key=verdict.key)
    result = decision_run(context=context, config=params, ito=ito, training_manifest=verdict, eval_suite=suite, clean_shards=clean)
    # A 20-step micro model decides little, so this test pins the wiring, not a verdict: two paired
    # seeds, each arm trained on the stage worker, and a gate that follows the manifest, whose
    # reviewers accept NO_GO, WITHIN_NOISE and INCONCLUSIVE (`world`).
    assert result.test.num_seeds == 2 and result.test.interval_low is not None
    assert result.verdict is Verdict.INCONCLUSIVE and "too few eval items" in result.explanation
    assert dict(result.num_items_by_benchmark) == {"arith": 1, "trivia": 1} and result.attempt == 1
    # What the candidate was measured against: the baseline's file with its sha256, and its texts' digest.
    garbage = Path(baseline_uri.removeprefix("file://"))
    assert [(s.uri, s.sha256) for s in result.baseline_sources] == [(baseline_uri, hashlib.sha256(garbage.read_bytes()).hexdigest())]
    assert result.baseline_sha256 and len(result.baseline_sha256) == 64
    assert (installation.settings.state_dir / "decision" / verdict.key / "tokenizer.json").is_file()
    runs = context.get_output_metadata("result")["runs"]
    assert _columns(runs) == ["arm", "seed", "answer bits/byte", "accuracy %", "P(correct) %", "final loss", "tokens/s"]
    assert len(runs.records) == 4  # two arms, two seeds
    metadata = context.get_output_metadata("result")
    assert metadata["arms_trained_on"] == "the stage worker (under the supervisor)"
    fallbacks = {r.data["field"]: r.data for r in metadata["arm_layout_fallbacks"].value.records}
    assert fallbacks["compile"]["ran"] == "False"  # a CPU host runs eager, and says why
    for seed in (0, 1):  # each arm in its own stage folder, with the worker's result
        assert (installation.settings.state_dir / "decision" / verdict.key / "arms" / f"baseline-seed{seed}" / "result.json").is_file()
    decided = dg.build_asset_context(partition_key=verdict.key)
    judged = data_decision(context=decided, config=DataDecisionParams(), ito=ito,
                           booked_hardware=hardware, training_manifest=verdict, decision_run=result)
    # Lineage for auditors: the proxies consumed every clean shard (recorded by the short step).
    with warehouse.connect(installation.settings.warehouse_path, read_only=True) as con:
        consumed = lineage.audit_manifest(con, verdict.digest)["consumed_by"]
    assert [(c["run_id"], c["stage"]) for c in consumed] == [("EPHEMERAL", "decision_run")], consumed
    assert judged.gate.passed and judged.economics is not None and judged.economics.full_run_cost_cents > 0
    metadata = decided.get_output_metadata("result")
    assert metadata["effect_chart"].value.startswith("![data decision effect](data:image/png;base64,")
    assert (metadata["interval_low"], metadata["interval_high"]) == (result.test.interval_low, result.test.interval_high)
    planned = dg.build_asset_context(partition_key=verdict.key)
    outcome = training_plan(context=planned, ito=ItoSettingsResource.from_settings(installation.settings),
                            booked_hardware=hardware, training_manifest=verdict, data_decision=judged)
    assert not outcome.refused and outcome.run_plan.post_training_included
    stages = planned.get_output_metadata("result")["stages"]
    assert _columns(stages) == ["stage", "layout", "GiB/GPU", "MFU %", "steps", "cost USD"]
    assert [r.data["stage"] for r in stages.records] == [s.stage for s in outcome.run_plan.stages]
    assert "checkpointing" in stages.records[0].data["layout"]  # one readable cell, e.g. "dp_shard=8, bf16, ..."
    for check in (plan_not_refused, plan_within_budget_cap, plan_within_max_incremental):
        assert check(training_plan=outcome).passed
    check = decision_is_go(data_decision=judged)
    assert check.passed and check.metadata["baseline_sha256"].value == result.baseline_sha256
    assert check.metadata["baseline_sources"].value[0]["uri"] == baseline_uri
    assert decided.get_output_metadata("result")["baseline_sha256"] == result.baseline_sha256
    # This manifest binds no baseline: the run config named it, and the UI warns.
    assert result.baseline_bound is False
    warned = decision_baseline_bound(data_decision=judged)
    assert not warned.passed and warned.severity is dg.AssetCheckSeverity.WARN and "no reviewer bound" in warned.description
    assert check.metadata["baseline_bound_by_manifest"].value is False
    # A manifest that binds the baseline: the gate holds only on a decision measured against its files.
    digest = hashlib.sha256(garbage.read_bytes()).hexdigest()
    bound = verdict.verified.manifest.model_copy(update={"decision_baseline": (BaselineFile(uri=baseline_uri, sha256=digest),)})
    assert judge_decision(result, bound, hardware.hardware(), EconomicsConfig()).gate.passed
    other = dataclasses.replace(result, baseline_sources=(MixtureSource(uri=baseline_uri, sha256="0" * 64, num_documents=1),))
    stale = judge_decision(other, bound, hardware.hardware(), EconomicsConfig()).gate
    assert not stale.passed and stale.error_code.value == "DATA_DECISION_STALE" and "decision_baseline" in stale.reason
    rebound = bound.model_copy(update={"decision_baseline": (BaselineFile(uri=baseline_uri, sha256="1" * 64),)})
    at_booking = judged.for_booking(outcome.run_plan, rebound)  # judged before; the manifest binds other bytes
    assert not at_booking.passed and at_booking.error_code.value == "DATA_DECISION_STALE"
    assert judged.for_booking(outcome.run_plan, bound).passed
    # A stored gate that failed on its economics is judged again on the booking's, never over a
    # baseline that no longer holds.
    unpriced = dataclasses.replace(judged, gate=dataclasses.replace(judged.gate, passed=False, worth_it=False))
    assert unpriced.for_booking(outcome.run_plan, bound).passed
    assert unpriced.for_booking(outcome.run_plan, rebound).error_code.value == "DATA_DECISION_STALE"
    unreviewed = verdict.verified.manifest.model_copy(update={"data_decision": None})
    blocked = dataclasses.replace(judged, gate=decision_gate(Verdict.INCONCLUSIVE, unreviewed))
    check = decision_is_go(data_decision=blocked)
    assert not check.passed and check.metadata["error_code"].value == "DATA_DECISION_INCONCLUSIVE"


def _bound_world(installation, tmp_path, baseline: Path, sha256: str):
    """A manifest binding `baseline` (a file URI) at `sha256`, and the candidate of `world`."""
    path = installation.manifest("decision-bound", decision_baseline=[{"uri": f"file://{baseline}", "sha256": sha256}])
    judged = judge(path, _short_key(path), max_bytes=installation.settings.max_manifest_bytes)
    assert judged.ok, judged.error_message
    return judged


def _decide(installation, verdict, clean, params):
    decision_run(context=dg.build_asset_context(partition_key=verdict.key), config=params,
                 ito=ItoSettingsResource.from_settings(installation.settings), training_manifest=verdict,
                 eval_suite=load_suite(installation.settings.eval_suite_path), clean_shards=clean)


def test_a_bound_baseline_is_read_at_its_digest_and_no_run_config_replaces_it(world, tmp_path):
    """Refused before a tokenizer is fitted or a proxy trains: a run config naming other files
    (a weak baseline makes any candidate a GO), and a bound file whose bytes changed since review."""
    installation, _, clean, baseline_uri = world
    baseline = Path(baseline_uri.removeprefix("file://"))
    bound = _bound_world(installation, tmp_path, baseline, hashlib.sha256(baseline.read_bytes()).hexdigest())
    clean = dataclasses.replace(clean, manifest_digest=bound.digest)
    with pytest.raises(dg.Failure) as refused:
        _decide(installation, bound, clean, DecisionRunParams(model_name="micro", baseline_uris=["dataroot://weak.jsonl"]))
    assert refused.value.metadata["error_code"].value == "USAGE_ERROR" and "decision_baseline" in refused.value.description
    baseline.write_text(baseline.read_text() + json.dumps({"text": "one more line"}) + "\n")
    with pytest.raises(dg.Failure) as refused:  # the default run config: the manifest's file is read
        _decide(installation, bound, clean, DecisionRunParams(model_name="micro"))
    assert refused.value.metadata["error_code"].value == "SOURCE_DIGEST_MISMATCH"
    assert not (installation.settings.state_dir / "decision" / bound.key / "arms").exists()


def test_the_defaults_give_way_to_a_bound_baseline_and_a_runs_own_files_are_refused():
    """The code's default and the location's (ITO_DECISION_CONFIG) are for manifests that bind no
    baseline: a location default must not fail every decision of a manifest that binds one."""
    from ito_assets.defs.decision.assets import _baseline_files
    from ito_assets.errors import ItoError
    from ito_assets.manifest.schema import Manifest

    document = valid_manifest()
    document["decision_baseline"] = [{"uri": "dataroot://reviewed.jsonl", "sha256": "a" * 64}]
    bound = Manifest.model_validate_json(json.dumps(document))
    expected = (["dataroot://reviewed.jsonl"], ["a" * 64])
    location = ["dataroot://location.jsonl"]
    for named in (None, ["dataroot://reviewed.jsonl"], location):
        params = DecisionRunParams() if named is None else DecisionRunParams(baseline_uris=named)
        assert _baseline_files(bound, params, location) == expected
    with pytest.raises(ItoError) as refused:
        _baseline_files(bound, DecisionRunParams(baseline_uris=["dataroot://weak.jsonl"]), location)
    assert refused.value.code.value == "USAGE_ERROR"
    unbound = Manifest.model_validate_json(json.dumps(valid_manifest()))
    assert _baseline_files(unbound, DecisionRunParams(baseline_uris=location), None) == (location, None)


def test_a_decision_config_pickled_before_its_module_moved_still_loads():
    """Dagster stored each DecisionResult by pickle, which names DecisionConfig's module."""
    import pickle

    from ito_assets.training.decision_config import DecisionConfig

    config = DecisionConfig(model_name="micro", seeds=(3, 4))
    # Protocol 2 names a class as text ("module\nname"), so the module is renamed in place.
    older = pickle.dumps(config, protocol=2).replace(b"ito_assets.training.decision_config\n",
                                                     b"ito_assets.training.decision\n")
    assert b"ito_assets.training.decision_config" not in older
    assert pickle.loads(older) == config


def test_missing_baseline_fails_with_its_code(world):
    installation, verdict, clean, _ = world
    params = DecisionRunParams(model_name="micro", baseline_uris=["dataroot://nowhere.jsonl"])
    with pytest.raises(dg.Failure, match="SOURCE_NOT_FOUND"):
        decision_run(context=dg.build_asset_context(partition_key=verdict.key), config=params,
                     ito=ItoSettingsResource.from_settings(installation.settings), training_manifest=verdict,
                     eval_suite=load_suite(installation.settings.eval_suite_path), clean_shards=clean)


def test_a_stored_suite_other_than_the_manifests_fails_the_decision_before_it_trains(world):
    """`eval_suite` is one output for every partition: another run may have stored another suite,
    against which this data was never decontaminated; scored on it, the decision means nothing."""
    installation, verdict, clean, baseline_uri = world
    suite = load_suite(installation.settings.eval_suite_path)
    other = dataclasses.replace(suite, suite_id="another", digest="sha256:" + "1" * 64)
    params = DecisionRunParams(model_name="micro", baseline_uris=[baseline_uri])
    with pytest.raises(dg.Failure, match="EVAL_SUITE_MISMATCH"):
        decision_run(context=dg.build_asset_context(partition_key=verdict.key), config=params,
                     ito=ItoSettingsResource.from_settings(installation.settings), training_manifest=verdict,
                     eval_suite=other, clean_shards=clean)
    assert not (installation.settings.state_dir / "decision" / verdict.key / "arms").exists()


def test_a_run_config_out_of_range_fails_with_usage_error_before_reading_anything(world):
    """Refused by the field's name before the baseline is read (it does not exist here) or a
    tokenizer is fitted: a bare ValueError, raised after the tokenizer, failed the step before."""
    installation, verdict, clean, _ = world
    for field, fields in (("seeds", {"seeds": [-1, 0, 1]}), ("sequence_length", {"model_name": "micro", "sequence_length": 257}),
                          ("batch_size", {"batch_size": 10**6})):
        params = DecisionRunParams(**fields, baseline_uris=["dataroot://nowhere.jsonl"])
        with pytest.raises(dg.Failure) as refused:
            decision_run(context=dg.build_asset_context(partition_key=verdict.key), config=params,
                         ito=ItoSettingsResource.from_settings(installation.settings), training_manifest=verdict,
                         eval_suite=load_suite(installation.settings.eval_suite_path), clean_shards=clean)
        assert refused.value.metadata["error_code"].value == "USAGE_ERROR"
        assert f"the run config of decision_run: {field}" in refused.value.description
    assert not (installation.settings.state_dir / "decision" / verdict.key).exists()
