"""What a run reports while it trains: its log, its metrics and its checkpoints.

The Dagster shell appends; the API reads, per account, paged by sequence number. Log messages
are redacted when written and again when read, so a credential that slipped into a message (a
stack trace with a URL, an environment dump) never leaves the ledger.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import sqlalchemy as sa

from ito_assets.control.ledger import Ledger, run_checkpoints, run_logs, run_metrics
from ito_assets.manifest.secrets import REDACTED, assigned_credentials, value_secret_kind

MAX_PAGE = 500  # bounds one answer's size; callers page with `after`
_BIGINT = (-(2**63), 2**63 - 1)  # the step column's range, on SQLite and PostgreSQL
_MAX_MESSAGE = 4000
_CUT = " [CUT]"  # ends a message cut at _MAX_MESSAGE, so a reader knows the line went on
_WORD = re.compile(r"\S+")
# A terminal's colour and cursor codes: a name between two of them (\x1b[33mHF_TOKEN\x1b[0m=...)
# would be no name to the secret scan; the ledger keeps the text without them.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_PEM = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)", re.S)
# A bearer credential: after "Bearer" any word, after "token" one of a token's length (the secret
# scan's `bearer_token`), not the word of a sentence ("the token is invalid").
_BEARER = re.compile(r"(?i)\b(bearer\s+|token\s+(?=[A-Za-z0-9._~+/-]{16}))\S+")


def _bounded(message: str) -> str:
    """At most _MAX_MESSAGE characters. A cut inside a word drops that word whole: the first half
    of a token matches no secret pattern, and a credential's prefix is already too much to show."""
    if len(message) <= _MAX_MESSAGE:
        return message
    end = _MAX_MESSAGE - len(_CUT)
    while end and not (message[end].isspace() or message[end - 1].isspace()):
        end -= 1  # a loop, not a regex: a regex anchored at the end rescans each long word
    return message[:end] + _CUT  # within _MAX_MESSAGE, so redacting again on read cuts nothing


def _hide_assigned(message: str) -> str:
    """The values assigned to a credential's name (`PGPASSWORD=...`, `"api_key": "..."`), hidden,
    their names kept: a reader sees which credential leaked, never what it was."""
    out, start = [], 0
    for begin, end in assigned_credentials(message):
        out += [message[start:begin], REDACTED]
        start = end
    return "".join(out) + message[start:]


def redact(message: str) -> str:
    """Replace every word that looks like a credential (the manifest secret patterns), and every
    value assigned to a credential's name."""
    message = _PEM.sub(REDACTED, _bounded(_ANSI.sub("", message)))
    message = _BEARER.sub(lambda m: f"{m.group(1)}{REDACTED}", message)
    message = _hide_assigned(message)
    message = _WORD.sub(lambda m: REDACTED if value_secret_kind(m.group(0)) else m.group(0), message)
    # Bounded again: a hidden value may be longer than it was, and redacting on read must cut nothing.
    return _bounded(message)


@dataclass(frozen=True)
class LogLine:
    seq: int
    at: int
    level: str
    message: str


@dataclass(frozen=True)
class Metric:
    seq: int
    step: int
    name: str
    value: float | None  # None: not a finite number (a row stored before such values were refused)
    at: int


@dataclass(frozen=True)
class Checkpoint:
    seq: int
    step: int
    path: str
    sha256: str | None
    size_bytes: int
    created_at: int
    removed_at: int | None


def storable(text: str) -> str:
    """`text` as every ledger stores it. A message decoded from a process's bytes may hold lone
    surrogates (Python's surrogateescape for bytes that are not UTF-8), which no UTF-8 column
    takes, and PostgreSQL refuses NUL in text: either would fail the insert, and with it the
    copy of a run's log that precedes recording how the run ended. Both become visible escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


def append_log(ledger: Ledger, run_id: str, level: str, message: str, *, at: int | None = None) -> None:
    """One log line; `at` is when it happened (epoch seconds), now when the caller has no time."""
    with ledger.write() as conn:
        conn.execute(run_logs.insert().values(run_id=run_id, at=ledger.now() if at is None else at,
                                              level=storable(level[:16]), message=redact(storable(message))))


def finite(value: float) -> float | None:
    """`value` as a float, or None when it is not a finite one (NaN, an infinity, an int past float)."""
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _shown(value: float) -> str:
    try:
        return repr(float(value))  # nan, inf, -inf
    except OverflowError:  # repr of the int itself may be refused (past Python's digit limit)
        return "an integer past a float's range"


def record_metric(ledger: Ledger, run_id: str, step: int, name: str, value: float) -> bool:
    """Stores a finite value; returns False for one that is not (a diverged loss), which is not
    stored but logged: the ledger's figures go out as strict JSON, where NaN and Infinity do not
    exist, and are summed into the desk's quotes (control/history), which one infinity would void."""
    return record_metrics(ledger, run_id, [(step, name, value)]) == 1


def metric_name(name: str) -> str:
    """A metric's name as the ledger stores it: escaped (`storable`), then cut to the column's
    128 characters (an escape lengthens it; cut first, an escaped name could overflow the column)."""
    return storable(name)[:128]


def record_metrics(ledger: Ledger, run_id: str, rows: Iterable[tuple[int, str, float]]) -> int:
    """`record_metric` for many (step, name, value) rows, stored in one transaction: figures
    computed together (a run's telemetry) are never half stored. Returns how many were stored."""
    stored = []
    for step, name, value in rows:
        number = finite(value)
        if not _in_step_range(step):
            # Not shown: an int of 5,000 digits has no decimal form within Python's limit.
            append_log(ledger, run_id, "warning", f"metric {name} at a step past the ledger's range (a 64-bit "
                                                  "integer); not recorded")
        elif number is None:
            append_log(ledger, run_id, "warning", f"metric {name} at step {step} is not a finite number "
                                                  f"({_shown(value)}); not recorded")
        else:
            stored.append({"run_id": run_id, "step": operator.index(step), "name": metric_name(name), "value": number})
    if stored:
        with ledger.write() as conn:
            now = ledger.now()
            conn.execute(run_metrics.insert(), [{**row, "at": now} for row in stored])
    return len(stored)


def _in_step_range(step: object) -> bool:
    try:
        return _BIGINT[0] <= operator.index(step) <= _BIGINT[1]  # numpy's integers too
    except TypeError:
        return False


def record_checkpoint(ledger: Ledger, run_id: str, *, step: int, path: str, size_bytes: int,
                      sha256: str | None = None) -> None:
    """A checkpoint of the run, listed by `ito checkpoints`. Where its digest is known, the run's
    earlier rows of the same path that name other bytes are marked removed at once: a save that
    replaced them (a step saved again after a restart rewound past it) left them nowhere."""
    with ledger.write() as conn:
        now = ledger.now()
        if sha256 is not None:
            c = run_checkpoints.c
            conn.execute(run_checkpoints.update().where(
                c.run_id == run_id, c.path == path, c.removed_at.is_(None), sa.or_(c.sha256.is_(None), c.sha256 != sha256),
            ).values(removed_at=now))
        conn.execute(run_checkpoints.insert().values(run_id=run_id, step=step, path=path, sha256=sha256,
                                                     size_bytes=size_bytes, created_at=now))


def _page(ledger: Ledger, table: sa.Table, run_id: str, after: int, limit: int) -> list:
    limit = max(1, min(limit, MAX_PAGE))
    query = (sa.select(table).where(table.c.run_id == run_id, table.c.seq > after)
             .order_by(table.c.seq).limit(limit))
    with ledger.read() as conn:
        return conn.execute(query).mappings().all()


@dataclass(frozen=True)
class PageCount:
    """What one page leaves out: the run's entries in all, and whether any come after the page."""

    num_total: int
    more: bool


_TABLES = {"logs": run_logs, "metrics": run_metrics, "checkpoints": run_checkpoints}


def page_count(ledger: Ledger, name: str, run_id: str, last_seq: int) -> PageCount:
    """Counted on the run_id index, so a page's answer can say how much is left."""
    table = _TABLES[name]
    mine = table.c.run_id == run_id
    with ledger.read() as conn:
        total = conn.execute(sa.select(sa.func.count()).select_from(table).where(mine)).scalar_one()
        later = conn.execute(sa.select(table.c.seq).where(mine, table.c.seq > last_seq).limit(1)).first()
    return PageCount(num_total=int(total), more=later is not None)


def logs(ledger: Ledger, run_id: str, *, after: int = 0, limit: int = 100) -> list[LogLine]:
    return [LogLine(seq=r["seq"], at=r["at"], level=r["level"], message=redact(r["message"]))
            for r in _page(ledger, run_logs, run_id, after, limit)]


def metrics(ledger: Ledger, run_id: str, *, after: int = 0, limit: int = 100) -> list[Metric]:
    # finite(): PostgreSQL holds NaN and infinities, SQLite infinities, and one such row must not
    # turn the whole listing into an error (strict JSON has no word for them)
    return [Metric(seq=r["seq"], step=r["step"], name=r["name"], value=None if r["value"] is None else finite(r["value"]),
                 at=r["at"])
            for r in _page(ledger, run_metrics, run_id, after, limit)]


def checkpoints(ledger: Ledger, run_id: str, *, after: int = 0, limit: int = 100) -> list[Checkpoint]:
    return [Checkpoint(**{k: r[k] for k in ("seq", "step", "path", "sha256", "size_bytes", "created_at", "removed_at")})
            for r in _page(ledger, run_checkpoints, run_id, after, limit)]


@dataclass(frozen=True)
class FinishedCheckpoint:
    """A checkpoint a finished stage hands to `publish`."""

    step: int
    path: str
    size_bytes: int
    sha256: str | None = None


def publish(ledger: Ledger, run_id: str, finished: Iterable[FinishedCheckpoint],
            figures: Iterable[tuple[int, str, float]], *,
            same_checkpoint: tuple[str, ...] = ("step", "path"), revised: bool = False) -> tuple[int, int]:
    """A finished stage's checkpoints and (step, name, value) metrics into the ledger, where `ito
    checkpoints` and `ito metrics` read them. A stage is published again when its step is retried,
    so what the run already has is skipped: a checkpoint equal in the `same_checkpoint` fields, a
    metric at the same (step, name) (the first value published stands). `revised`: figures
    computed again from the whole record (the run's telemetry): a value other than the last one
    stored at its (step, name) is added beside it, and the last one stands (the ledger keeps
    both). Returns (checkpoints added, metrics added)."""
    known_checkpoints = {tuple(getattr(c, f) for f in same_checkpoint) for c in every_page(checkpoints, ledger, run_id)}
    known_metrics: dict[tuple[int, str], float] = {}
    for metric in every_page(metrics, ledger, run_id):  # in the order stored: the last one stands
        known_metrics[(metric.step, metric.name)] = metric.value
    added_checkpoints = 0
    for checkpoint in finished:
        if tuple(getattr(checkpoint, f) for f in same_checkpoint) not in known_checkpoints:
            record_checkpoint(ledger, run_id, step=checkpoint.step, path=checkpoint.path,
                              size_bytes=checkpoint.size_bytes, sha256=checkpoint.sha256)
            added_checkpoints += 1
    keyed = [((step, metric_name(name)), (step, name, value)) for step, name, value in figures]  # as stored
    fresh = [row for key, row in keyed if key not in known_metrics or revised and known_metrics[key] != finite(row[2])]
    added_metrics = record_metrics(ledger, run_id, fresh)
    return added_checkpoints, added_metrics


def every_page(reader, ledger: Ledger, run_id: str) -> list:
    """All of a run's rows from one of the readers above (`logs`, `metrics`, `checkpoints`)."""
    rows, after = [], 0
    while page := reader(ledger, run_id, after=after, limit=MAX_PAGE):
        rows.extend(page)
        after = page[-1].seq
    return rows


def as_dicts(items: list) -> list[dict]:
    return [asdict(item) for item in items]
