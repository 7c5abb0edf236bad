"""`training_launcher`: the plan's counts, the back end it names, and the settings the supervisor
receives through its JSON config."""

from __future__ import annotations

import dataclasses
import json

import pytest

from ito_assets.defs.training.launcher import TrainingLauncherResource
from ito_assets.launch.backend import BackendKind
from ito_assets.launch.kubernetes import KubernetesBackend
from ito_assets.launch.slurm import SlurmBackend
from ito_assets.launch.local import LocalBackend
from ito_assets.runtime.supervision.launch import backend_for
from ito_assets.runtime.supervision.supervisor import SupervisorConfig
from ito_assets.training.hardware import gpu_spec, network_spec
from ito_assets.training.planner import Hardware


def _hardware() -> Hardware:
    return Hardware(gpu=gpu_spec("H100-SXM"), network=network_spec("infiniband"), num_nodes=4, gpus_per_node=8,
                    price_cents_per_gpu_hour=250)


def test_remote_back_ends_take_the_plans_gpus_whatever_this_host_has():
    assert TrainingLauncherResource().counts(_hardware(), has_cuda=False) == (4, 1)  # a laptop or a test
    assert TrainingLauncherResource(backend="slurm").counts(_hardware(), has_cuda=False) == (4, 8)
    assert TrainingLauncherResource(backend="kubernetes").counts(_hardware(), has_cuda=False) == (4, 8)


@pytest.mark.parametrize(("resource", "kind", "backend_type"), [
    (TrainingLauncherResource(), BackendKind.LOCAL, LocalBackend),
    (TrainingLauncherResource(backend="slurm", slurm_partition="gpu", slurm_time_limit="1-00:00:00"),
     BackendKind.SLURM, SlurmBackend),
    (TrainingLauncherResource(backend="kubernetes", k8s_image="ito-training:0.1.0", k8s_volume_claim="ito-runs",
                              k8s_mount_path="/var/lib/ito", k8s_namespace="ito", k8s_active_deadline_s=86400,
                              k8s_ttl_after_finished_s=600, k8s_request_timeout_s=7.5),
     BackendKind.KUBERNETES, KubernetesBackend),
])
def test_the_chosen_back_end_reaches_the_supervisor_through_its_json_config(resource, kind, backend_type):
    config = dataclasses.replace(SupervisorConfig(nnodes=4, nproc_per_node=8), launch=resource.launch_config(8))
    received = SupervisorConfig.from_dict(json.loads(json.dumps(dataclasses.asdict(config))))
    assert received == config and received.launch.backend is kind
    assert isinstance(backend_for(received.launch), backend_type)
    settings = received.launch.slurm or received.launch.kubernetes
    assert settings is None or settings.gpus_per_node == 8  # one GPU per rank unless gpus_per_node says
    if kind is BackendKind.KUBERNETES:
        assert (settings.active_deadline_s, settings.ttl_after_finished_s, settings.request_timeout_s) == (86400, 600, 7.5)


def test_a_remote_back_end_without_its_settings_is_refused():
    with pytest.raises(ValueError, match="slurm_partition"):
        TrainingLauncherResource(backend="slurm").launch_config(8)
    with pytest.raises(ValueError, match="k8s_image"):
        TrainingLauncherResource(backend="kubernetes", k8s_volume_claim="c").launch_config(8)
    assert TrainingLauncherResource(backend="kubernetes", k8s_image="i", k8s_volume_claim="c", k8s_mount_path="/d",
                                    gpus_per_node=0).launch_config(1).kubernetes.gpus_per_node == 0
    with pytest.raises(ValueError, match="active_deadline_s"):
        TrainingLauncherResource(backend="kubernetes", k8s_image="i", k8s_volume_claim="c", k8s_mount_path="/d",
                                 k8s_active_deadline_s=0).launch_config(1)
