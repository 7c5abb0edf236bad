"""Training runs in the ledger: read by the API, advanced by the Dagster shell.

The sensor polls `pending_runs`, launches the job with run key = run id, then calls
`attach_dagster_run`; the job and the sensor report progress through `set_state`. Every change
is one conditional UPDATE on the state it expects, so two daemons cannot both move a run.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields

import sqlalchemy as sa

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import audit
from ito_assets.control.ledger import Ledger, runs
from ito_assets.control.states import ACTIVE_RUN_STATES, RUN_TRANSITIONS, TERMINAL_RUN_STATES, RunState


@dataclass(frozen=True, kw_only=True)
class Run:
    run_id: str
    account_id: str
    booking_id: str
    manifest_digest: str
    idempotency_key: str
    request_fingerprint: str
    confirmation_id: str
    state: RunState
    state_reason: str | None
    dagster_run_id: str | None
    cost_cents: int
    checkpoint_dir: str
    created_at: int
    updated_at: int
    finished_at: int | None
    cleaned_at: int | None
    started_at: int | None  # when its first training stage launched (mark_training_started); None before

    def to_dict(self) -> dict:
        """The public view (train and status data): stable identifiers and the state enum. The
        checkpoint folder is a server path and stays out of it."""
        return {
            "run_id": self.run_id, "booking_id": self.booking_id, "manifest_sha256": self.manifest_digest,
            "idempotency_key": self.idempotency_key, "state": self.state.value,
            "state_reason": self.state_reason, "dagster_run_id": self.dagster_run_id,
            "cost_cents": self.cost_cents, "created_at": self.created_at, "updated_at": self.updated_at,
            "finished_at": self.finished_at, "cleaned_at": self.cleaned_at, "started_at": self.started_at,
            "terminal": self.state in TERMINAL_RUN_STATES,
        }


_COLUMNS = {f.name for f in fields(Run)}


def from_row(row) -> Run:
    values = {k: v for k, v in dict(row).items() if k in _COLUMNS}
    return Run(**{**values, "state": RunState(values["state"])})


def load(conn: sa.Connection, run_id: str, *, for_update: bool = False) -> Run | None:
    query = sa.select(runs).where(runs.c.run_id == run_id)
    row = conn.execute(query.with_for_update() if for_update else query).mappings().first()
    return None if row is None else from_row(row)


def get(ledger: Ledger, run_id: str, *, account_id: str | None = None) -> Run:
    """The run, or RUN_NOT_FOUND; another account's run is not found either."""
    with ledger.read() as conn:
        run = load(conn, run_id)
    if run is None or (account_id is not None and run.account_id != account_id):
        raise ItoError(ErrorCode.RUN_NOT_FOUND, "no such run for this account")
    return run


def by_key(ledger: Ledger, account_id: str, key: str) -> Run:
    with ledger.read() as conn:
        row = conn.execute(sa.select(runs).where(runs.c.account_id == account_id,
                                                 runs.c.idempotency_key == key)).mappings().first()
    if row is None:
        raise ItoError(ErrorCode.RUN_NOT_FOUND, "no run was created with this idempotency key")
    return from_row(row)


# A page of `ito runs list`: large enough for a desk's day, small enough for one answer.
MAX_PAGE = 500


@dataclass(frozen=True)
class RunPage:
    """One page of an account's runs, the runs the filters match in all, and whether any follow."""

    runs: list[Run]
    num_total: int
    more: bool


def list_for(ledger: Ledger, account_id: str, **filters) -> list[Run]:
    """An account's runs, oldest first, filtered; `after` is the last run id of the previous page."""
    return page_for(ledger, account_id, **filters).runs


def page_for(ledger: Ledger, account_id: str, *, manifest_digest: str | None = None,
             booking_id: str | None = None, state: RunState | None = None, after: str | None = None,
             limit: int = 100) -> RunPage:
    """`list_for`'s page with its counts: one row past the page tells whether more follow."""
    if not 1 <= limit <= MAX_PAGE:
        raise ItoError(ErrorCode.USAGE_ERROR, f"limit must be between 1 and {MAX_PAGE}")
    matching = [runs.c.account_id == account_id]
    for column, value in ((runs.c.manifest_digest, manifest_digest), (runs.c.booking_id, booking_id),
                          (runs.c.state, state.value if state else None)):
        if value is not None:
            matching.append(column == value)
    with ledger.read() as conn:
        total = conn.execute(sa.select(sa.func.count()).select_from(runs).where(*matching)).scalar_one()
        query = sa.select(runs).where(*matching)
        if after is not None:
            last = load(conn, after)
            if last is None or last.account_id != account_id:
                raise ItoError(ErrorCode.RUN_NOT_FOUND, "the page cursor names no run of this account")
            query = query.where(sa.tuple_(runs.c.created_at, runs.c.run_id) > (last.created_at, last.run_id))
        query = query.order_by(runs.c.created_at, runs.c.run_id).limit(limit + 1)
        found = [from_row(r) for r in conn.execute(query).mappings().all()]
    return RunPage(runs=found[:limit], num_total=int(total), more=len(found) > limit)


def count_active(conn: sa.Connection, booking_id: str) -> int:
    query = sa.select(sa.func.count()).select_from(runs).where(
        runs.c.booking_id == booking_id, runs.c.state.in_([s.value for s in ACTIVE_RUN_STATES]))
    return int(conn.execute(query).scalar_one())


def _listed(ledger: Ledger, where: list, order: sa.Column, after: Run | None, limit: int) -> list[Run]:
    """Up to `limit` runs matching `where`, by (`order`, run_id), those after `after` in that order
    (keyset paging: a row moved or removed between pages shifts no other)."""
    query = sa.select(runs).where(*where)
    if after is not None:
        mark = getattr(after, order.name)
        query = query.where(sa.or_(order > mark, sa.and_(order == mark, runs.c.run_id > after.run_id)))
    query = query.order_by(order, runs.c.run_id).limit(limit)
    with ledger.read() as conn:
        return [from_row(r) for r in conn.execute(query).mappings().all()]


def pending_runs(ledger: Ledger, *, after: Run | None = None, limit: int = 100) -> list[Run]:
    """Queued runs that no Dagster run has been launched for yet, oldest first (for the sensor)."""
    where = [runs.c.state == RunState.QUEUED.value, runs.c.dagster_run_id.is_(None)]
    return _listed(ledger, where, runs.c.created_at, after, limit)


def cancelling_runs(ledger: Ledger, *, after: Run | None = None, limit: int = 100) -> list[Run]:
    """Runs whose cancellation was confirmed and whose Dagster run must be terminated."""
    return _listed(ledger, [runs.c.state == RunState.CANCELLING.value], runs.c.updated_at, after, limit)


def launched_active_runs(ledger: Ledger, *, after: Run | None = None, limit: int = 100) -> list[Run]:
    """Runs a Dagster run was launched for that the ledger still holds as active: the sensor that
    reconciles them finds those whose Dagster run ended without being reported."""
    where = [runs.c.state.in_([s.value for s in ACTIVE_RUN_STATES]), runs.c.dagster_run_id.is_not(None)]
    return _listed(ledger, where, runs.c.updated_at, after, limit)


def each(lister, ledger: Ledger, *, page: int = 100) -> Iterator[Run]:
    """Every run `lister` (one of the three above) finds, a page at a time, each once: a sweep
    that read only the first page would never reach the runs behind a hundred long-lived ones.
    A run the caller changes between pages (a later updated_at) may come round again: it is skipped."""
    seen: set[str] = set()
    after = None
    while True:
        found = lister(ledger, after=after, limit=page)
        for run in found:
            if run.run_id not in seen:
                seen.add(run.run_id)
                yield run
        if len(found) < page:
            return
        after = found[-1]


def attach_dagster_run(ledger: Ledger, run_id: str, dagster_run_id: str) -> Run:
    """Record the Dagster run launched for `run_id`; idempotent for the same Dagster run id,
    refused (INTERNAL_ERROR) when another Dagster run was already attached, and (RUN_FINISHED) for
    a run that ended before any was (cancelled while queued): its audit trail must not say launched."""
    now = ledger.now()
    with ledger.write() as conn:
        run = load(conn, run_id, for_update=True)
        if run is None:
            raise ItoError(ErrorCode.RUN_NOT_FOUND, "no such run")
        if run.dagster_run_id is None and run.state in TERMINAL_RUN_STATES:
            raise ItoError(ErrorCode.RUN_FINISHED, f"the run already ended ({run.state.value}); nothing is launched for it")
        if run.dagster_run_id not in (None, dagster_run_id):
            raise ItoError(ErrorCode.INTERNAL_ERROR, "another Dagster run is already attached to this run")
        if run.dagster_run_id is None:
            conn.execute(runs.update().where(runs.c.run_id == run_id, runs.c.dagster_run_id.is_(None))
                         .values(dagster_run_id=dagster_run_id, updated_at=now))
            audit.record(conn, now, "run_launched", actor="dagster", account_id=run.account_id,
                         subject=run_id, dagster_run_id=dagster_run_id)
    return get(ledger, run_id)


def transition(conn: sa.Connection, run: Run, state: RunState, *, now: int, reason: str | None,
               actor: str | None) -> Run:
    """Move `run` to `state` inside the caller's transaction, if the state machine allows it."""
    if state not in RUN_TRANSITIONS[run.state]:
        raise ItoError(ErrorCode.USAGE_ERROR, f"a {run.state.value} run cannot become {state.value}")
    finished = now if state in TERMINAL_RUN_STATES else None
    changed = conn.execute(runs.update().where(runs.c.run_id == run.run_id, runs.c.state == run.state.value)
                           .values(state=state.value, state_reason=reason, updated_at=now,
                                   finished_at=finished)).rowcount
    if changed != 1:
        raise ItoError(ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT, "the run changed concurrently; retry")
    audit.record(conn, now, f"run_{state.value}", actor=actor, account_id=run.account_id,
                 subject=run.run_id, previous_state=run.state.value, reason=reason)
    return Run(**{**{f: getattr(run, f) for f in _COLUMNS}, "state": state, "state_reason": reason,
                  "updated_at": now, "finished_at": finished})


def mark_training_started(ledger: Ledger, run_id: str) -> Run:
    """Record that the run's compute is being spent: called as its first training stage launches
    (not when it becomes running: the data decision and plan gates still refuse after that). From
    then on its cost stays spent whatever its end (control/budget.py). Set once, never moved.

    A run that already ended unstarted is refused (RUN_FINISHED): its cost went back to the cap,
    which another run may have taken since, so starting it now would charge the cap twice."""
    now = ledger.now()
    with ledger.write() as conn:
        run = load(conn, run_id, for_update=True)
        if run is None:
            raise ItoError(ErrorCode.RUN_NOT_FOUND, "no such run")
        if run.started_at is not None:
            return run
        if run.state in TERMINAL_RUN_STATES:
            raise ItoError(ErrorCode.RUN_FINISHED, f"the run already ended ({run.state.value}); no stage may start")
        active = [s.value for s in ACTIVE_RUN_STATES]
        changed = conn.execute(runs.update().where(runs.c.run_id == run_id, runs.c.started_at.is_(None),
                                                   runs.c.state.in_(active)).values(started_at=now)).rowcount
        if changed != 1:
            raise ItoError(ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT, "the run changed concurrently; retry")
        audit.record(conn, now, "run_training_started", actor="dagster", account_id=run.account_id, subject=run_id)
        return Run(**{**{f: getattr(run, f) for f in _COLUMNS}, "started_at": now})


def set_state(ledger: Ledger, run_id: str, state: RunState, *, reason: str | None = None,
              actor: str = "dagster") -> Run:
    """The Dagster shell's one way to report progress (running, succeeded, failed, gate_failed,
    cancelled). Setting the state a run already has is a no-op, so a retried sensor tick is safe."""
    now = ledger.now()
    with ledger.write() as conn:
        run = load(conn, run_id, for_update=True)
        if run is None:
            raise ItoError(ErrorCode.RUN_NOT_FOUND, "no such run")
        if run.state is state:
            return run
        return transition(conn, run, state, now=now, reason=reason, actor=actor)


def manifest_bytes(ledger: Ledger, digest: str) -> bytes:
    """The exact manifest bytes a run was created from (content-addressed by digest, verified)."""
    from ito_assets.control import intake

    with ledger.read() as conn:
        return intake.stored(conn, digest).data
