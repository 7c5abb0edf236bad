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

Joining fails with a code and a message that names the address by scheme, host and port only
(never a user, password or token it carries): Ray not installed, or the cluster on another Ray or
Python release, is CAPABILITY_MISSING; an address that is not one is USAGE_ERROR; an address where
no Ray answers is TIMEOUT, within `CONNECT_TIMEOUT_S` (Ray alone retries it 20 times, ~40 s each,
deaf to Ctrl-C meanwhile).

Ray is an optional extra (`pip install '.[ray]'`); only this module imports it.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar
from urllib.parse import urlsplit

from ito_assets.errors import ErrorCode, ItoError

Task = TypeVar("Task")
Result = TypeVar("Result")

# Three tries per unit, as the data plane's promise says: one failure may be a lost node, three
# is the unit itself (a corrupt file, a bug) and retrying more only hides it.
ATTEMPTS = 3
# Seconds to open a connection to the address RAY_ADDRESS names before the step gives up on it.
CONNECT_TIMEOUT_S = 10.0
# What Ray's own wait for an address that takes connections but answers no Ray (the dashboard's
# port, say) is cut to: one attempt of ~40 s, not 20 (`RAY_gcs_server_port_wait_time_s`, read when
# Ray connects; an operator's own value is kept).
GCS_WAIT = ("RAY_gcs_server_port_wait_time_s", "1")
# Seconds a cancelled task is given to stop before its worker is killed, and then to be gone.
STOP_WAIT_S = 10.0
ADDRESS_FORMS = "host:port, ray://host:port, auto or local"


class WorkUnitFailed(Exception):
    """Unit `index` failed on every attempt; `cause` names the last error's type, and a coded
    error's code, only (a task's message may quote a document)."""

    def __init__(self, index: int, cause: str):
        super().__init__(f"work unit {index} failed {ATTEMPTS} times ({cause})")
        self.index, self.cause = index, cause

    def renumbered(self, indices: Sequence[int]) -> WorkUnitFailed:
        """The same failure named by the step's unit number, where the pool was handed only the
        units `indices` (the others finished in an earlier attempt)."""
        return WorkUnitFailed(indices[self.index], self.cause)


class RayPool:
    """Ray tasks, one per item, results as they finish (`map_finished`)."""

    def __init__(self, ray_module):
        self.ray = ray_module

    def map_finished(self, function: Callable[[Task], Result], tasks: Sequence[Task]) -> Iterator[tuple[int, Result]]:
        """(position, result) of each task as it finishes. A unit that failed on every attempt
        raises WorkUnitFailed after the results of the tasks that had finished by then (their
        completion markers are written; a rerun redoes the others). However the caller stops (a
        unit failed, its own error, the iterator closed), the tasks whose results it did not take
        are cancelled, and waited for, before the error reaches it: on a cluster that outlives the
        step they would otherwise go on writing into the phase's folder while a rerun clears it
        and writes the same files."""
        remote = self.ray.remote(num_cpus=1, max_retries=ATTEMPTS - 1, retry_exceptions=True)(function)
        pending = {remote.remote(task): position for position, task in enumerate(tasks)}
        try:
            while pending:
                [reference], _ = self.ray.wait(list(pending), num_returns=1)
                position = pending.pop(reference)
                try:
                    result = self.ray.get(reference)
                except self.ray.exceptions.RayError as error:
                    cause = error.cause if isinstance(error, self.ray.exceptions.RayTaskError) else error
                    failed = WorkUnitFailed(position, _named(cause))
                    yield from self._finished_now(pending)
                    raise failed from None
                yield position, result  # the caller's now: Ray may free its copy
        finally:
            self._stop(list(pending))

    def _finished_now(self, pending: dict) -> Iterator[tuple[int, Result]]:
        """The results of the tasks already finished, those that succeeded; taken out of `pending`."""
        if not pending:
            return
        ready, _ = self.ray.wait(list(pending), num_returns=len(pending), timeout=0)
        for reference in ready:
            position = pending.pop(reference)
            try:
                yield position, self.ray.get(reference)
            except self.ray.exceptions.RayError:
                continue

    def _stop(self, references: list) -> None:
        """Cancel the tasks not taken (a finished one is left as it is) and wait until none runs:
        asked first (an interrupt in the task), then forced (its worker killed; a half-written file
        is one no marker vouches for, which the rerun removes)."""
        if not references:
            return
        for force in (False, True):
            for reference in references:
                try:
                    self.ray.cancel(reference, force=force)
                except Exception:  # noqa: BLE001 - finished, or already cancelled
                    pass
            _, references = self.ray.wait(references, num_returns=len(references), timeout=STOP_WAIT_S)
            if not references:
                return


def _named(cause: BaseException) -> str:
    """The error's type, and a coded error's code (SHARD_CORRUPT, SOURCE_INVALID): what the step's
    message may say of it."""
    code = cause.code.value if isinstance(cause, ItoError) else None
    return type(cause).__name__ if code is None else f"{type(cause).__name__} {code}"


@contextmanager
def ray_pool() -> Iterator[RayPool]:
    """A pool on the cluster `RAY_ADDRESS` names, on the Ray this process already joined, or on a
    Ray started here for the duration of the step."""
    ray = _import_ray()
    started = not ray.is_initialized()
    if started:
        _join(ray)
    try:
        yield RayPool(ray)
    finally:
        if started:
            ray.shutdown()


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ItoError(ErrorCode.CAPABILITY_MISSING, "ITO_DATA_ENGINE=ray needs Ray, which is not installed here "
                       "(the `ray` extra: pip install '.[ray]')") from None
    return ray


def where(address: str) -> str:
    """The address as a message names it: scheme, host and port, never a user, password, path or query."""
    scheme, cut, rest = address.strip().partition("://")
    scheme, rest = (scheme, rest) if cut else ("", scheme)
    try:
        parts = urlsplit(f"//{rest}")
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if not host:
        return "RAY_ADDRESS"
    host = f"[{host}]" if ":" in host else host
    return f"{scheme + '://' if scheme else ''}{host}{'' if port is None else f':{port}'}"


def _join(ray) -> None:
    """ray.init() on RAY_ADDRESS (or a Ray started here), or an ItoError that says why not."""
    address = os.environ.get("RAY_ADDRESS", "").strip()
    named = where(address)
    override = {}
    if address and not address.startswith("ray://"):  # Ray Client gives up by itself (30 s)
        target = _bootstrap_address(ray, address)
        if target is not None:
            _reachable(target, named)
            override = dict([GCS_WAIT]) if GCS_WAIT[0] not in os.environ else {}
    os.environ.update(override)
    try:
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    except Exception as error:  # noqa: BLE001 - Ray's messages may quote the address, secrets and all
        if not address:
            raise
        ours = f"Ray {ray.__version__}, Python {sys.version.split()[0]}"
        if isinstance(error, RuntimeError) and "Version mismatch" in str(error):
            raise ItoError(ErrorCode.CAPABILITY_MISSING, f"the Ray cluster at {named} (RAY_ADDRESS) runs another Ray or Python "
                           f"release than this step ({ours}); every node and the step must run the same") from None
        if isinstance(error, ValueError):
            raise ItoError(ErrorCode.USAGE_ERROR, f"RAY_ADDRESS is not a Ray cluster's address ({ADDRESS_FORMS})") from None
        if isinstance(error, (ConnectionError, TimeoutError)):
            raise ItoError(ErrorCode.TIMEOUT, f"no Ray cluster answers at {named} (RAY_ADDRESS): check that the cluster runs "
                           f"and that RAY_ADDRESS names its head's {_port_hint(address)}") from None
        raise ItoError(ErrorCode.INTERNAL_ERROR, f"joining the Ray cluster at {named} (RAY_ADDRESS) failed ({type(error).__name__})") from None
    finally:
        for name in override:
            os.environ.pop(name, None)


def _bootstrap_address(ray, address: str) -> str | None:
    """host:port as Ray will dial it (a loopback host is this node's address to Ray), or None where
    Ray starts a Ray here ("local")."""
    from ray._private.services import canonicalize_bootstrap_address

    try:
        return canonicalize_bootstrap_address(address)
    except ConnectionError:  # "auto" with no Ray running on this machine
        raise ItoError(ErrorCode.TIMEOUT, "RAY_ADDRESS is auto, and no Ray runs on this machine to join") from None
    except Exception:  # noqa: BLE001 - a malformed address; its text may hold a secret
        raise ItoError(ErrorCode.USAGE_ERROR, f"RAY_ADDRESS is not a Ray cluster's address ({ADDRESS_FORMS})") from None


def _reachable(target: str, named: str) -> None:
    host, _, port = target.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError) as error:
        why = "timed out" if isinstance(error, TimeoutError) else "refused" if isinstance(error, ConnectionRefusedError) else type(error).__name__
        raise ItoError(ErrorCode.TIMEOUT, f"no Ray cluster answers at {named} (RAY_ADDRESS; {why}, {CONNECT_TIMEOUT_S:g} s at most): check "
                       "that the cluster runs and that RAY_ADDRESS names its head's GCS port (6379 by default)") from None


def _port_hint(address: str) -> str:
    return "Ray Client port (10001 by default)" if address.startswith("ray://") else "GCS port (6379 by default)"
