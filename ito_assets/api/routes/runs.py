"""Runs: create (train), list, read by id or by idempotency key, logs, metrics, checkpoints,
cancel, and the tenant's cleanup. Every read is scoped to the calling account."""

from __future__ import annotations

from starlette.requests import Request
from starlette.routing import Route

from ito_assets.api.bodies import CancelBody, CleanupBody, PageQuery, RunsQuery, TrainBody, parse_query
from ito_assets.api.routes.common import Api, decode_b64, endpoint, require
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import budget, cancel, cleanup, create_run, idempotency, intake, runs, telemetry
from ito_assets.control.fingerprint import validate_key
from ito_assets.control.identity import Identity
from ito_assets.control.states import Action, RunState


def _run_data(run: runs.Run, replayed: bool) -> dict:
    return {**run.to_dict(), "replayed": replayed}


def _train(api: Api, who: Identity, _request: Request, body: TrainBody) -> dict:
    verified = intake.verify_submitted(decode_b64(body.manifest_b64, "manifest_b64"), body.manifest_digest,
                                       max_bytes=api.policy.max_manifest_bytes)
    request = create_run.TrainRequest(
        booking_id=body.booking_id, verified=verified,
        confirmation_ref=body.confirmation_ref, idempotency_key=body.idempotency_key,
    )
    created = create_run.create_run(api.ledger, api.policy, who, request)
    return _run_data(created.run, created.replayed)


def _get(api: Api, who: Identity, request: Request, _body: None) -> dict:
    """The run, with its manifest's budget as the budget gate sums it now."""
    run = runs.get(api.ledger, request.path_params["run_id"], account_id=who.tenant)
    with api.ledger.read() as conn:
        state = budget.state(conn, run.account_id, run.manifest_digest, budget.stored_budget(conn, run.manifest_digest))
    return {**_run_data(run, False), "budget": state.to_dict()}


def _list(api: Api, who: Identity, request: Request, _body: None) -> dict:
    query = parse_query(RunsQuery, request.query_params.multi_items())
    try:
        state = RunState(query.state) if query.state is not None else None
    except ValueError:
        raise ItoError(ErrorCode.USAGE_ERROR, "parameter 'state' is not a run state") from None
    page = runs.page_for(api.ledger, who.tenant, manifest_digest=query.manifest_digest,
                         booking_id=query.booking_id, state=state, after=query.after, limit=query.limit)
    items = [run.to_dict() for run in page.runs]
    return {"runs": items, "num_runs": len(items), "num_total": page.num_total,
            "next_after": items[-1]["run_id"] if page.more else None}


def _by_key(api: Api, who: Identity, request: Request, _body: None) -> dict:
    """What the first request under this key answered, for a client that lost that answer."""
    key = validate_key(request.path_params["key"], lookup=True)
    with api.ledger.read() as conn:
        record = idempotency.lookup(conn, who.tenant, key)
    if record is None:
        raise ItoError(ErrorCode.RUN_NOT_FOUND, "nothing was created with this idempotency key")
    fingerprint = record.fingerprint
    if record.action == Action.CLEANUP.value:
        data = {**(record.result or {}), "replayed": True}
        fingerprint = cleanup.answered_fingerprint(record, who.tenant)
    else:
        data = _run_data(runs.get(api.ledger, record.run_id, account_id=who.tenant), True)
    return {"action": record.action, "fingerprint": fingerprint, "result": data}


def _page_args(request: Request) -> tuple[int, int]:
    page = parse_query(PageQuery, request.query_params.multi_items())
    return page.after, page.limit


def _telemetry(reader, name: str):
    def handler(api: Api, who: Identity, request: Request, _body: None) -> dict:
        run = runs.get(api.ledger, request.path_params["run_id"], account_id=who.tenant)
        after, limit = _page_args(request)
        items = telemetry.as_dicts(reader(api.ledger, run.run_id, after=after, limit=limit))
        last = items[-1]["seq"] if items else after
        count = telemetry.page_count(api.ledger, name, run.run_id, last)
        # next_after is null on the last page, as on GET /v1/runs: a cursor means more is there.
        return {"run_id": run.run_id, "state": run.state.value, name: items, f"num_{name}": len(items),
                "num_total": count.num_total, "next_after": last if count.more else None}
    return handler


def _cancel(api: Api, who: Identity, request: Request, body: CancelBody) -> dict:
    result = cancel.cancel_run(api.ledger, who, request.path_params["run_id"],
                               confirmation_ref=body.confirmation_ref, idempotency_key=body.idempotency_key)
    return _run_data(result.run, result.replayed)


def _cleanup(api: Api, who: Identity, _request: Request, body: CleanupBody) -> dict:
    release = None
    if body.release_booking_id is not None:
        release = cleanup.Release(booking_id=body.release_booking_id,
                                  confirmation_ref=require(body, "release_confirmation_ref"))
    return cleanup.cleanup_tenant(api.ledger, api.policy, who, confirmation_ref=body.confirmation_ref,
                                  idempotency_key=body.idempotency_key, release=release)


def routes(api: Api) -> list[Route]:
    return [
        Route("/v1/runs", endpoint(api, _train, body=TrainBody), methods=["POST"]),
        Route("/v1/runs", endpoint(api, _list), methods=["GET"]),
        Route("/v1/runs/{run_id}", endpoint(api, _get), methods=["GET"]),
        Route("/v1/idempotency-keys/{key}", endpoint(api, _by_key), methods=["GET"]),
        Route("/v1/runs/{run_id}/logs", endpoint(api, _telemetry(telemetry.logs, "logs")), methods=["GET"]),
        Route("/v1/runs/{run_id}/metrics", endpoint(api, _telemetry(telemetry.metrics, "metrics")), methods=["GET"]),
        Route("/v1/runs/{run_id}/checkpoints", endpoint(api, _telemetry(telemetry.checkpoints, "checkpoints")),
              methods=["GET"]),
        Route("/v1/runs/{run_id}/cancel", endpoint(api, _cancel, body=CancelBody), methods=["POST"]),
        Route("/v1/cleanup", endpoint(api, _cleanup, body=CleanupBody), methods=["POST"]),
    ]
