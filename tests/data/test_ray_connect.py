"""Joining the Ray that ITO_DATA_ENGINE=ray runs on, where it cannot be joined: Ray not installed,
a RAY_ADDRESS that is not an address, or one where no Ray answers. Each is a stable code at once
(Ray alone retried an unanswered address 20 times, ~40 s each, deaf to Ctrl-C), and no message
names the user, password or token an address carries; and what a unit's failure on Ray says of
its error. No test here starts a Ray; joining a real cluster, and one on another Ray release, is
in test_ray_engine.py."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from contextlib import contextmanager

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (the `ray` extra; `make test` installs it)")

from ito_assets.data import ray_engine  # noqa: E402
from ito_assets.data.units import map_units, worker_pool  # noqa: E402
from ito_assets.errors import ErrorCode, ItoError  # noqa: E402

SECRET = "s3cr3t-t0ken"


@pytest.fixture(autouse=True)
def no_ray_joined():
    """The pool joins a Ray this process already joined without reading RAY_ADDRESS."""
    if ray.is_initialized():
        pytest.skip("a Ray is joined in this process")
    yield
    assert not ray.is_initialized()


def _join_fails(monkeypatch, address: str) -> tuple[ItoError, float]:
    monkeypatch.setenv("RAY_ADDRESS", address)
    started = time.monotonic()
    with pytest.raises(ItoError) as caught:
        with worker_pool(1, "ray"):
            pytest.fail("joined a Ray at a dead address")
    return caught.value, time.monotonic() - started


@contextmanager
def _listener():
    """A port on every interface that takes connections and answers nothing a Ray would."""
    server = socket.create_server(("", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve():
        held = []
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                pass
        for connection in held:
            connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        server.close()


@pytest.mark.parametrize("address", ["garbage", "host:port:6379", f"http://user:{SECRET}@127.0.0.1:8265", f"alice:{SECRET}@10.0.0.5:6379", ":6379"])
def test_a_ray_address_that_is_not_one_is_a_usage_error_that_does_not_quote_it(monkeypatch, address):
    error, took = _join_fails(monkeypatch, address)
    assert error.code is ErrorCode.USAGE_ERROR and "RAY_ADDRESS" in error.message
    assert SECRET not in str(error) and address not in error.message
    assert took < 5


def test_an_address_where_nothing_listens_fails_at_once_naming_only_host_and_port(monkeypatch):
    with socket.create_server(("", 0)) as closed:
        port = closed.getsockname()[1]
    error, took = _join_fails(monkeypatch, f"127.0.0.1:{port}")
    assert error.code is ErrorCode.TIMEOUT and error.retryable
    assert f":{port} (RAY_ADDRESS; refused" in error.message
    assert took < 5  # Ray alone: 20 tries of ~40 s


def test_an_address_whose_host_does_not_resolve_fails_at_once(monkeypatch):
    error, took = _join_fails(monkeypatch, "no-such-host.invalid:6379")
    assert error.code is ErrorCode.TIMEOUT and "no-such-host.invalid:6379" in error.message
    assert took < ray_engine.CONNECT_TIMEOUT_S + 5


def test_auto_with_no_ray_on_this_machine_says_so(monkeypatch, tmp_path):
    # No Ray here, whatever runs beside this test (another test's cluster): "auto" joins any
    # gcs_server process it finds, or the address a `ray start` left under Ray's temp folder.
    monkeypatch.setattr("ray._private.services.find_gcs_addresses", lambda: [])
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    error, took = _join_fails(monkeypatch, "auto")
    assert error.code is ErrorCode.TIMEOUT and "auto" in error.message
    assert took < 5


def test_ray_not_installed_is_capability_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ItoError) as caught:
        with worker_pool(1, "ray"):
            pytest.fail("a pool without Ray")
    assert caught.value.code is ErrorCode.CAPABILITY_MISSING and "pip install '.[ray]'" in caught.value.message


@pytest.mark.parametrize("address,named", [
    ("10.0.0.5:6379", "10.0.0.5:6379"),
    (f"ray://alice:{SECRET}@head.example:10001", "ray://head.example:10001"),
    (f"ray://head.example:10001/?token={SECRET}", "ray://head.example:10001"),
    (f"ray://head.example:10001/?next=http://{SECRET}", "ray://head.example:10001"),
    ("[::1]:6379", "[::1]:6379"),
    ("", "RAY_ADDRESS"),
])
def test_an_address_is_named_by_scheme_host_and_port_only(address, named):
    assert ray_engine.where(address) == named


@pytest.mark.slow
@pytest.mark.long
def test_a_port_that_takes_connections_but_is_no_ray_fails_in_one_of_rays_tries(monkeypatch):
    """A port of the head that is not its GCS (the dashboard's, Ray Client's) passes the connect
    check; Ray then tries once (~40 s) where it tried 20 times."""
    with _listener() as port:
        error, took = _join_fails(monkeypatch, f"127.0.0.1:{port}")
    assert error.code is ErrorCode.TIMEOUT and f":{port} (RAY_ADDRESS)" in error.message
    assert took < 120
    assert ray_engine.GCS_WAIT[0] not in os.environ  # set for the join only


@pytest.mark.slow
@pytest.mark.long
def test_a_ray_client_address_with_a_password_where_nothing_answers_does_not_quote_it(monkeypatch):
    error, took = _join_fails(monkeypatch, f"ray://alice:{SECRET}@127.0.0.1:1")
    assert error.code is ErrorCode.TIMEOUT and "ray://127.0.0.1:1" in error.message
    assert SECRET not in str(error) and took < 120



class _FakeRay:
    """What RayPool uses of Ray, without a Ray: each task fails as Ray reports a task that raised."""

    exceptions = ray.exceptions

    def __init__(self, error: BaseException):
        self.error = error

    def remote(self, **options):
        return lambda function: type("Remote", (), {"remote": staticmethod(lambda task: task)})

    def cluster_resources(self):
        return {"CPU": 2.0}

    def get(self, reference):
        raise ray.exceptions.RayTaskError("unit", "traceback", self.error)

    def cancel(self, reference, force=False):
        pass

    def wait(self, references, num_returns, timeout=None):
        return references[:num_returns], references[num_returns:]


@pytest.mark.parametrize("error,named", [
    (ItoError(ErrorCode.SHARD_CORRUPT, f"shard d-00001.parquet: {SECRET}"), "ItoError SHARD_CORRUPT"),
    (OSError(f"cannot read {SECRET}"), "OSError"),
])
def test_a_unit_that_fails_on_ray_names_its_errors_type_and_code_never_its_message(error, named):
    """A worker's SHARD_CORRUPT or SOURCE_INVALID reaches the step as DATA_WORK_UNIT_FAILED: the
    code says which, where the type alone (ItoError) said nothing."""
    with pytest.raises(ItoError) as caught:
        map_units(abs, [1, 2], ray_engine.RayPool(_FakeRay(error)), phase="dedup signatures")
    assert caught.value.code is ErrorCode.DATA_WORK_UNIT_FAILED
    assert caught.value.message == f"dedup signatures: work unit 0 failed {ray_engine.ATTEMPTS} times ({named})"


@pytest.mark.parametrize("address", ["", "ray://127.0.0.1:1"])
def test_a_failed_join_leaves_no_half_started_ray_in_the_process(monkeypatch, address):
    """After a failed init, the next step's init in the same process (the in-process executor, a
    retry) failed on an assertion in Ray, whatever the cluster's state by then."""
    calls = []

    class FailingRay:
        __version__ = "x"

        def init(self, **kwargs):
            calls.append("init")
            raise ConnectionError("no answer")

        def shutdown(self):
            calls.append("shutdown")

    with pytest.raises((ConnectionError, ItoError)):
        ray_engine._join(FailingRay(), address)
    assert calls == ["init", "shutdown"]
