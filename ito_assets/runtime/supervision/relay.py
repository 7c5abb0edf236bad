"""Rank 0's metrics, relayed to Dagster by the supervisor when the ranks run remotely.

Under the local back end, rank 0 inherits the supervisor's Dagster Pipes channel and reports
through it. A rank on a Slurm or Kubernetes node does not: the channel is a file on the
supervisor's machine (sbatch is given an environment without it). There, rank 0 appends its
metrics and log lines to `metrics.jsonl` on the shared storage, and the supervisor, which runs
under Pipes, forwards each new line through its own channel at every poll and once at the end.
Only whole lines are read: a line being written is forwarded at the next poll. Relaying is
best effort: a line that does not parse is skipped and counted, and a channel that fails to
send loses those lines, never the supervision of the stage.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ito_assets.launch.backend import BackendKind
from ito_assets.runtime.worker.reporting import PIPES_CONTEXT_ENV_VAR, PipesReporter, Reporter


# Rank 0's lines are well under a kilobyte. A longer one is not its record (a torn or foreign
# write): it is skipped as it is read, never held whole, so a line of gigabytes without a newline
# costs the supervisor this much memory, not the line's size.
MAX_LINE_BYTES = 1 << 20


class MetricsRelay:
    """Lines appended to `path` from now on (a retried step does not relay its earlier runs')."""

    def __init__(self, path: Path, reporter: Reporter) -> None:
        self.path, self.reporter = path, reporter
        self.offset = path.stat().st_size if path.exists() else 0
        self.num_forwarded = self.num_skipped = 0
        self._in_long_line = False  # the offset lies inside a line too long to relay

    def forward(self) -> int:
        """Forward the whole lines appended since the last call -> how many."""
        try:
            handle = self.path.open("rb")
        except FileNotFoundError:  # rank 0 has not reported yet
            return 0
        forwarded = 0
        with handle:
            handle.seek(self.offset)
            while line := handle.readline(MAX_LINE_BYTES + 1):
                if not line.endswith(b"\n") and len(line) <= MAX_LINE_BYTES:
                    break  # being written: the next poll reads it whole
                self.offset += len(line)
                forwarded += self._line(line)
        self.num_forwarded += forwarded
        return forwarded

    def _line(self, line: bytes) -> int:
        """One line, or a piece of one too long to relay -> 1 when forwarded."""
        ended = line.endswith(b"\n")
        if self._in_long_line or not ended:
            self.num_skipped += 0 if self._in_long_line else 1
            self._in_long_line = not ended
            return 0
        if not line.strip():
            return 0
        try:
            self._forward(json.loads(line))
            return 1
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError):  # not a record rank 0 writes
            self.num_skipped += 1
        except OSError:  # the channel failed: the supervision goes on without it
            self.num_skipped += 1
        return 0

    def _forward(self, record: dict) -> None:
        if record["kind"] == "log":
            self.reporter.log(str(record.get("message", "")))
            return
        values = {k: v for k, v in record.items() if k not in ("kind", "step", "at")}
        self.reporter.metrics(int(record["step"]), values)


@contextmanager
def open_relay(backend: BackendKind, metrics_path: Path) -> Iterator[MetricsRelay | None]:
    """A relay through this process's Pipes channel when the ranks run remotely and this process
    runs under Pipes; None otherwise (rank 0 reports itself, or nobody listens)."""
    if backend is BackendKind.LOCAL or PIPES_CONTEXT_ENV_VAR not in os.environ:
        yield None
        return
    import dagster_pipes

    with dagster_pipes.open_dagster_pipes() as context:
        yield MetricsRelay(metrics_path, PipesReporter(context))
