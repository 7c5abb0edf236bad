"""The booking desk's routes: accounts, identity tokens, bookings, approvals of confirmations and
of the restarts that loss spikes propose. Desk tokens only; an account token is refused, so no
account can approve its own confirmation or restart its own run."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from starlette.requests import Request
from starlette.routing import Route

from ito_assets.api.bodies import (AccountBody, AmendBody, ApproveBody, BookingBody, BookingsQuery,
                                   ConfirmationRefBody, DecisionBody, EmptyBody, RevokeBody, TokenBody, parse_query)
from ito_assets.api.routes.budgets import budgets_of
from ito_assets.api.routes.common import Api, endpoint
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import audit, bookings, confirmations, identity, runs
from ito_assets.control.bookings import BookingTerms
from ito_assets.control.identity import Identity
from ito_assets.control.states import Role
from ito_assets.runtime.supervision import proposals
from ito_assets.runtime.record.storage import RunLayout

_TERMS = ("gpu_type", "num_gpus", "num_nodes", "topology", "region", "network", "starts_at", "ends_at",
          "price_per_gpu_hour_cents")


def desk_only(handler):
    def wrapped(api: Api, who: Identity, request: Request, body) -> dict:
        who.require_role(Role.DESK)
        return handler(api, who, request, body)
    return wrapped


@desk_only
def _create_account(api: Api, who: Identity, _r: Request, body: AccountBody) -> dict:
    account = identity.create_account(api.ledger, body.name, actor=who.token_id)
    return {"account_id": account.account_id, "name": account.name, "created_at": account.created_at}


@desk_only
def _list_accounts(api: Api, _who: Identity, _r: Request, _body: None) -> dict:
    return {"accounts": [asdict(a) for a in identity.list_accounts(api.ledger)]}


@desk_only
def _account_budgets(api: Api, _who: Identity, request: Request, _body: None) -> dict:
    return budgets_of(api, request.path_params["account_id"], request)


@desk_only
def _issue_token(api: Api, who: Identity, _r: Request, body: TokenBody) -> dict:
    try:
        role = Role(body.role)
    except ValueError:
        raise ItoError(ErrorCode.USAGE_ERROR, "field 'role' must be desk or account") from None
    issued = identity.issue_token(api.ledger, role, account_id=body.account_id, label=body.label or "",
                                  actor=who.token_id)
    # The one answer that carries a secret: the desk client writes it to a 0600 file, never stdout.
    return {"token_id": issued.token_id, "role": role.value, "account_id": issued.account_id,
            "token": issued.secret}


@desk_only
def _revoke_token(api: Api, who: Identity, _r: Request, body: RevokeBody) -> dict:
    token_id = body.token_id
    changed = identity.revoke_token(api.ledger, token_id, actor=who.token_id)
    return {"token_id": token_id, "revoked": True, "already_revoked": not changed}


@desk_only
def _create_booking(api: Api, who: Identity, _r: Request, body: BookingBody) -> dict:
    terms = BookingTerms(**{name: getattr(body, name) for name in _TERMS})
    return bookings.create(api.ledger, body.account_id, terms, actor=who.token_id).to_dict()


@desk_only
def _list_bookings(api: Api, _who: Identity, request: Request, _body: None) -> dict:
    query = parse_query(BookingsQuery, request.query_params.multi_items())
    found = bookings.list_for(api.ledger, query.account_id)
    return {"bookings": [b.to_dict() for b in found]}


def _transition(verb: str):
    @desk_only
    def handler(api: Api, who: Identity, request: Request, _body: EmptyBody) -> dict:
        return bookings.transition(api.ledger, request.path_params["booking_id"], verb, actor=who.token_id).to_dict()
    return handler


@desk_only
def _amend(api: Api, who: Identity, request: Request, body: AmendBody) -> dict:
    changes = body.model_dump(exclude_none=True)  # AmendBody's fields are AMENDABLE, no more
    return bookings.amend(api.ledger, request.path_params["booking_id"], changes, actor=who.token_id).to_dict()


@desk_only
def _show(api: Api, _who: Identity, _r: Request, body: ConfirmationRefBody) -> dict:
    return confirmations.show(api.ledger, body.confirmation_ref).binding()


@desk_only
def _approve(api: Api, who: Identity, _r: Request, body: ApproveBody) -> dict:
    approved = confirmations.approve(api.ledger, body.confirmation_ref, approver_token_id=who.token_id,
                                     expected_cost_cents=body.cost_cents, expected_digest=body.manifest_digest)
    return {**approved.binding(), "approved_by": approved.approved_by, "approved_at": approved.approved_at}


def _run_dir(api: Api, run_id: str) -> tuple[runs.Run, Path]:
    """The run's folder under the checkpoint area the server approved for it (shared storage: the
    workers write proposals there, the desk decides them there)."""
    run = runs.get(api.ledger, run_id)
    return run, RunLayout.for_run(Path(run.checkpoint_dir), run.run_id).run_dir


@desk_only
def _list_proposals(api: Api, _who: Identity, request: Request, _body: None) -> dict:
    run, run_dir = _run_dir(api, request.path_params["run_id"])
    found = [p.as_dict() for p in proposals.in_run(run_dir)]
    return {"run_id": run.run_id, "state": run.state.value, "proposals": found,
            "num_pending": sum(p["state"] == proposals.ProposalState.PENDING.value for p in found)}


@desk_only
def _decide_proposal(api: Api, who: Identity, request: Request, body: DecisionBody) -> dict:
    decision = body.decision
    if decision not in ("approve", "reject"):
        raise ItoError(ErrorCode.USAGE_ERROR, "field 'decision' must be approve or reject")
    run, run_dir = _run_dir(api, request.path_params["run_id"])
    decided = proposals.decide_in_run(run_dir, request.path_params["proposal_id"], approve=decision == "approve",
                                      actor=who.token_id)
    with api.ledger.write() as conn:
        audit.record(conn, api.ledger.now(), f"proposal.{decided.state.value}", actor=who.token_id,
                     account_id=run.account_id, subject=run.run_id, proposal_id=decided.proposal_id,
                     stage=decided.stage, restart_from_step=decided.restart_from_step,
                     skip_first=decided.skip_first, skip_end=decided.skip_end)
    return {"run_id": run.run_id, **decided.as_dict()}


def routes(api: Api) -> list[Route]:
    post = ["POST"]

    def desk(handler, body=None):
        # The role is checked from the token, before the body is read: an account token never
        # gets a desk route to buffer or parse anything it sends.
        return endpoint(api, handler, body=body, role=Role.DESK)

    return [
        Route("/v1/desk/accounts", desk(_create_account, AccountBody), methods=post),
        Route("/v1/desk/accounts", desk(_list_accounts), methods=["GET"]),
        Route("/v1/desk/tokens", desk(_issue_token, TokenBody), methods=post),
        Route("/v1/desk/tokens/revoke", desk(_revoke_token, RevokeBody), methods=post),
        Route("/v1/desk/bookings", desk(_create_booking, BookingBody), methods=post),
        Route("/v1/desk/bookings", desk(_list_bookings), methods=["GET"]),
        *[Route(f"/v1/desk/bookings/{{booking_id}}/{verb}", desk(_transition(verb), EmptyBody), methods=post)
          for verb in ("complete", "revoke", "release")],
        Route("/v1/desk/bookings/{booking_id}/amend", desk(_amend, AmendBody), methods=post),
        Route("/v1/desk/confirmations/show", desk(_show, ConfirmationRefBody), methods=post),
        Route("/v1/desk/confirmations/approve", desk(_approve, ApproveBody), methods=post),
        Route("/v1/desk/accounts/{account_id}/budgets", desk(_account_budgets), methods=["GET"]),
        Route("/v1/desk/runs/{run_id}/proposals", desk(_list_proposals), methods=["GET"]),
        Route("/v1/desk/runs/{run_id}/proposals/{proposal_id}", desk(_decide_proposal, DecisionBody), methods=post),
    ]
