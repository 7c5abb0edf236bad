"""Progress on long work, as lines a person reads in the Dagster run log: what is done out of how
much, how fast, how long to go. One line per tenth of the work whatever its length, so a long step
says where it is and a short one stays quiet.

The data plane's lines go to the standard `logging` logger `ito_assets.progress`: the pure core
stays free of Dagster, and Dagster captures them into the run's log because the instance lists
`ito_assets` among its managed Python loggers (deploy/local/dagster.yaml). The stage worker, a
separate process, sends its lines through its own reporter (Dagster Pipes).
"""

from __future__ import annotations

import logging
import time
from typing import Callable

PARTS = 10
LOGGER = logging.getLogger("ito_assets.progress")


def crossed(before: int, done: int, total: int, parts: int = PARTS) -> bool:
    """Whether going from `before` to `done` of `total` passes a tenth (the end is always one)."""
    return total > 0 and done > before and (done * parts // total > before * parts // total or done >= total)


def line(done: int, total: int, unit: str, rate: float | None) -> str:
    """`40 of 200 steps (20%), 2 steps/s, about 80 s to go`; rate in units per second."""
    pace = f"{rate:.3g} {unit}/s" if rate else "rate unknown"
    to_go = f"about {max(0, total - done) / rate:.0f} s to go" if rate else "time to go unknown"
    return f"{done:,} of {total:,} {unit} ({done / total:.0%}), {pace}, {to_go}"


class Progress:
    """Counts the work done by one phase of a step and says where it is at every tenth of `total`."""

    def __init__(self, phase: str, total: int, unit: str, *, say: Callable[[str], None] = LOGGER.info,
                 clock: Callable[[], float] = time.monotonic):
        self.phase, self.total, self.unit, self.say, self.clock = phase, total, unit, say, clock
        self.done, self.started = 0, clock()

    def advance(self, count: int = 1) -> None:
        before, self.done = self.done, self.done + count
        if crossed(before, self.done, self.total):
            elapsed = self.clock() - self.started
            rate = self.done / elapsed if elapsed > 0 else None
            self.say(f"[{self.phase}] {line(self.done, self.total, self.unit, rate)}")
