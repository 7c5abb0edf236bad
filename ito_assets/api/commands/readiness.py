"""`ito readiness [--json]`: which gates and lifecycle operations are available, on this client
and (when it answers) on the API. `ito train` runs the client half before any credential is read.
"""

from __future__ import annotations

import argparse

from ito_assets.api.commands.result import VerbResult
from collections.abc import Collection

from ito_assets.errors import ErrorCode, ItoError

# The entry point stores the verbs it registered in every parse result under this name, so that a
# verb can list its siblings without importing the entry point (which imports every verb).
CLIENT_VERBS = "client_verbs"


def register(verbs: argparse._SubParsersAction) -> None:
    parser = verbs.add_parser("readiness", help="list each gate and lifecycle operation as available or missing")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.set_defaults(handler=_readiness)


def client_verbs(args: argparse.Namespace) -> set[str]:
    """The verbs of the parser that parsed `args` (none when it did not record them)."""
    return set(getattr(args, CLIENT_VERBS, ()))


def require_local_capabilities(verbs: Collection[str]) -> None:
    """Train fails closed, before any credential is resolved, while a gate or lifecycle operation
    is missing from this client (`verbs`: its verbs): a run it could not stop must not start."""
    from ito_assets.control.capabilities import missing

    absent = missing(set(verbs))
    if absent:
        raise ItoError(ErrorCode.CAPABILITY_MISSING, f"managed training is unavailable; missing: {', '.join(absent)}")


def _server_view(args: argparse.Namespace) -> tuple[dict[str, bool] | None, bool]:
    from ito_assets.api.client_config import connect

    client = connect(timeout_s=args.timeout, authenticated=False)
    try:
        data = client.get("/v1/readiness")
    except ItoError:
        return None, client.contacted
    return {c["name"]: bool(c.get("available")) for c in data.get("capabilities", [])}, True


def _readiness(args: argparse.Namespace) -> VerbResult:
    from ito_assets.control.capabilities import CAPABILITIES

    verbs = client_verbs(args)
    server, contacted = _server_view(args)
    rows = []
    for c in CAPABILITIES:
        api = None if server is None else server.get(c.name, False)
        available = c.client_verb in verbs and api is True
        rows.append({"name": c.name, "kind": c.kind, "client": c.client_verb in verbs,
                     "api": "unreachable" if api is None else api, "status": "available" if available else "missing"})
    ready = all(r["status"] == "available" for r in rows)
    notice = None if server is not None else "the API did not answer; its capabilities are unknown"
    text = [f"{r['kind']:<9} {r['name']:<18} {r['status']}" for r in rows]
    text.append("managed training: " + ("available" if ready else "unavailable"))
    return VerbResult(data={"ready": ready, "capabilities": rows}, live_api_contacted=contacted, notice=notice, text=text)
