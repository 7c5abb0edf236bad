"""What an account's manifests have spent, and what a train would cost, before anyone confirms.

GET /v1/budgets: each manifest's budget (cap, spent, reserved, committed, left), from the query the
budget gate sums under its lock. POST /v1/quotes: a train priced by the very gate a confirmation
request runs, read-only: nothing is issued, nothing is created.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.routing import Route

from ito_assets.api.bodies import BudgetsQuery, QuoteBody, parse_query
from ito_assets.api.routes.common import Api, decode_b64, endpoint
from ito_assets.control import budget, confirm_request, intake
from ito_assets.control.identity import Identity


def budgets_of(api: Api, account_id: str, request: Request) -> dict:
    query = parse_query(BudgetsQuery, request.query_params.multi_items())
    with api.ledger.read() as conn:
        states = budget.states_for(conn, account_id, query.manifest_digest)
    return {"account_id": account_id, "budgets": [s.to_dict() for s in states], "num_budgets": len(states)}


def _budgets(api: Api, who: Identity, request: Request, _body: None) -> dict:
    return budgets_of(api, who.tenant, request)


def _quote(api: Api, who: Identity, _request: Request, body: QuoteBody) -> dict:
    verified = intake.verify_submitted(decode_b64(body.manifest_b64, "manifest_b64"), body.manifest_digest,
                                       max_bytes=api.policy.max_manifest_bytes)
    quote = confirm_request.quote_train(api.ledger, api.policy, who, body.booking_id, verified)
    return {**quote.to_dict(), "manifest_digest": verified.digest}


def routes(api: Api) -> list[Route]:
    return [
        Route("/v1/budgets", endpoint(api, _budgets), methods=["GET"]),
        Route("/v1/quotes", endpoint(api, _quote, body=QuoteBody), methods=["POST"]),
    ]
