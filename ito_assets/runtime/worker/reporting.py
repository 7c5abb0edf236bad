"""Where a worker's metrics and log lines go: Dagster Pipes on rank 0 when launched under Pipes,
a JSONL file on rank 0 otherwise, nowhere on other ranks (their figures are rank 0's: the
gradients are all-reduced)."""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Protocol

from ito_assets.runtime.record.storage import append_line

# What Dagster Pipes sets in a launched process's environment (dagster_pipes.DAGSTER_PIPES_CONTEXT_ENV_VAR).
PIPES_CONTEXT_ENV_VAR = "DAGSTER_PIPES_CONTEXT"


class Reporter(Protocol):
    def metrics(self, step: int, values: dict[str, Any]) -> None: ...

    def log(self, message: str) -> None: ...


class NullReporter:
    def metrics(self, step: int, values: dict[str, Any]) -> None:
        return None

    def log(self, message: str) -> None:
        return None


class JsonlReporter:
    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def metrics(self, step: int, values: dict[str, Any]) -> None:
        append_line(self.path, json.dumps({"kind": "metrics", "step": step, "at": time.time(), **values}), durable=False)

    def log(self, message: str) -> None:
        append_line(self.path, json.dumps({"kind": "log", "at": time.time(), "message": message}))


class PipesReporter:
    """Custom messages (one per metrics report) and log lines through the Pipes context."""

    def __init__(self, context: Any):
        self.context = context

    def metrics(self, step: int, values: dict[str, Any]) -> None:
        self.context.report_custom_message({"kind": "metrics", "step": step, **values})

    def log(self, message: str) -> None:
        self.context.log.info(message)


@contextmanager
def open_reporter(rank: int, metrics_path: Path, *, pipes: bool = True) -> Iterator[Reporter]:
    """`pipes=False`: the JSONL file even when launched under Pipes (a replica group other than 0)."""
    if rank != 0:
        yield NullReporter()
        return
    if not pipes or PIPES_CONTEXT_ENV_VAR not in os.environ:
        yield JsonlReporter(metrics_path)
        return
    import dagster_pipes  # the worker's only Dagster dependency: rank 0, under Pipes

    with dagster_pipes.open_dagster_pipes() as context:
        yield PipesReporter(context)
