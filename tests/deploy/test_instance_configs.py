"""Every dagster.yaml under deploy/ validates against Dagster's own instance schema, and the code
location loads with each deployment's settings."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._core.instance.config import dagster_instance_config

from definitions import build_definitions
from helpers import QUICK_DECISION, postgres_dagster_instance, postgres_url_or_skip
from ito_assets.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "deploy").glob("*/dagster.yaml"))
PG_ENV = {"DAGSTER_PG_HOST": "127.0.0.1", "DAGSTER_PG_PORT": "5432", "DAGSTER_PG_USER": "postgres",
          "DAGSTER_PG_PASSWORD": "", "DAGSTER_PG_DB": "test", "ITO_CODE_IMAGE": "ito-training:test"}


def test_every_variant_is_found():
    assert {p.parent.name for p in CONFIGS} == {"local", "postgres", "cluster"}


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.parent.name)
def test_validates_against_dagster_schema(config, monkeypatch):
    for name, value in PG_ENV.items():
        monkeypatch.setenv(name, value)
    validated, instance_class = dagster_instance_config(str(config.parent))
    assert validated["telemetry"]["enabled"] is False
    assert validated["concurrency"]["pools"]["default_limit"] == 1


def test_cluster_launcher_config_fits_the_k8s_launcher():
    from dagster._config import validate_config
    from dagster_k8s import K8sRunLauncher

    launcher = yaml.safe_load((ROOT / "deploy/cluster/dagster.yaml").read_text())["run_launcher"]
    assert (launcher["module"], launcher["class"]) == ("dagster_k8s", "K8sRunLauncher")
    result = validate_config(K8sRunLauncher.config_type(), launcher["config"])
    assert result.success, result.errors


@pytest.mark.parametrize("executor", ["multiprocess", "in_process", "k8s"])
def test_definitions_load_with_each_executor(executor):
    settings = load_settings().with_overrides(executor=executor)
    defs = build_definitions(settings)
    job = defs.resolve_job_def("preparation_job")
    assert job.executor_def.name == {"multiprocess": "multiprocess", "in_process": "in_process",
                                     "k8s": "k8s"}[executor]


@pytest.mark.long  # `make test` runs the local instance whole: tests/test_local_run.py
def test_local_instance_runs_the_manifest_job(installation, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(ROOT / "deploy/local/dagster.yaml", home / "dagster.yaml")
    _run_manifest_job(installation, dg.DagsterInstance.from_config(str(home)))


@pytest.mark.postgres
def test_postgres_instance_runs_the_manifest_job(installation, tmp_path, monkeypatch):
    url = postgres_url_or_skip()
    database = f"ito_dagster_{uuid.uuid4().hex[:10]}"
    import psycopg

    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    try:
        instance = postgres_dagster_instance(tmp_path / "home", database, monkeypatch)
        _run_manifest_job(installation, instance)
        instance.dispose()
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def _run_manifest_job(installation, instance: dg.DagsterInstance) -> None:
    from ito_assets.local_run import RunSummary, evaluate_sensor

    installation.manifest("alpha")
    settings = installation.settings.with_overrides(executor="in_process")
    summary = RunSummary()
    evaluate_sensor(build_definitions(settings, decision_run_config=QUICK_DECISION), instance, "reviewed_manifest_sensor", summary)
    assert summary.num_runs_launched == 1 and summary.num_runs_failed == 0
    assert summary.checks_failed == []
    assert sum(name.startswith("training_manifest:") for name in summary.checks_passed) == 4
    assert len(instance.get_runs()) == 1


def test_the_ray_cluster_runs_the_steps_image_ray_release_and_state_volume():
    """The data plane's RayCluster must match the code location it serves: Ray refuses a client of
    another release, and work units are read and written by path on the shared state volume."""
    import tomllib

    cluster = yaml.safe_load((ROOT / "deploy/cluster/raycluster.yaml").read_text())
    values = yaml.safe_load((ROOT / "deploy/cluster/values.yaml").read_text())
    pinned = next(r for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["ray"]
                  if r.startswith("ray=="))
    assert (cluster["apiVersion"], cluster["kind"]) == ("ray.io/v1", "RayCluster")
    assert cluster["spec"]["rayVersion"] == pinned.removeprefix("ray==")
    deployment = values["dagster-user-deployments"]["deployments"][0]
    image = f"{deployment['image']['repository']}:{deployment['image']['tag']}"
    env = {e["name"]: e["value"] for e in deployment["env"]}
    state_mount = next(m["mountPath"] for m in deployment["volumeMounts"] if m["name"] == "ito-state")
    assert env["ITO_DATA_ENGINE"] == "ray" and env["ITO_STATE_DIR"] == state_mount
    assert env["RAY_ADDRESS"] == f"ray://{cluster['metadata']['name']}-head-svc.ito-training.svc:10001"
    pods = [cluster["spec"]["headGroupSpec"]["template"]] + [g["template"] for g in cluster["spec"]["workerGroupSpecs"]]
    for pod in pods:
        container = pod["spec"]["containers"][0]
        assert container["image"] == image
        assert {"name": "ito-state", "mountPath": state_mount} in container["volumeMounts"]
        assert {"name": "ito-state", "persistentVolumeClaim": {"claimName": "ito-state"}} in pod["spec"]["volumes"]
    assert 'pip install ".[cluster,ft,ray]"' in (ROOT / "deploy/Dockerfile").read_text()
