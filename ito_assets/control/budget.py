"""A manifest's budget: what its runs have committed against its cap, and the lock that keeps
concurrent trains from both fitting under it.

The cap belongs to the manifest (its digest binds `budget.cap_cents`) and is shared by every
booking the account trains it on, so the lock is the (account, manifest) row of `budgets`, not a
booking's row. A run commits its confirmed cost when it is created: it is `reserved` while active
and `spent` once it ended, whatever its end, if its training started. A run that ended before any
stage launched (`started_at` unset: cancelled while queued, refused by its authorization, the data
decision or the plan, failed before training) used no compute and gives its cost back. A run that
trained and then ended otherwise than by succeeding (an eval gate, a booking revoked between
stages, a cancellation, a fault) keeps its cost spent: the cap bounds what was trained on.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import sqlalchemy as sa

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control.bookings import require_account
from ito_assets.control.ledger import budgets, insert_if_absent, runs
from ito_assets.control.states import ACTIVE_RUN_STATES, TERMINAL_RUN_STATES
from ito_assets.manifest.schema import Budget


@dataclass(frozen=True, kw_only=True)
class BudgetState:
    manifest_digest: str
    cap_cents: int
    max_incremental_cents: int
    spent_cents: int  # runs that ended after their training started
    reserved_cents: int  # runs still active (queued, running, cancelling)
    num_runs: int

    @property
    def committed_cents(self) -> int:
        return self.spent_cents + self.reserved_cents

    @property
    def left_cents(self) -> int:
        return self.cap_cents - self.committed_cents

    def to_dict(self) -> dict:
        return {**asdict(self), "committed_cents": self.committed_cents, "left_cents": self.left_cents}


def lock(conn: sa.Connection, account_id: str, manifest_digest: str, *, now: int) -> None:
    """Take the (account, manifest) budget lock for the rest of the caller's write transaction.

    PostgreSQL: the row is created if absent, then locked FOR UPDATE, so a second train of the
    same manifest waits here until the first commits and then sees its run. SQLite: BEGIN
    IMMEDIATE already made this transaction the only writer; the row is kept for symmetry."""
    insert_if_absent(conn, budgets, dict(account_id=account_id, manifest_digest=manifest_digest, created_at=now))
    conn.execute(sa.select(budgets.c.account_id).where(
        budgets.c.account_id == account_id, budgets.c.manifest_digest == manifest_digest).with_for_update())


def committed(conn: sa.Connection, account_id: str, manifest_digest: str) -> tuple[int, int, int]:
    """(spent, reserved, number of runs) of this account's runs of this manifest, in one query.

    A run that ended before its training started (no `started_at`) is left out."""
    active = runs.c.state.in_([s.value for s in ACTIVE_RUN_STATES])
    ended_unstarted = sa.and_(runs.c.state.in_([s.value for s in TERMINAL_RUN_STATES]), runs.c.started_at.is_(None))
    query = sa.select(
        sa.func.coalesce(sa.func.sum(sa.case((active, 0), else_=runs.c.cost_cents)), 0),
        sa.func.coalesce(sa.func.sum(sa.case((active, runs.c.cost_cents), else_=0)), 0),
        sa.func.count(),
    ).where(runs.c.account_id == account_id, runs.c.manifest_digest == manifest_digest,
            sa.not_(ended_unstarted))
    spent, reserved, count = conn.execute(query).one()
    return int(spent), int(reserved), int(count)


def state(conn: sa.Connection, account_id: str, manifest_digest: str, budget: Budget) -> BudgetState:
    spent, reserved, count = committed(conn, account_id, manifest_digest)
    return BudgetState(manifest_digest=manifest_digest, cap_cents=budget.cap_cents,
                       max_incremental_cents=budget.max_incremental_cents, spent_cents=spent,
                       reserved_cents=reserved, num_runs=count)


def stored_budget(conn: sa.Connection, manifest_digest: str) -> Budget:
    """The budget of a manifest the ledger stored when a run was created from it: its cap is read
    from the very bytes that were confirmed, never from a file that may have changed since."""
    from ito_assets.control import intake
    from ito_assets.manifest.verify import parse_manifest

    content = intake.stored_content(conn, manifest_digest)
    if content is None:
        raise ItoError(ErrorCode.RUN_NOT_FOUND, "no run of this account was created from this manifest")
    return parse_manifest(intake.verify_stored(content, manifest_digest)).budget


def states_for(conn: sa.Connection, account_id: str, manifest_digest: str | None = None) -> list[BudgetState]:
    """The budget of every manifest the account created runs from (or of the one named), by digest.
    ACCOUNT_NOT_FOUND for an account that does not exist: no budget would read as one that spent nothing."""
    require_account(conn, account_id)
    query = sa.select(runs.c.manifest_digest).where(runs.c.account_id == account_id).distinct()
    if manifest_digest is not None:
        query = query.where(runs.c.manifest_digest == manifest_digest)
    digests = sorted(conn.execute(query).scalars())
    if manifest_digest is not None and not digests:
        raise ItoError(ErrorCode.RUN_NOT_FOUND, "no run of this account was created from this manifest")
    return [state(conn, account_id, digest, stored_budget(conn, digest)) for digest in digests]
