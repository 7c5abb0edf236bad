"""Per-tenant cleanup: removes the artifacts of the account's finished runs and reports exactly
what it removed. It never touches a booking unless a release was asked for with its own,
separately approved confirmation (action release, bound to that booking): an economic action
is never a side effect of cleanup.

The files are removed inside the transaction that consumes the confirmation and reserves the
key. Every run's folder is checked before any is removed: one that is a link or lies outside the
tenant's area refuses the whole cleanup with nothing removed. A finished run's folder that holds an
active run's checkpoint folder, or that cannot be removed whole (a folder the server may not
write), is kept and reported with its reason, the run left for a later cleanup; the other runs are
cleaned. If the commit fails after removal, a rerun finds nothing left to remove and records the
same runs as cleaned (removal is idempotent).
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import asdict, dataclass

import sqlalchemy as sa

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import audit, bookings, confirmations, entitlement, idempotency, ids
from ito_assets.control.fingerprint import cleanup_fingerprint, request_fingerprint, validate_key
from ito_assets.control.identity import Identity
from ito_assets.control.ledger import Ledger, bookings as bookings_table, run_checkpoints, runs
from ito_assets.control.policy import ServerPolicy
from ito_assets.control.states import ACTIVE_RUN_STATES, TERMINAL_RUN_STATES, Action, BookingState
from ito_assets.control.validation import inside


@dataclass(frozen=True)
class CleanedRun:
    run_id: str
    num_files_removed: int
    num_bytes_removed: int
    num_checkpoints_removed: int


@dataclass(frozen=True)
class KeptRun:
    """A finished run whose folder this cleanup left (in part or whole): why, and what it removed."""

    run_id: str
    reason: str
    num_files_removed: int
    num_bytes_removed: int


class _Tally:
    def __init__(self) -> None:
        self.num_files = self.num_bytes = 0

    def add(self, size: int) -> None:
        self.num_files += 1
        self.num_bytes += size


# A folder is opened by descriptor, never through a link, and never blocks (a FIFO is no folder).
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _empty_or_first_folder(fd: int, tally: _Tally) -> str | None:
    """Remove every entry of the open folder that is not a folder (a link is removed, never
    followed); the name of the first folder found, or None once the folder is empty."""
    with os.scandir(fd) as entries:
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    return entry.name
                size = entry.stat(follow_symlinks=False).st_size
                os.unlink(entry.name, dir_fd=fd)
            except FileNotFoundError:  # removed meanwhile by someone else: nothing left to do
                continue
            tally.add(size)
    return None


def _remove_tree(folder: str, tally: _Tally) -> None:
    """Remove `folder` and all below it. Iterative (a tree of any depth: shutil.rmtree recursed
    once per level and raised RecursionError past ~1,000), by descriptor (no path grows with the
    depth past PATH_MAX), never following a link nor crossing into another filesystem. Holds two
    descriptors at most: it climbs back by "..", checked to be the folder it came down from."""
    try:
        top = os.lstat(folder)
    except FileNotFoundError:  # removed meanwhile (another cleanup): nothing left to remove
        return
    if not stat.S_ISDIR(top.st_mode):  # a file, a FIFO or a socket where a folder was expected
        os.unlink(folder)
        tally.add(top.st_size)
        return
    fd = os.open(folder, _DIR_FLAGS)
    trail: list[tuple[str, int, int]] = []  # (name, its parent's st_dev, st_ino), from the top down
    try:
        while True:
            name = _empty_or_first_folder(fd, tally)
            if name is not None:
                here = os.fstat(fd)
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = child
                trail.append((name, here.st_dev, here.st_ino))
                if os.fstat(fd).st_dev != top.st_dev:
                    raise OSError(errno.EXDEV, "a folder below is another filesystem's mount point")
                continue
            if not trail:
                break
            name, dev, ino = trail.pop()
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            here = os.fstat(fd)
            if (here.st_dev, here.st_ino) != (dev, ino):
                raise OSError(errno.ESTALE, "a folder was moved while it was removed")
            os.rmdir(name, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(folder)


def _exists(folder: str) -> bool:
    try:
        os.lstat(folder)
    except (FileNotFoundError, NotADirectoryError):  # absent, or a file stands where a parent should
        return False
    return True


def _checked(run_id: str, folder: str, tenant_area: str) -> None:
    """A run's folder must be no link and lie inside the tenant's area (links resolved)."""
    if os.path.islink(folder) or not inside(folder, tenant_area):
        raise ItoError(ErrorCode.CHECKPOINT_STORAGE_INVALID,
                       f"the artifacts of {run_id} lie outside the tenant's area or behind a link; "
                       "nothing was removed")


def _remove_artifacts(folder: str, active_folders: list[str]) -> tuple[_Tally, str | None]:
    """Remove one run's (checked) folder; what was removed, and why the rest was kept, if it was."""
    tally = _Tally()
    if any(inside(active, folder) for active in active_folders):  # links resolved, both
        return tally, "holds the checkpoint folder of an active run; kept until that run ends"
    try:
        _remove_tree(folder, tally)
    except OSError as exc:  # a folder the server may not write, or one changed while it was removed
        return tally, f"could not be removed whole ({errno.errorcode.get(exc.errno, type(exc).__name__)}); " \
                      "kept for a later cleanup"
    return tally, None


@dataclass(frozen=True)
class Release:
    """A booking to release with this cleanup, and the reference of its own confirmation."""

    booking_id: str
    confirmation_ref: str

    def __repr__(self) -> str:  # the reference stays out of logs
        return f"Release(booking_id={self.booking_id!r})"


def _release_locked(conn: sa.Connection, ledger: Ledger, identity: Identity, release: Release, key: str) -> dict:
    booking = bookings.load(conn, release.booking_id, for_update=True) if ids.is_booking_id(release.booking_id) else None
    eligible = entitlement.eligibility(booking, identity.tenant, ledger.now(), require_started=False)  # needs no window
    confirmation = confirmations.resolve_bound(conn, release.confirmation_ref, account_id=identity.tenant,
                                               action=Action.RELEASE, booking_id=booking.booking_id)
    now = ledger.now()  # after the locks: a confirmation that expired while this waited is expired
    confirmations.require_usable(confirmation, now=now, action=Action.RELEASE, booking_id=booking.booking_id,
                                 cost_cents=0)
    entitlement.require_unchanged(confirmation.eligibility, eligible)
    active = conn.execute(sa.select(sa.func.count()).select_from(runs).where(
        runs.c.booking_id == booking.booking_id, runs.c.state.in_([s.value for s in ACTIVE_RUN_STATES]))).scalar_one()
    if active:
        raise ItoError(ErrorCode.CAPACITY_UNAVAILABLE, "the booking still has active runs; cancel them first",
                       retryable=False)
    confirmations.consume(conn, confirmation, now=now, run_id=None, key=key)
    conn.execute(bookings_table.update().where(bookings_table.c.booking_id == booking.booking_id)
                 .values(state=BookingState.RELEASED.value, updated_at=now))
    audit.record(conn, now, "booking_released", actor=identity.token_id, account_id=identity.tenant,
                 subject=booking.booking_id, confirmation_id=confirmation.confirmation_id, idempotency_key=key)
    return {"booking_id": booking.booking_id, "state": BookingState.RELEASED.value}


def _clean_locked(conn: sa.Connection, ledger: Ledger, policy: ServerPolicy, identity: Identity, ref: str,
                  key: str, release: Release | None) -> dict:
    account_id = identity.tenant
    release_booking_id = release.booking_id if release else None
    confirmation = confirmations.resolve_bound(conn, ref, account_id=account_id, action=Action.CLEANUP)
    # After the lock, before the confirmation is judged: a twin with this key that held the lock
    # has committed, and its report is the answer (its confirmation is consumed by now).
    replay = _replay_in(conn, account_id, key, release_booking_id)
    if replay is not None:
        return replay
    now = ledger.now()  # after the lock: a confirmation that expired while this waited is expired
    confirmations.require_usable(confirmation, now=now, action=Action.CLEANUP, cost_cents=0)
    changed = [_release_locked(conn, ledger, identity, release, key)] if release else []
    finished = conn.execute(sa.select(runs.c.run_id, runs.c.checkpoint_dir).where(
        runs.c.account_id == account_id, runs.c.cleaned_at.is_(None),
        runs.c.state.in_([s.value for s in TERMINAL_RUN_STATES])).order_by(runs.c.run_id).with_for_update()).all()
    area = str(policy.tenant_area(account_id))
    present = [(run_id, folder) for run_id, folder in finished if _exists(folder)]
    for run_id, folder in present:  # every folder checked before any is removed
        _checked(run_id, folder, area)
    active_folders = list(conn.execute(sa.select(runs.c.checkpoint_dir).where(
        runs.c.state.in_([s.value for s in ACTIVE_RUN_STATES]))).scalars()) if present else []
    # The deepest folder first: a run's folder inside another's is counted as its own run's.
    innermost_first = sorted(present, key=lambda item: -os.path.realpath(item[1]).count(os.sep))
    removed = {run_id: _remove_artifacts(folder, active_folders) for run_id, folder in innermost_first}
    cleaned, kept = [], []
    for run_id, _folder in finished:
        tally, reason = removed.get(run_id, (_Tally(), None))
        if reason is not None:
            kept.append(KeptRun(run_id, reason, tally.num_files, tally.num_bytes))
            continue
        num_checkpoints = conn.execute(run_checkpoints.update().where(
            run_checkpoints.c.run_id == run_id, run_checkpoints.c.removed_at.is_(None)).values(removed_at=now)).rowcount
        conn.execute(runs.update().where(runs.c.run_id == run_id).values(cleaned_at=now, updated_at=now))
        cleaned.append(CleanedRun(run_id, tally.num_files, tally.num_bytes, num_checkpoints))
    report = {
        "account_id": account_id, "idempotency_key": key, "num_runs_cleaned": len(cleaned),
        "num_bytes_removed": sum(c.num_bytes_removed for c in cleaned) + sum(k.num_bytes_removed for k in kept),
        "runs": [asdict(c) for c in cleaned], "runs_kept": [asdict(k) for k in kept],
        "bookings_changed": changed, "cleaned_at": now,
    }
    confirmations.consume(conn, confirmation, now=now, run_id=None, key=key)
    idempotency.reserve(conn, account_id=account_id, key=key, action=Action.CLEANUP.value,
                        fingerprint=cleanup_fingerprint(release_booking_id), run_id=None, now=now, result=report)
    audit.record(conn, now, "tenant_cleaned", actor=identity.token_id, account_id=account_id,
                 subject=account_id, confirmation_id=confirmation.confirmation_id, idempotency_key=key,
                 num_runs_cleaned=len(cleaned), run_ids=[c.run_id for c in cleaned],
                 **({"kept_run_ids": [k.run_id for k in kept]} if kept else {}))
    return {**report, "replayed": False}


def _account_bound(account_id: str, release_booking_id: str | None) -> str:
    """The fingerprint cleanup keys were recorded with before it left the account out (the client
    cannot compute it); such a key is still the same request."""
    return request_fingerprint(Action.CLEANUP.value, account_id=account_id, release_booking_id=release_booking_id)


def answered_fingerprint(record: idempotency.KeyRecord, account_id: str) -> str:
    """A cleanup key's fingerprint as the client computes it (`cleanup_fingerprint`), for the
    lookup by key: an account-bound one is matched against no release and against the bookings its
    report released."""
    released = [change["booking_id"] for change in (record.result or {}).get("bookings_changed", [])]
    for booking_id in [None, *released]:
        if record.fingerprint == _account_bound(account_id, booking_id):
            return cleanup_fingerprint(booking_id)
    return record.fingerprint


def _replay_in(conn: sa.Connection, account_id: str, key: str, release_booking_id: str | None) -> dict | None:
    record = idempotency.lookup(conn, account_id, key)
    if record is None:
        return None
    earlier = _account_bound(account_id, release_booking_id)
    fingerprint = earlier if record.fingerprint == earlier else cleanup_fingerprint(release_booking_id)
    idempotency.require_same_request(record, Action.CLEANUP.value, fingerprint)
    return {**(record.result or {}), "replayed": True}


def _replay(ledger: Ledger, account_id: str, key: str, release_booking_id: str | None) -> dict | None:
    with ledger.read() as conn:
        return _replay_in(conn, account_id, key, release_booking_id)


def _record_refusal(ledger: Ledger, identity: Identity, key: str, release: Release | None, error: ItoError) -> None:
    """A refused cleanup leaves its own audit event (the code, the key, a release's booking when its
    id has the ledger's form); never for a busy ledger, and a failed write never changes the answer."""
    if error.code is ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT:
        return
    booking_id = release.booking_id if release and ids.is_booking_id(release.booking_id) else None
    try:
        audit.record_refusal(ledger, "tenant_cleanup_refused", error.code.value, actor=identity.token_id,
                             account_id=identity.tenant, subject=identity.tenant, idempotency_key=key,
                             release_booking_id=booking_id)
    except sa.exc.SQLAlchemyError:
        pass


def cleanup_tenant(ledger: Ledger, policy: ServerPolicy, identity: Identity, *, confirmation_ref: str,
                   idempotency_key: str, release: Release | None = None) -> dict:
    """Returns the cleanup report (with `replayed`); replays the first report for the same key."""
    key = validate_key(idempotency_key)
    try:
        return _cleanup(ledger, policy, identity, confirmation_ref, key, release)
    except ItoError as error:
        _record_refusal(ledger, identity, key, release, error)
        raise


def _cleanup(ledger: Ledger, policy: ServerPolicy, identity: Identity, confirmation_ref: str, key: str,
             release: Release | None) -> dict:
    account_id = identity.tenant
    release_booking_id = release.booking_id if release else None
    replay = _replay(ledger, account_id, key, release_booking_id)
    if replay is not None:
        return replay
    try:
        with ledger.write() as conn:
            return _clean_locked(conn, ledger, policy, identity, confirmation_ref, key, release)
    except (sa.exc.IntegrityError, sa.exc.OperationalError) as exc:
        if isinstance(exc, sa.exc.OperationalError) and not idempotency.is_lock_timeout(exc):
            raise
        replay = _replay(ledger, account_id, key, release_booking_id)
        if replay is None:
            raise idempotency.in_flight() from None
        return replay
