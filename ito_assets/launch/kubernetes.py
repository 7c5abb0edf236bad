"""Kubernetes: one pod per node, each running the same torchrun command; a headless service
gives node 0's pod a stable name for the c10d rendezvous. The pods are started by Dagster Pipes'
Kubernetes client (dagster-k8s) from the Dagster layer; this module only renders them."""

from __future__ import annotations

import re

from ito_assets.launch.spec import LaunchSpec, torchrun_args

_MAX_NAME = 63  # a DNS-1123 label


def _name(spec: LaunchSpec, suffix: str = "") -> str:
    """`ito-<run id>` as a DNS-1123 label: lower case, '-' for '_', short enough for its suffix."""
    slug = re.sub(r"[^a-z0-9-]", "-", spec.run_id.lower())
    return f"ito-{slug}"[: _MAX_NAME - len(suffix)].rstrip("-") + suffix


def rendezvous_host(spec: LaunchSpec, namespace: str) -> str:
    return f"{_name(spec, '-node0')}.{_name(spec)}.{namespace}.svc"


def headless_service(spec: LaunchSpec, namespace: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": _name(spec), "namespace": namespace},
        "spec": {
            "clusterIP": "None",
            "selector": {"ito/run": spec.run_id},
            "ports": [{"name": "c10d", "port": spec.rdzv_port}],
        },
    }


def pod_specs(spec: LaunchSpec, *, image: str, namespace: str, gpus_per_node: int) -> list[dict]:
    endpoint = f"{rendezvous_host(spec, namespace)}:{spec.rdzv_port}"
    command = ["python", "-m", "torch.distributed.run", *torchrun_args(spec, rdzv_endpoint=endpoint)]
    resources = {"limits": {"nvidia.com/gpu": gpus_per_node}} if gpus_per_node else {}
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": _name(spec, f"-node{node}"),
                "namespace": namespace,
                "labels": {"ito/run": spec.run_id, "ito/node": str(node)},
            },
            "spec": {
                "hostname": _name(spec, f"-node{node}"),
                "subdomain": _name(spec),
                "restartPolicy": "Never",  # restarts are the supervisor's decision, not the kubelet's
                "containers": [
                    {
                        "name": "trainer",
                        "image": image,
                        "command": command,
                        "env": [{"name": k, "value": v} for k, v in spec.env],
                        "resources": resources,
                        "ports": [{"containerPort": spec.rdzv_port, "name": "c10d"}],
                    }
                ],
            },
        }
        for node in range(spec.nnodes)
    ]
