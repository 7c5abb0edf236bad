"""The Ray engine on a cluster with no CPU for a work unit (a head started with `--num-cpus=0` and no
worker, every worker gone), where Ray leaves the tasks pending for good and the step waited without
a word: CAPABILITY_MISSING before any unit is sent where no autoscaler may add a node, else a
warning each minute and TIMEOUT at ITO_RAY_PENDING_TIMEOUT_S, the units cancelled. The decision
(`look`) at its boundaries, Ray's autoscaler records read, the setting, the pool on a fake Ray, and
one Ray started here with no CPU."""

from __future__ import annotations

import json
import logging
import math
import time

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (the `ray` extra; `make test` installs it)")

from ito_assets.data import ray_engine  # noqa: E402
from ito_assets.data.units import map_units, worker_pool  # noqa: E402
from ito_assets.errors import ErrorCode, ItoError  # noqa: E402

SECRET = "s3cr3t-t0ken"
WAIT, WARN, FAIL = "WAIT", "WARN", "FAIL"


def _look(starved, now, cpus, timeout_s):
    verdict, after = ray_engine.look(starved, now, cpus, timeout_s)
    return verdict.name, after


# --- the decision: wait, warn or fail ------------------------------------------------------------

@pytest.mark.parametrize("cpus", [1.0, 1.5, 64.0])
def test_a_cluster_with_a_cpu_for_a_unit_is_waited_on_and_resets_the_clock(cpus):
    """Busy CPUs (long units, another job's tasks) are Ray's queue, not a hang."""
    assert _look(None, 100.0, cpus, 10.0) == (WAIT, None)
    assert _look(ray_engine.Starved(since=0.0, num_warned=3), 500.0, cpus, 10.0) == (WAIT, None)


@pytest.mark.parametrize("cpus", [0.0, 0.5, 0.999])
def test_the_clock_starts_at_the_first_look_without_a_cpu_for_a_unit(cpus):
    assert _look(None, 100.0, cpus, 10.0) == (WAIT, ray_engine.Starved(since=100.0))


@pytest.mark.parametrize("waited, verdict", [(0.0, WAIT), (1.999, WAIT), (2.0, FAIL), (2.001, FAIL), (1e9, FAIL)])
def test_it_fails_exactly_at_the_bound(waited, verdict):
    starved = ray_engine.Starved(since=10.0)
    assert _look(starved, 10.0 + waited, 0.0, 2.0)[0] == verdict


def test_it_warns_once_at_each_whole_interval_before_the_bound():
    every, starved = ray_engine.WARN_EVERY_S, ray_engine.Starved(since=0.0)
    assert _look(starved, every - 0.001, 0.0, 1000.0) == (WAIT, starved)
    verdict, starved = _look(starved, every, 0.0, 1000.0)
    assert (verdict, starved.num_warned) == (WARN, 1)
    assert _look(starved, every + 5, 0.0, 1000.0) == (WAIT, starved)  # said once per interval
    assert _look(starved, 2 * every - 0.001, 0.0, 1000.0) == (WAIT, starved)
    verdict, starved = _look(starved, 2 * every, 0.0, 1000.0)
    assert (verdict, starved.num_warned) == (WARN, 2)
    verdict, late = _look(starved, 4 * every + 1, 0.0, 1000.0)  # a late look: one line, not two
    assert (verdict, late.num_warned) == (WARN, 4)
    assert _look(late, 4 * every + 2, 0.0, 1000.0) == (WAIT, late)


def test_the_bound_comes_before_a_warning_due_at_the_same_time():
    every = ray_engine.WARN_EVERY_S
    assert _look(ray_engine.Starved(since=0.0), every, 0.0, every)[0] == FAIL


def test_no_bound_only_warns():
    verdict, _ = _look(ray_engine.Starved(since=0.0), 1e9, 0.0, math.inf)
    assert verdict == WARN


# --- whether an autoscaler may add nodes: Ray's own records --------------------------------------

def _status(report: dict | None) -> bytes:
    return json.dumps({"time": 1.0} | ({} if report is None else {"autoscaler_report": report})).encode()


@pytest.mark.parametrize("v2, status, grows", [
    (b"1", None, True),  # autoscaler v2 (KubeRay's, `RAY_enable_autoscaler_v2`)
    (b"0", _status({"node_type_mapping": {"ab12": "headgroup"}}), True),  # KubeRay v1, no worker now
    (None, _status({"node_type_mapping": {"ab12": "node_ab12", "cd34": "cpu_workers"}}), True),
    (b"0", _status({"node_type_mapping": {"ab12": "node_ab12"}}), False),  # `ray start --head`: read-only
    (b"0", _status({"node_type_mapping": {"ab12": "node_ab12", "cd34": "node_cd34"}}), False),
    (b"0", None, False),  # no monitor: nothing adds nodes
    (b"0", _status(None), None),  # a monitor that has not reported yet
    (b"0", _status({"node_type_mapping": {}}), True),  # another shape rules nothing out
    (b"0", b"not json", True),
    (b"0", b"[1, 2]", True),
])
def test_an_autoscaler_is_read_from_rays_records(v2, status, grows):
    assert ray_engine.autoscaler_may_add_nodes(v2, status) is grows


# --- the setting ----------------------------------------------------------------------------------

@pytest.mark.parametrize("value, expected", [(None, ray_engine.PENDING_TIMEOUT_S), ("", ray_engine.PENDING_TIMEOUT_S),
                                             ("2", 2.0), ("0.5", 0.5), ("1e-9", 1e-9), ("inf", math.inf)])
def test_the_pending_timeout_setting(value, expected):
    env = {} if value is None else {"ITO_RAY_PENDING_TIMEOUT_S": value}
    assert ray_engine.pending_timeout_from(env) == expected


@pytest.mark.parametrize("value", ["0", "-0", "-1", "nan", "abc", SECRET])
def test_a_pending_timeout_that_is_not_seconds_above_0_is_a_usage_error_that_does_not_quote_it(value):
    with pytest.raises(ItoError) as refused:
        ray_engine.pending_timeout_from({"ITO_RAY_PENDING_TIMEOUT_S": value})
    assert refused.value.code is ErrorCode.USAGE_ERROR and "ITO_RAY_PENDING_TIMEOUT_S" in refused.value.message
    assert SECRET not in refused.value.message


# --- the pool on a fake Ray: no Ray started ---------------------------------------------------------

class _StuckRay:
    """What RayPool uses of Ray, on a cluster of `cpus` CPUs where no task ever finishes: each wait
    runs out its timeout on a clock of its own (no real sleep)."""

    exceptions = ray.exceptions

    def __init__(self, cpus: float, *, finish_after_s: float = math.inf):
        self.cpus, self.finish_after_s, self.now = cpus, finish_after_s, 0.0
        self.sent, self.cancelled = [], set()

    def remote(self, **options):
        assert options["num_cpus"] == ray_engine.UNIT_CPUS
        return lambda function: type("Remote", (), {"remote": staticmethod(self._send)})

    def _send(self, task):
        self.sent.append(task)
        return task

    def cluster_resources(self):
        return {"memory": 1e9} | ({"CPU": self.cpus} if self.cpus else {})  # Ray leaves out a 0

    def available_resources(self):
        return self.cluster_resources()

    def wait(self, references, num_returns, timeout=None):
        assert timeout is not None  # a wait with no timeout is the hang
        if self.now >= self.finish_after_s or all(r in self.cancelled for r in references):
            return references[:num_returns], references[num_returns:]
        self.now += timeout
        return [], references

    def get(self, reference):
        return reference

    def cancel(self, reference, force=False):
        self.cancelled.add(reference)

    def clock(self) -> float:
        return self.now


def _pool(fake: _StuckRay, timeout_s: float) -> ray_engine.RayPool:
    return ray_engine.RayPool(fake, cluster=ray_engine.where(f"ray://alice:{SECRET}@head.example:10001/?t={SECRET}"),
                              pending_timeout_s=timeout_s, clock=fake.clock)


def test_a_cluster_with_no_cpu_and_no_autoscaler_fails_before_any_unit_is_sent(monkeypatch):
    monkeypatch.setattr(ray_engine, "_may_grow", lambda ray_module: False)
    fake = _StuckRay(cpus=0.0)
    with pytest.raises(ItoError) as caught:
        map_units(abs, [1, 2, 3], _pool(fake, 900.0), phase="dedup signatures")
    assert caught.value.code is ErrorCode.CAPABILITY_MISSING and not caught.value.retryable
    assert caught.value.message.startswith("ray://head.example:10001 has 0 CPUs: no work unit can be scheduled")
    assert SECRET not in str(caught.value)
    assert fake.sent == [] and fake.now == 0.0


def test_units_waiting_on_no_cpu_warn_each_minute_then_time_out_cancelled(monkeypatch, caplog):
    """An autoscaler that never adds a node, or workers lost: warned, then TIMEOUT at the bound."""
    monkeypatch.setattr(ray_engine, "_may_grow", lambda ray_module: True)
    fake, bound = _StuckRay(cpus=0.0), 2.5 * ray_engine.WARN_EVERY_S
    caplog.set_level(logging.INFO, logger=ray_engine.LOGGER.name)
    with pytest.raises(ItoError) as caught:
        map_units(abs, [1, 2, 3], _pool(fake, bound), phase="dedup signatures")
    assert caught.value.code is ErrorCode.TIMEOUT and caught.value.retryable
    assert caught.value.message.startswith(f"3 work units waited {bound:.0f} s on ray://head.example:10001, which had "
                                           "no CPU to run them (0 CPUs, 0 available; each unit takes 1)")
    assert bound <= fake.now <= bound + ray_engine.POLL_S
    assert fake.cancelled == {1, 2, 3}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and all(w.startswith("3 work units pending on ray://head.example:10001") for w in warnings)
    assert "ITO_RAY_PENDING_TIMEOUT_S" in warnings[0]
    assert not any(SECRET in r.getMessage() for r in caplog.records)


def test_busy_cpus_are_waited_on_for_as_long_as_units_take(caplog):
    """Long units on a cluster with CPUs: no warning, no bound (only a cluster with no CPU has one)."""
    fake = _StuckRay(cpus=4.0, finish_after_s=10 * ray_engine.WARN_EVERY_S)
    assert map_units(abs, [1, 2], _pool(fake, ray_engine.WARN_EVERY_S), phase="dedup signatures") == [1, 2]
    assert fake.now >= 10 * ray_engine.WARN_EVERY_S and fake.cancelled == set()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


# --- one Ray started here with no CPU ---------------------------------------------------------------

def never_runs(value: int) -> int:
    """A unit's function: Ray ships it by reference, and on a Ray with no CPU no worker runs it."""
    return value


@pytest.fixture(scope="module")
def no_cpu_ray():
    """A Ray of one node with no CPU, and no autoscaler: its tasks can never run."""
    if ray.is_initialized():
        pytest.skip("a Ray is joined in this process")
    # "local": a Ray of its own, never one another test (or `ray start`) left running on this machine.
    ray.init(address="local", num_cpus=0, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(120)  # the Ray's start (~11-14 s on 2 cores) and the check; before, it hung for good
def test_a_real_ray_with_no_cpu_fails_at_once_with_a_code(no_cpu_ray):
    started = time.monotonic()
    with pytest.raises(ItoError) as caught:
        with worker_pool(1, "ray") as pool:
            map_units(never_runs, [1, 2, 3], pool, phase="dedup signatures")
    assert caught.value.code is ErrorCode.CAPABILITY_MISSING
    assert caught.value.message.startswith("the Ray this process joined has 0 CPUs: no work unit can be scheduled")
    assert time.monotonic() - started < ray_engine.REPORT_WAIT_S + 5  # its monitor's first report, at most


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_units_pending_on_a_real_ray_that_never_gets_a_cpu_time_out_at_the_bound(no_cpu_ray, monkeypatch):
    monkeypatch.setattr(ray_engine, "_may_grow", lambda ray_module: True)  # an autoscaler that adds nothing
    monkeypatch.setenv("ITO_RAY_PENDING_TIMEOUT_S", "2")
    started = time.monotonic()
    with pytest.raises(ItoError) as caught:
        with worker_pool(1, "ray") as pool:
            map_units(never_runs, [1, 2, 3], pool, phase="dedup signatures")
    took = time.monotonic() - started
    assert caught.value.code is ErrorCode.TIMEOUT
    assert caught.value.message.startswith("3 work units waited 2 s on the Ray this process joined")
    assert 2.0 <= took < 6.0
