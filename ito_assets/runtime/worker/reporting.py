"""Where a worker's metrics and log lines go: Dagster Pipes on rank 0 when launched under Pipes,
a JSONL file on rank 0 otherwise, nowhere on other ranks (their figures are rank 0's: the
gradients are all-reduced); and the measured figures of an attempt (`measured_figures`)."""

from __future__ import annotations

import json
import os
import resource
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Protocol

from ito_assets.runtime.record.storage import append_line

if TYPE_CHECKING:  # the supervisor's relay imports this module without torch
    import torch

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


# The first steps carry compilation and allocator warm-up; a median over the rest is the steady step.
WARMUP_STEPS = 2


def measured_figures(step_seconds: list[float], device: "torch.device") -> dict[str, float | int | None]:
    """The steady step time of this attempt (median after the warm-up steps; None with too few)
    and this process's peak memory: the CUDA allocator's peak on a GPU, the peak resident set on
    CPU (the whole process, not only tensors)."""
    steady = sorted(step_seconds[WARMUP_STEPS:])
    median = steady[len(steady) // 2] if steady else None
    if device.type == "cuda":
        import torch

        peak, source = torch.cuda.max_memory_allocated(device), "torch.cuda.max_memory_allocated"
    else:
        peak, source = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "ru_maxrss"  # KiB on Linux
    return {"step_seconds": median, "num_steps_timed": len(steady), "peak_memory_bytes": int(peak),
            "peak_memory_source": source}
