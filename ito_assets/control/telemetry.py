"""What a run reports while it trains: its log, its metrics and its checkpoints.

The Dagster shell appends; the API reads, per account, paged by sequence number. Log messages
are redacted when written and again when read, so a credential that slipped into a message (a
stack trace with a URL, an environment dump) never leaves the ledger.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import sqlalchemy as sa

from ito_assets.control.ledger import Ledger, run_checkpoints, run_logs, run_metrics
from ito_assets.manifest.secrets import value_secret_kind

REDACTED = "[REDACTED]"
MAX_PAGE = 500  # bounds one answer's size; callers page with `after`
_MAX_MESSAGE = 4000
_WORD = re.compile(r"\S+")
_PEM = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)", re.S)
_BEARER = re.compile(r"(?i)\b(bearer|token)\s+\S+")


def redact(message: str) -> str:
    """Replace every word that looks like a credential (the manifest secret patterns)."""
    message = _PEM.sub(REDACTED, message[:_MAX_MESSAGE])
    message = _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", message)
    return _WORD.sub(lambda m: REDACTED if value_secret_kind(m.group(0)) else m.group(0), message)


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
    value: float
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


def append_log(ledger: Ledger, run_id: str, level: str, message: str, *, at: int | None = None) -> None:
    """One log line; `at` is when it happened (epoch seconds), now when the caller has no time."""
    with ledger.write() as conn:
        conn.execute(run_logs.insert().values(run_id=run_id, at=ledger.now() if at is None else at,
                                              level=level[:16], message=redact(message)))


def record_metric(ledger: Ledger, run_id: str, step: int, name: str, value: float) -> None:
    with ledger.write() as conn:
        conn.execute(run_metrics.insert().values(run_id=run_id, step=step, name=name[:128], value=float(value),
                                                 at=ledger.now()))


def record_checkpoint(ledger: Ledger, run_id: str, *, step: int, path: str, size_bytes: int,
                      sha256: str | None = None) -> None:
    with ledger.write() as conn:
        conn.execute(run_checkpoints.insert().values(run_id=run_id, step=step, path=path, sha256=sha256,
                                                     size_bytes=size_bytes, created_at=ledger.now()))


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
    return [Metric(seq=r["seq"], step=r["step"], name=r["name"], value=r["value"], at=r["at"])
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
            same_checkpoint: tuple[str, ...] = ("step", "path")) -> tuple[int, int]:
    """A finished stage's checkpoints and (step, name, value) metrics into the ledger, where `ito
    checkpoints` and `ito metrics` read them. A stage is published again when its step is retried,
    so what the run already has is skipped: a checkpoint equal in the `same_checkpoint` fields, a
    metric at the same (step, name) (the first value published stands). Returns (checkpoints
    added, metrics added)."""
    known_checkpoints = {tuple(getattr(c, f) for f in same_checkpoint) for c in every_page(checkpoints, ledger, run_id)}
    known_metrics = {(m.step, m.name) for m in every_page(metrics, ledger, run_id)}
    added_checkpoints = 0
    for checkpoint in finished:
        if tuple(getattr(checkpoint, f) for f in same_checkpoint) not in known_checkpoints:
            record_checkpoint(ledger, run_id, step=checkpoint.step, path=checkpoint.path,
                              size_bytes=checkpoint.size_bytes, sha256=checkpoint.sha256)
            added_checkpoints += 1
    fresh = [row for row in figures if (row[0], row[1]) not in known_metrics]
    for step, name, value in fresh:
        record_metric(ledger, run_id, step, name, value)
    return added_checkpoints, len(fresh)


def every_page(reader, ledger: Ledger, run_id: str) -> list:
    """All of a run's rows from one of the readers above (`logs`, `metrics`, `checkpoints`)."""
    rows, after = [], 0
    while page := reader(ledger, run_id, after=after, limit=MAX_PAGE):
        rows.extend(page)
        after = page[-1].seq
    return rows


def as_dicts(items: list) -> list[dict]:
    return [asdict(item) for item in items]
