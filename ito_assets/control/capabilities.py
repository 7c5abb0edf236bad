"""The gates and lifecycle operations that must exist before managed training is available.

Stdlib only: `ito train` checks them before it resolves any credential. Each capability names
the client verb and the API route that implement it; readiness is "available" only when both
exist; until then train fails closed (a run nobody could follow or stop must not start).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Capability:
    name: str
    kind: str  # "gate" or "lifecycle"
    client_verb: str
    route: str  # "METHOD /path" on the canonical API


CAPABILITIES: tuple[Capability, ...] = (
    Capability("entitlement", "gate", "confirm", "POST /v1/confirmations"),
    Capability("manifest_digest", "gate", "train", "POST /v1/runs"),
    Capability("confirmation", "gate", "confirm", "POST /v1/confirmations"),
    Capability("idempotency", "gate", "train", "GET /v1/idempotency-keys/{key}"),
    Capability("server_validation", "gate", "train", "POST /v1/runs"),
    Capability("status", "lifecycle", "status", "GET /v1/runs/{run_id}"),
    Capability("logs", "lifecycle", "logs", "GET /v1/runs/{run_id}/logs"),
    Capability("metrics", "lifecycle", "metrics", "GET /v1/runs/{run_id}/metrics"),
    Capability("checkpoints", "lifecycle", "checkpoints", "GET /v1/runs/{run_id}/checkpoints"),
    Capability("cancel", "lifecycle", "cancel", "POST /v1/runs/{run_id}/cancel"),
    Capability("cleanup", "lifecycle", "cleanup", "POST /v1/cleanup"),
)


def missing(available_verbs: set[str], available_routes: set[str] | None = None) -> list[str]:
    """Names of the capabilities whose client verb (or, when given, API route) is absent."""
    return [c.name for c in CAPABILITIES
            if c.client_verb not in available_verbs
            or (available_routes is not None and c.route not in available_routes)]
