"""Kubernetes: one pod per node, each running the same torchrun command; a headless service
gives node 0's pod a stable name for the c10d rendezvous. The pods are started by Dagster Pipes'
Kubernetes client (dagster-k8s) from the Dagster layer; this module only renders them."""

from __future__ import annotations

from ito_assets.launch.spec import LaunchSpec, torchrun_args


def rendezvous_host(spec: LaunchSpec, namespace: str) -> str:
    return f"ito-{spec.run_id}-node0.ito-{spec.run_id}.{namespace}.svc"


def headless_service(spec: LaunchSpec, namespace: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"ito-{spec.run_id}", "namespace": namespace},
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
                "name": f"ito-{spec.run_id}-node{node}",
                "namespace": namespace,
                "labels": {"ito/run": spec.run_id, "ito/node": str(node)},
            },
            "spec": {
                "hostname": f"ito-{spec.run_id}-node{node}",
                "subdomain": f"ito-{spec.run_id}",
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
