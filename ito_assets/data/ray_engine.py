"""The data plane's work units as Ray tasks: the engine for a corpus that outgrows one machine.

A step's units are independent (units.py): each becomes one Ray task running the same top-level
function on the same task as the local engine, and the results come back in task order, so the
step's outputs are the same bytes whichever engine ran it. The unit files are read and written
by path: on a cluster of several nodes the step's scratch folder must be storage every node
mounts at the same path.

`ray.init()` connects to the cluster `RAY_ADDRESS` names, or starts a Ray on this machine for the
step (about 14 s on a 2-core VM) and stops it after. A task whose worker dies (a killed process, a lost node)
or that raises is tried again by Ray, `ATTEMPTS` times in all; then the step fails with
DATA_WORK_UNIT_FAILED naming the phase and the unit.

Ray is an optional extra (`pip install '.[ray]'`); only this module imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

Task = TypeVar("Task")
Result = TypeVar("Result")

# Three tries per unit, as the data plane's promise says: one failure may be a lost node, three
# is the unit itself (a corrupt file, a bug) and retrying more only hides it.
ATTEMPTS = 3


class WorkUnitFailed(Exception):
    """Unit `index` failed on every attempt; `cause` names the last error's type only (a task's
    message may quote a document)."""

    def __init__(self, index: int, cause: str):
        super().__init__(f"work unit {index} failed {ATTEMPTS} times ({cause})")
        self.index, self.cause = index, cause

    def renumbered(self, indices: Sequence[int]) -> WorkUnitFailed:
        """The same failure named by the step's unit number, where the pool was handed only the
        units `indices` (the others finished in an earlier attempt)."""
        return WorkUnitFailed(indices[self.index], self.cause)


class RayPool:
    """`map` over Ray tasks: one task per item, results in item order."""

    def __init__(self, ray_module):
        self.ray = ray_module

    def map(self, function: Callable[[Task], Result], tasks: Sequence[Task]) -> Iterator[Result]:
        remote = self.ray.remote(num_cpus=1, max_retries=ATTEMPTS - 1, retry_exceptions=True)(function)
        pending = [remote.remote(task) for task in tasks]
        for index, reference in enumerate(pending):
            try:
                yield self.ray.get(reference)
            except self.ray.exceptions.RayError as error:
                for other in pending[index + 1:]:
                    self.ray.cancel(other)
                cause = error.cause if isinstance(error, self.ray.exceptions.RayTaskError) else error
                raise WorkUnitFailed(index, type(cause).__name__) from None


@contextmanager
def ray_pool() -> Iterator[RayPool]:
    """A pool on the cluster `RAY_ADDRESS` names, on the Ray this process already joined, or on a
    Ray started here for the duration of the step."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield RayPool(ray)
    finally:
        if started:
            ray.shutdown()
