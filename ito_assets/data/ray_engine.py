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

A cluster with no CPU for a unit (a head started with `--num-cpus=0` and no worker, every worker
gone) would leave the tasks pending for good, the step waiting without a word. So before a phase
sends its units, a cluster with fewer CPUs than one unit takes, and no autoscaler that may add
nodes, is CAPABILITY_MISSING; and while units wait with none finishing on a cluster that has no
such CPU (an autoscaler that adds none, workers lost mid-phase), the run's log is warned every
`WARN_EVERY_S` and the step fails with TIMEOUT after ITO_RAY_PENDING_TIMEOUT_S (`look` decides).

Ray is an optional extra (`pip install '.[ray]'`); only this module imports it.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import math
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TypeVar
from urllib.parse import urlsplit

from ito_assets import env as env_text
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
# What one unit's task asks of a node: one core, as a worker process of the local engine.
UNIT_CPUS = 1
# Seconds units may wait, none finishing, on a cluster with no CPU for one before the step fails
# (ITO_RAY_PENDING_TIMEOUT_S): Ray's autoscaler gives a node it launches as long to start
# (AUTOSCALER_NODE_START_WAIT_S, 900 s), so a cluster scaled to 0 workers has its time to grow.
PENDING_TIMEOUT_S = 900.0
PENDING_TIMEOUT_VARIABLE = "ITO_RAY_PENDING_TIMEOUT_S"
# How often such a wait is said in the run's log: once a minute says "still stuck" without
# burying the log (an hour's wait is 60 lines).
WARN_EVERY_S = 60.0
# How often a wait that sees no unit finish looks at the cluster: the autoscaler's own update
# interval (AUTOSCALER_UPDATE_INTERVAL_S, 5 s); a unit that finishes ends the wait at once.
POLL_S = 5.0
# How long a 0-CPU cluster's monitor is given for its first report, which says whether an
# autoscaler may add nodes: two of its 5 s updates. Only a cluster with no CPU waits for it.
REPORT_WAIT_S = 10.0
# The key under which Ray's autoscaler (v1) reports each update (ray_constants.DEBUG_AUTOSCALING_STATUS).
AUTOSCALING_STATUS = "__autoscaling_status"
LOGGER = logging.getLogger(__name__)


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


class Verdict(enum.Enum):
    """What a wait that saw no unit finish does next."""

    WAIT = "wait"
    WARN = "warn"  # say so in the run's log, and wait
    FAIL = "fail"  # give up: TIMEOUT


@dataclass(frozen=True)
class Starved:
    """Units have waited, none finishing, on a cluster with no CPU for one since `since`
    (monotonic seconds); `num_warned` warnings were given since."""

    since: float
    num_warned: int = 0


def look(starved: Starved | None, now: float, cpus: float, timeout_s: float) -> tuple[Verdict, Starved | None]:
    """The verdict on a wait in which no unit finished, seen at `now` on a cluster of `cpus` CPUs
    in all, and the starvation it leaves (None: the cluster has a CPU for a unit, and Ray runs
    them in turn). The clock starts at the first look that finds no such CPU; a unit that
    finishes resets it (the caller drops `starved`). FAIL once it has run `timeout_s`, WARN at
    each whole `WARN_EVERY_S` before, once."""
    if cpus >= UNIT_CPUS:
        return Verdict.WAIT, None
    starved = starved or Starved(since=now)
    waited = now - starved.since
    if waited >= timeout_s:
        return Verdict.FAIL, starved
    intervals = int(waited // WARN_EVERY_S)
    if intervals > starved.num_warned:
        return Verdict.WARN, replace(starved, num_warned=intervals)
    return Verdict.WAIT, starved


def pending_timeout_from(env: Mapping[str, str] | None = None) -> float:
    """ITO_RAY_PENDING_TIMEOUT_S from `env` (default: the process environment), read with
    RAY_ADDRESS when a step opens its pool: seconds above 0, `inf` for no bound (warnings only),
    PENDING_TIMEOUT_S when unset or empty. A refused value is never echoed."""
    raw = env_text.environment(env).get(PENDING_TIMEOUT_VARIABLE)
    return float(env_text.parse(raw, default=PENDING_TIMEOUT_S, whole=False, low=0, low_open=True, message=f"{PENDING_TIMEOUT_VARIABLE} must be a number of seconds above 0 (inf: no bound)"))


class RayPool:
    """Ray tasks, one per item, results as they finish (`map_finished`). `cluster` names the
    cluster in messages (never a secret its address carries); `pending_timeout_s` bounds a wait
    on a cluster with no CPU for a unit."""

    def __init__(self, ray_module, *, cluster: str = "the Ray cluster", pending_timeout_s: float = PENDING_TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic):
        self.ray, self.cluster, self.pending_timeout_s, self.clock = ray_module, cluster, pending_timeout_s, clock
        # Looked at a few times within the bound, so a small one (a test's) is not overshot much.
        self.poll_s = min(POLL_S, pending_timeout_s / 4)

    def map_finished(self, function: Callable[[Task], Result], tasks: Sequence[Task]) -> Iterator[tuple[int, Result]]:
        """(position, result) of each task as it finishes. A unit that failed on every attempt
        raises WorkUnitFailed after the results of the tasks that had finished by then (their
        completion markers are written; a rerun redoes the others). However the caller stops (a
        unit failed, its own error, the iterator closed), the tasks whose results it did not take
        are cancelled, and waited for, before the error reaches it: on a cluster that outlives the
        step they would otherwise go on writing into the phase's folder while a rerun clears it
        and writes the same files. A cluster with no CPU for a unit fails before any is sent
        (`_schedulable`), or once its units have waited `pending_timeout_s` (`_starving`)."""
        starved = self._schedulable(len(tasks)) if tasks else None
        remote = self.ray.remote(num_cpus=UNIT_CPUS, max_retries=ATTEMPTS - 1, retry_exceptions=True)(function)
        pending = {remote.remote(task): position for position, task in enumerate(tasks)}
        try:
            while pending:
                ready, _ = self.ray.wait(list(pending), num_returns=1, timeout=self.poll_s)
                if not ready:
                    starved = self._starving(starved, len(pending))
                    continue
                starved, [reference] = None, ready
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

    def _schedulable(self, num_units: int) -> Starved | None:
        """Before any unit is sent: CAPABILITY_MISSING where no node can ever run one (too few
        CPUs in all, and no autoscaler that may add nodes); else the starvation a cluster scaled to
        0 workers starts with (None where it has a CPU)."""
        cpus = _cpus(self.ray.cluster_resources())
        if cpus >= UNIT_CPUS:
            return None
        if not _may_grow(self.ray):
            raise ItoError(ErrorCode.CAPABILITY_MISSING, f"{self.cluster} has {cpus:g} CPUs: no work unit can be scheduled "
                           f"(each takes {UNIT_CPUS}), and no autoscaler reports that it may add nodes; add a worker "
                           "node with CPUs, or set RAY_ADDRESS to a cluster that has one")
        LOGGER.info(f"{self.cluster} has {cpus:g} CPUs now and an autoscaler that may add nodes: {num_units:,} work "
                    f"units wait up to {self.pending_timeout_s:g} s for one (ITO_RAY_PENDING_TIMEOUT_S)")
        return look(None, self.clock(), cpus, self.pending_timeout_s)[1]

    def _starving(self, starved: Starved | None, num_pending: int) -> Starved | None:
        """A wait that saw no unit finish: warn, or fail with TIMEOUT (the caller's `finally`
        cancels the units), where the cluster has had no CPU for one too long (`look`)."""
        cpus, now = _cpus(self.ray.cluster_resources()), self.clock()
        verdict, starved = look(starved, now, cpus, self.pending_timeout_s)
        if verdict is Verdict.WAIT:
            return starved
        waited = now - starved.since
        state = f"{cpus:g} CPUs, {_cpus(self.ray.available_resources()):g} available; each unit takes {UNIT_CPUS}"
        if verdict is Verdict.WARN:
            bound = "no bound" if math.isinf(self.pending_timeout_s) else f"the step fails at {self.pending_timeout_s:g} s"
            LOGGER.warning(f"{num_pending:,} work units pending on {self.cluster}, none finished for {waited:.0f} s: it "
                           f"has no CPU to run them ({state}); {bound} (ITO_RAY_PENDING_TIMEOUT_S)")
            return starved
        raise ItoError(ErrorCode.TIMEOUT, f"{num_pending:,} work units waited {waited:.0f} s on {self.cluster}, which "
                       f"had no CPU to run them ({state}); cancelled at ITO_RAY_PENDING_TIMEOUT_S="
                       f"{self.pending_timeout_s:g} s: check the cluster's workers (all gone, or none added)")

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


def _cpus(resources: dict) -> float:
    return float(resources.get("CPU", 0.0))


def _may_grow(ray) -> bool:
    """Whether an autoscaler may add nodes to the cluster (Ray's own report of it, which only a
    cluster with no CPU reads: up to REPORT_WAIT_S while its monitor has not reported yet)."""
    try:
        from ray.experimental.internal_kv import _internal_kv_get

        raylet = ray._raylet
        v2 = _internal_kv_get(raylet.GCS_AUTOSCALER_V2_ENABLED_KEY, namespace=raylet.GCS_AUTOSCALER_STATE_NAMESPACE)
        deadline = time.monotonic() + REPORT_WAIT_S
        while (grows := autoscaler_may_add_nodes(v2, _internal_kv_get(AUTOSCALING_STATUS))) is None \
                and time.monotonic() < deadline:
            time.sleep(0.5)
    except Exception:  # noqa: BLE001 - not told: the pending timeout bounds the wait
        return True
    return bool(grows)


def autoscaler_may_add_nodes(v2_enabled: bytes | None, status: bytes | None) -> bool | None:
    """From Ray's own records: autoscaler v2 enabled (b"1"), or v1's report (JSON) naming a node
    type of a cluster config (KubeRay's groups, `ray up`'s types), may add nodes; a cluster
    started by hand reports one type per node, `node_<its id>` (the read-only provider), and one
    with no monitor reports nothing: neither may. None: a monitor that has not reported yet. A
    report of another shape rules nothing out (True: the pending timeout still bounds the wait)."""
    if v2_enabled == b"1":
        return True
    if status is None:
        return False
    try:
        report = json.loads(status).get("autoscaler_report")
        if report is None:
            return None
        types = report["node_type_mapping"]
        return not types or any(kind != f"node_{node}" for node, kind in types.items())
    except (ValueError, AttributeError, KeyError, TypeError):
        return True


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
    pending_timeout_s = pending_timeout_from()
    started = not ray.is_initialized()
    address = os.environ.get("RAY_ADDRESS", "").strip() if started else ""
    if started:
        _join(ray, address)
    cluster = f"the Ray cluster at {where(address)} (RAY_ADDRESS)" if address else \
        "the Ray started for this step" if started else "the Ray this process joined"
    try:
        yield RayPool(ray, cluster=cluster, pending_timeout_s=pending_timeout_s)
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


def _join(ray, address: str) -> None:
    """ray.init() on `address` (RAY_ADDRESS; empty: a Ray started here), or an ItoError that says why not."""
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
        # A failed init leaves Ray half set up in this process: the next step's init would fail on
        # an assertion (its internal store never connected), whatever the cluster's state by then.
        with contextlib.suppress(Exception):
            ray.shutdown()
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
