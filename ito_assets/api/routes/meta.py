"""Unauthenticated facts about the server: liveness and which capabilities it serves."""

from __future__ import annotations

from starlette.requests import Request
from starlette.routing import Route

from ito_assets.api.routes.common import Api, endpoint
from ito_assets.control.capabilities import CAPABILITIES


def served_routes(route_list: list[Route]) -> set[str]:
    return {f"{method} {r.path}" for r in route_list for method in (r.methods or ()) if method != "HEAD"}


def routes(api: Api, served: set[str]) -> list[Route]:
    def health(_api: Api, _who, _request: Request, _body: dict) -> dict:
        return {"status": "ok"}

    def readiness(_api: Api, _who, _request: Request, _body: dict) -> dict:
        return {"capabilities": [{"name": c.name, "kind": c.kind, "route": c.route,
                                  "available": c.route in served} for c in CAPABILITIES]}

    return [
        Route("/v1/health", endpoint(api, health, public=True), methods=["GET"]),
        Route("/v1/readiness", endpoint(api, readiness, public=True), methods=["GET"]),
    ]
