"""The code location loaded whole: a change to the asset graph is a visible change in review."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from definitions import build_definitions
from ito_assets.settings import load_settings

ROOT = Path(__file__).resolve().parents[1]

EXPECTED_ASSETS = {
    "eval_suite": "manifest",
    "training_manifest": "manifest",
    "run_authorization": "workload",
    "source_documents": "data",
    "deduplicated_documents": "data",
    "contamination_report": "data",
    "clean_shards": "data",
    "decision_run": "decision",
    "data_decision": "decision",
    "training_plan": "decision",
    "training_tokens": "training",
    "pretraining_checkpoint": "training",
    "mid_training_checkpoint": "training",
    "long_context_checkpoint": "training",
    "training_telemetry": "telemetry",
    "sft_checkpoint": "posttraining",
    "dpo_checkpoint": "posttraining",
    "rlvr_checkpoint": "posttraining",
}
# One owning team per group (ito_assets/defs/owners.py): a new asset must name its team.
EXPECTED_OWNERS = {
    "manifest": ["team:data"], "data": ["team:data"], "decision": ["team:research"],
    "workload": ["team:training"], "training": ["team:training"], "posttraining": ["team:training"],
    "telemetry": ["team:training"],
}
EXPECTED_CHECKS = {
    ("training_manifest", "manifest_verified"),
    ("training_manifest", "manifest_has_no_secrets"),
    ("training_manifest", "provenance_present"),
    ("training_manifest", "eval_suite_digest_matches"),
    ("run_authorization", "run_still_authorized"),
    ("source_documents", "source_digests_match"),
    ("source_documents", "document_provenance_present"),
    ("contamination_report", "eval_suite_digest_recorded"),
    ("clean_shards", "conservation_holds"),
    ("clean_shards", "zero_residual_contamination"),
    ("deduplicated_documents", "duplicate_rate_plausible"),
    ("data_decision", "decision_is_go"),
    ("training_plan", "plan_not_refused"),
    ("training_plan", "plan_within_budget_cap"),
    ("training_plan", "plan_within_max_incremental"),
    ("pretraining_checkpoint", "pretraining_eval_gate"),
    ("mid_training_checkpoint", "mid_training_eval_gate"),
    ("long_context_checkpoint", "long_context_eval_gate"),
    ("sft_checkpoint", "sft_eval_gate"),
    ("dpo_checkpoint", "dpo_eval_gate"),
    ("rlvr_checkpoint", "rlvr_eval_gate"),
}
EXPECTED_SENSORS = {
    "reviewed_manifest_sensor", "eval_suite_changed", "confirmed_run_sensor", "cancellation_sensor",
    "training_succeeded_sensor", "training_failed_sensor", "training_canceled_sensor",
}


def _graph():
    defs = build_definitions(load_settings())
    graph = defs.resolve_asset_graph()
    assets = {key.to_user_string(): graph.get(key).group_name for key in graph.get_all_asset_keys()}
    checks = {(k.asset_key.to_user_string(), k.name) for k in graph.asset_check_keys}
    sensors = {s.name for s in defs.get_repository_def().sensor_defs}
    return defs, assets, checks, sensors


def test_asset_graph_snapshot():
    _, assets, checks, sensors = _graph()
    assert {k: v for k, v in assets.items() if k in EXPECTED_ASSETS} == EXPECTED_ASSETS
    assert EXPECTED_CHECKS <= checks
    assert EXPECTED_SENSORS <= sensors


def test_every_asset_has_its_team_and_a_description():
    """Every asset of the location, not only the listed ones: the UI's owner and description are
    how a reader finds who answers for an asset and where it comes from."""
    defs, assets, _, _ = _graph()
    graph = defs.resolve_asset_graph()
    for name, group in assets.items():
        node = graph.get(dg.AssetKey.from_user_string(name))
        assert node.owners, f"{name} has no owner"
        assert node.owners == EXPECTED_OWNERS[group], (name, node.owners)
        assert (node.description or "").strip(), f"{name} has no description"


def test_the_assets_of_a_trained_run_explain_their_partial_fill():
    """`make run` prepares two manifests and trains one: the run's assets say so in the UI."""
    defs, assets, _, _ = _graph()
    graph = defs.resolve_asset_graph()
    for name, group in assets.items():
        if group in ("workload", "training", "posttraining"):
            assert "50% filled / 1 missing" in graph.get(dg.AssetKey.from_user_string(name)).description, name


def test_manifest_checks_are_blocking():
    defs, _, _, _ = _graph()
    graph = defs.resolve_asset_graph()
    for key in graph.asset_check_keys:
        if key.asset_key.to_user_string() in ("training_manifest", "run_authorization"):
            assert graph.get_check_spec(key).blocking, key


def test_reactive_sensors_start_running():
    defs, _, _, _ = _graph()
    for sensor in defs.get_repository_def().sensor_defs:
        assert sensor.default_status is dg.DefaultSensorStatus.RUNNING, sensor.name


def test_dagster_definitions_validate(tmp_path):
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
    dagster = str(Path(sys.executable).with_name("dagster"))
    result = subprocess.run(
        [dagster, "definitions", "validate", "-w", "workspace.yaml"],
        cwd=ROOT, capture_output=True, text=True, timeout=240, env=env,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


# Loaded by the webserver, the daemon and every step's process: torch's import (seconds) is paid
# only where a model is built or trained, inside the asset bodies that do so.
_LOAD_WITHOUT_TORCH = """
import sys
import definitions
definitions.build_definitions(definitions.load_settings()).get_repository_def()
heavy = sorted(m for m in ("torch", "ito_assets.training.model") if m in sys.modules)
assert not heavy, heavy
"""


def test_the_code_location_loads_without_torch(tmp_path):
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", _LOAD_WITHOUT_TORCH], cwd=ROOT, capture_output=True, text=True,
                            timeout=240, env=env)
    assert result.returncode == 0, result.stderr[-2000:]


def test_loading_the_code_location_prints_no_preview_warning(tmp_path):
    """Partitioned asset checks are a preview feature we use knowingly: its warning, raised once per
    check, must not fill the log of every process that loads the code location."""
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
    probe = "import definitions; definitions.build_definitions(definitions.load_settings()).get_repository_def()"
    result = subprocess.run([sys.executable, "-W", "default", "-c", probe], cwd=ROOT, capture_output=True, text=True,
                            timeout=240, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "PreviewWarning" not in result.stderr and "BetaWarning" not in result.stderr


def test_a_ledger_url_from_the_environment_stays_an_env_var(tmp_path, monkeypatch):
    """A production ledger URL carries a password: the code location names the variable, and
    only a step (or `make run`'s direct use) resolves it."""
    canary = "canary-pw-7f3e9a"
    url = f"sqlite:///{tmp_path / 'ledger.db'}?password={canary}"  # SQLite ignores the query
    monkeypatch.setenv("ITO_LEDGER_URL", url)
    resource = build_definitions(load_settings(), domains=("manifest",)).resources["ledger"]
    assert isinstance(resource.url, dg.EnvVar) and resource.url.env_var_name == "ITO_LEDGER_URL"
    assert canary not in repr(resource)
    assert resource.process_config_and_initialize().url == url
    with resource.open() as ledger:  # the direct caller resolves it too
        assert ledger.engine.url.database == str(tmp_path / "ledger.db")
    explicit = load_settings().with_overrides(ledger_url=f"sqlite:///{tmp_path / 'other.db'}")
    assert explicit.ledger_url_env is None


def _decision_defaults(env: dict, decision_run_config: dict | None = None) -> dict:
    defs = build_definitions(load_settings(env), decision_run_config=decision_run_config)
    config = defs.resolve_job_def("preparation_job").partitioned_config.get_run_config_for_partition_key("any")
    return (config or {}).get("ops", {}).get("decision_run", {}).get("config", {})


def test_the_decision_config_setting_is_the_preparation_job_s_default():
    """ITO_DECISION_CONFIG's fields join ITO_DECISION_TRAINER's (its own trainer wins over it), and a
    config handed to the location wins over both."""
    micro = '{"model_name": "micro", "vocab_size": 512}'
    assert _decision_defaults({"ITO_DECISION_CONFIG": micro}) == {"model_name": "micro", "vocab_size": 512}
    assert _decision_defaults({"ITO_DECISION_CONFIG": '{"trainer": "stage_worker"}', "ITO_DECISION_TRAINER": "in_process"}) \
        == {"trainer": "stage_worker"}
    assert _decision_defaults({"ITO_DECISION_CONFIG": micro, "ITO_DECISION_TRAINER": "in_process"}, {"vocab_size": 300}) == {
        "trainer": "in_process", "model_name": "micro", "vocab_size": 300}
    assert _decision_defaults({"ITO_DECISION_CONFIG": "{}"}) == {}


@pytest.mark.parametrize(("fields", "message"), [
    ('{"num_step": 4}', "not a field of the decision run's config: num_step "),
    ('{"num_step": 4, "canary-4e1d sk-x": 1}', "num_step, 1 more that are no field names "),
    ('{"num_steps": "canary-4e1d"}', "num_steps: Input should be a valid integer"),
    # Values Dagster's config refuses only at a run's launch, echoing them: none is converted here.
    ('{"num_steps": "4"}', "num_steps: Input should be a valid integer"),
    ('{"batch_size": true}', "batch_size: Input should be a valid integer"),
    ('{"vocab_size": 512.0}', "vocab_size: Input should be a valid integer"),
    ('{"seeds": [0, true]}', "seeds: Input should be a valid integer"),
    ('{"num_steps": 0}', "num_steps must be positive"),
    ('{"learning_rate": 0}', "learning_rate must be positive and finite"),
    ('{"learning_rate": NaN}', "learning_rate must be positive and finite"),
    ('{"learning_rate": Infinity}', "learning_rate must be positive and finite"),
    ('{"num_threads": -1}', "num_threads: must be 0 (torch's default) to 1024"),
    ('{"num_eval_candidates": 1}', "num_eval_candidates: must be at least 2"),
    ('{"seeds": []}', "seeds must be distinct and non-empty"),
    ('{"trainer": "torchrun"}', "trainer: Input should be 'stage_worker' or 'in_process'"),
])
def test_a_decision_config_the_run_config_would_refuse_stops_the_location_with_the_field(fields, message):
    """Refused when the location loads, not at the first run the sensor launches; the value given is
    never echoed."""
    with pytest.raises(ValueError, match="^ITO_DECISION_CONFIG: ") as refused:
        _decision_defaults({"ITO_DECISION_CONFIG": fields})
    assert message in str(refused.value) and "canary-4e1d" not in str(refused.value)


def test_a_decision_config_at_its_fields_bounds_loads_and_dagster_launches_it():
    fields = {"num_steps": 1, "seeds": [7], "num_threads": 0, "num_eval_candidates": 2, "learning_rate": 1}
    defs = build_definitions(load_settings({"ITO_DECISION_CONFIG": json.dumps(fields)}))
    job = defs.resolve_job_def("preparation_job")
    config = job.partitioned_config.get_run_config_for_partition_key("any")
    assert config["ops"]["decision_run"]["config"] == fields
    assert dg.validate_run_config(job, config)  # Dagster's own check takes what the location took


def test_the_decision_trainer_setting_is_the_preparation_job_s_default():
    """ITO_DECISION_TRAINER is the job's default (the launchpad shows it; the daemon and `make run`
    launch with it); a config handed to the location keeps its own fields and wins."""
    assert _decision_defaults({}) == {}
    assert _decision_defaults({"ITO_DECISION_TRAINER": "stage_worker"}) == {}
    assert _decision_defaults({"ITO_DECISION_TRAINER": "in_process"}) == {"trainer": "in_process"}
    assert _decision_defaults({"ITO_DECISION_TRAINER": "in_process"}, {"num_steps": 3}) == {
        "trainer": "in_process", "num_steps": 3}
    assert _decision_defaults({"ITO_DECISION_TRAINER": "in_process"}, {"trainer": "stage_worker"}) == {
        "trainer": "stage_worker"}
