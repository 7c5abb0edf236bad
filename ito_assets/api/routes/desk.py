"""The booking desk's routes: accounts, identity tokens, bookings and approvals. Desk tokens
only; an account token is refused, so no account can approve its own confirmation."""

from __future__ import annotations

from dataclasses import asdict

from starlette.requests import Request
from starlette.routing import Route

from ito_assets.api.routes.common import Api, endpoint, field
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.gates import bookings, confirmations, identity
from ito_assets.gates.bookings import AMENDABLE, BookingTerms
from ito_assets.gates.identity import Identity
from ito_assets.gates.states import Role

_TERMS = ("gpu_type", "num_gpus", "num_nodes", "topology", "region", "network", "starts_at", "ends_at",
          "price_per_gpu_hour_cents")


def desk_only(handler):
    def wrapped(api: Api, who: Identity, request: Request, body: dict) -> dict:
        who.require_role(Role.DESK)
        return handler(api, who, request, body)
    return wrapped


@desk_only
def _create_account(api: Api, who: Identity, _r: Request, body: dict) -> dict:
    account = identity.create_account(api.ledger, field(body, "name"), actor=who.token_id)
    return {"account_id": account.account_id, "name": account.name, "created_at": account.created_at}


@desk_only
def _list_accounts(api: Api, _who: Identity, _r: Request, _body: dict) -> dict:
    return {"accounts": [asdict(a) for a in identity.list_accounts(api.ledger)]}


@desk_only
def _issue_token(api: Api, who: Identity, _r: Request, body: dict) -> dict:
    try:
        role = Role(field(body, "role"))
    except ValueError:
        raise ItoError(ErrorCode.USAGE_ERROR, "field 'role' must be desk or account") from None
    issued = identity.issue_token(api.ledger, role, account_id=field(body, "account_id", required=False),
                                  label=field(body, "label", required=False) or "", actor=who.token_id)
    # The one answer that carries a secret: the desk client writes it to a 0600 file, never stdout.
    return {"token_id": issued.token_id, "role": role.value, "account_id": issued.account_id,
            "token": issued.secret}


@desk_only
def _revoke_token(api: Api, who: Identity, _r: Request, body: dict) -> dict:
    token_id = field(body, "token_id")
    changed = identity.revoke_token(api.ledger, token_id, actor=who.token_id)
    return {"token_id": token_id, "revoked": True, "already_revoked": not changed}


@desk_only
def _create_booking(api: Api, who: Identity, _r: Request, body: dict) -> dict:
    terms = BookingTerms(**{name: body.get(name) for name in _TERMS})
    return bookings.create(api.ledger, field(body, "account_id"), terms, actor=who.token_id).to_dict()


@desk_only
def _list_bookings(api: Api, _who: Identity, request: Request, _body: dict) -> dict:
    found = bookings.list_for(api.ledger, request.query_params.get("account_id"))
    return {"bookings": [b.to_dict() for b in found]}


def _transition(verb: str):
    @desk_only
    def handler(api: Api, who: Identity, request: Request, _body: dict) -> dict:
        return bookings.transition(api.ledger, request.path_params["booking_id"], verb, actor=who.token_id).to_dict()
    return handler


@desk_only
def _amend(api: Api, who: Identity, request: Request, body: dict) -> dict:
    changes = {k: v for k, v in body.items() if k in AMENDABLE and v is not None}
    if set(body) - set(AMENDABLE):
        raise ItoError(ErrorCode.USAGE_ERROR, f"an amendment changes one or more of: {', '.join(AMENDABLE)}")
    return bookings.amend(api.ledger, request.path_params["booking_id"], changes, actor=who.token_id).to_dict()


@desk_only
def _show(api: Api, _who: Identity, _r: Request, body: dict) -> dict:
    return confirmations.show(api.ledger, field(body, "confirmation_ref")).binding()


@desk_only
def _approve(api: Api, who: Identity, _r: Request, body: dict) -> dict:
    approved = confirmations.approve(api.ledger, field(body, "confirmation_ref"), approver_token_id=who.token_id,
                                     expected_cost_cents=field(body, "cost_cents", int),
                                     expected_digest=field(body, "manifest_digest", required=False))
    return {**approved.binding(), "approved_by": approved.approved_by, "approved_at": approved.approved_at}


def routes(api: Api) -> list[Route]:
    post = ["POST"]
    return [
        Route("/v1/desk/accounts", endpoint(api, _create_account, with_body=True), methods=post),
        Route("/v1/desk/accounts", endpoint(api, _list_accounts), methods=["GET"]),
        Route("/v1/desk/tokens", endpoint(api, _issue_token, with_body=True), methods=post),
        Route("/v1/desk/tokens/revoke", endpoint(api, _revoke_token, with_body=True), methods=post),
        Route("/v1/desk/bookings", endpoint(api, _create_booking, with_body=True), methods=post),
        Route("/v1/desk/bookings", endpoint(api, _list_bookings), methods=["GET"]),
        *[Route(f"/v1/desk/bookings/{{booking_id}}/{verb}", endpoint(api, _transition(verb), with_body=True),
                methods=post) for verb in ("complete", "revoke", "release")],
        Route("/v1/desk/bookings/{booking_id}/amend", endpoint(api, _amend, with_body=True), methods=post),
        Route("/v1/desk/confirmations/show", endpoint(api, _show, with_body=True), methods=post),
        Route("/v1/desk/confirmations/approve", endpoint(api, _approve, with_body=True), methods=post),
    ]
