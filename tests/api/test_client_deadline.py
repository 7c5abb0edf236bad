"""One deadline for a whole client operation (`ito --timeout`), and full jitter in the backoff.

Unit tests run on a fake clock: a scripted transport that "hangs" advances it by what its socket
timeout would allow (the per-request limit, cut to what the deadline leaves), and the client's
sleep advances it too, so nothing really waits. Then the real transport against a socket that
accepts and never answers, in process and through `python -m ito_assets.api.cli`."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from api_harness import fake_api_holding
from helpers import valid_manifest, write_manifest
from ito_assets.api import cli, envelope
from ito_assets.api.client import ApiClient, Deadline, Endpoint, HttpTransport, NoAnswer, NotDelivered, Reply
from ito_assets.errors import ErrorCode, ItoError

RUN = {"run_id": "run_" + "1" * 26, "state": "queued"}
PER_REQUEST_S = 30.0  # ITO_TIMEOUT_S's default
CONNECT_S = 3.0  # ITO_CONNECT_TIMEOUT_S's default


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds


HANG = "hang"  # no answer until the socket timeout: NoAnswer(timed_out=True)
REFUSED = "refused"  # connection refused at once: NotDelivered()
CONNECT_HANG = "connect-hang"  # no SYN-ACK until the connect timeout: NotDelivered(timed_out=True)


class Transport:
    """Plays `steps` in order (the last one repeats), spending fake time as a real socket would."""

    def __init__(self, clock: Clock, deadline: Deadline, *steps) -> None:
        self.clock, self.deadline, self.steps = clock, deadline, list(steps)
        self.calls: list[tuple[str, str, float]] = []  # (method, resource, time left when sent)

    def request(self, method: str, path: str, body: dict | None) -> Reply:
        left = self.deadline.left()
        self.calls.append((method, path.split("/")[2], left))
        step = self.steps.pop(0) if len(self.steps) > 1 else self.steps[0]
        if step == HANG:
            self.clock.now += min(PER_REQUEST_S, left)
            raise NoAnswer(timed_out=True)
        if step == CONNECT_HANG:
            self.clock.now += min(CONNECT_S, left)
            raise NotDelivered(timed_out=True)
        if step == REFUSED:
            raise NotDelivered()
        return step


def ok(data: dict) -> Reply:
    return Reply(200, envelope.success(data, live_api_contacted=True))


def failed(code: ErrorCode) -> Reply:
    return Reply(409, envelope.failure(ItoError(code, "x"), live_api_contacted=True))


class Upper:
    """A random source that always draws the top of the range: the longest pauses possible."""

    def __init__(self) -> None:
        self.ranges: list[tuple[float, float]] = []

    def uniform(self, low: float, high: float) -> float:
        self.ranges.append((low, high))
        return high


def world(timeout_s: float, *steps, rng=None, **options) -> tuple[Clock, Transport, ApiClient]:
    clock = Clock()
    deadline = Deadline(timeout_s, clock=clock)
    transport = Transport(clock, deadline, *steps)
    client = ApiClient(transport, sleep=clock.sleep, deadline=deadline, rng=rng or Upper(), **options)
    return clock, transport, client


def error_of(call) -> ItoError:
    with pytest.raises(ItoError) as info:
        call()
    return info.value


# --- the deadline bounds every attempt, pause and lookup ----------------------------------------


def test_a_hung_train_takes_the_whole_deadline_and_not_a_moment_more():
    clock, transport, client = world(120.0, HANG)
    error = error_of(lambda: client.post_idempotent("/v1/runs", {}, key="k", action="train"))
    assert (error.code, error.live_api_contacted) == (ErrorCode.OUTCOME_UNKNOWN, True)
    assert clock.now == pytest.approx(120.0) and clock.now <= 120.0
    # one POST, then the lookup by key (a read, retried) until the deadline; never a second POST
    assert [c[:2] for c in transport.calls] == [("POST", "runs")] + [("GET", "idempotency-keys")] * 3
    # the last lookup's socket timeout was cut to what the deadline left
    assert transport.calls[-1][2] == pytest.approx(120.0 - 90.0 - 0.25 - 0.5)


@pytest.mark.parametrize("timeout_s", [2.0, 10.0, 45.0])
def test_a_small_timeout_cuts_the_first_request(timeout_s):
    clock, transport, client = world(timeout_s, HANG)
    assert error_of(lambda: client.post_idempotent("/v1/runs", {}, key="k", action="train")).code is \
        ErrorCode.OUTCOME_UNKNOWN
    assert clock.now == pytest.approx(timeout_s)
    assert transport.calls[0][2] == timeout_s  # the POST had all of it
    assert [c[0] for c in transport.calls].count("POST") == 1


def test_a_hung_read_is_a_timeout_within_the_deadline():
    clock, transport, client = world(50.0, HANG)
    error = error_of(lambda: client.get("/v1/runs/x"))
    assert (error.code, error.retryable) == (ErrorCode.TIMEOUT, True)
    assert clock.now == pytest.approx(50.0) and len(transport.calls) == 2  # 30 s, a pause, then the rest


def test_reads_that_end_before_the_deadline_keep_their_attempt_count():
    clock, transport, client = world(120.0, HANG)
    assert error_of(lambda: client.get("/v1/runs/x")).code is ErrorCode.TIMEOUT
    assert len(transport.calls) == 3 and clock.now == pytest.approx(90.75)


def test_nothing_delivered_before_the_deadline_is_a_timeout_not_an_unknown_outcome():
    for call in (lambda c: c.post_idempotent("/v1/runs", {}, key="k", action="train"),
                 lambda c: c.post("/v1/desk/accounts", {})):
        clock, transport, client = world(5.0, CONNECT_HANG)
        error = error_of(lambda: call(client))
        assert (error.code, error.live_api_contacted) == (ErrorCode.TIMEOUT, False)
        assert clock.now == pytest.approx(5.0) and len(transport.calls) == 2


def test_refused_connections_within_the_deadline_stay_unreachable():
    clock, transport, client = world(120.0, REFUSED)
    assert error_of(lambda: client.post_idempotent("/v1/runs", {}, key="k", action="train")).code is \
        ErrorCode.API_UNREACHABLE
    assert len(transport.calls) == 3


def test_a_mutation_without_a_key_still_stops_at_the_first_ambiguous_failure():
    clock, transport, client = world(120.0, HANG)
    assert error_of(lambda: client.post("/v1/desk/accounts", {})).code is ErrorCode.OUTCOME_UNKNOWN
    assert len(transport.calls) == 1 and clock.now == pytest.approx(30.0)


def test_the_lookup_shares_the_deadline_and_may_still_find_the_run():
    result = {"action": "train", "fingerprint": None, "result": RUN}
    clock, transport, client = world(40.0, HANG, ok(result))
    assert client.post_idempotent("/v1/runs", {}, key="k", action="train") == RUN
    assert transport.calls[1][:2] == ("GET", "idempotency-keys") and transport.calls[1][2] == pytest.approx(10.0)


def test_nothing_under_the_key_retries_the_post_only_while_time_is_left():
    clock, transport, client = world(31.0, HANG, failed(ErrorCode.RUN_NOT_FOUND), HANG)
    assert error_of(lambda: client.post_idempotent("/v1/runs", {}, key="k", action="train")).code is \
        ErrorCode.OUTCOME_UNKNOWN
    assert [c[0] for c in transport.calls] == ["POST", "GET", "POST"]
    assert clock.now == pytest.approx(31.0)


def test_in_flight_answers_until_the_deadline_end_with_in_flight():
    clock, transport, client = world(0.6, failed(ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT), max_attempts=10)
    error = error_of(lambda: client.post_idempotent("/v1/runs", {}, key="k", action="train"))
    assert (error.code, error.retryable) == (ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT, True)
    assert clock.sleeps == [0.25] and len(transport.calls) == 2  # the 0.5 s pause would overrun 0.6 s


@pytest.mark.parametrize("left,attempted", [(0.0, False), (-1.0, False), (1e-9, True)])
def test_an_attempt_needs_time_left(left, attempted):
    clock, transport, client = world(left, ok(RUN))
    if attempted:
        assert client.get("/v1/runs/x") == RUN
    else:
        error = error_of(lambda: client.get("/v1/runs/x"))
        assert (error.code, error.live_api_contacted) == (ErrorCode.TIMEOUT, False)
    assert len(transport.calls) == int(attempted)


@pytest.mark.parametrize("left_after_first,slept", [(0.25, False), (0.2500001, True), (0.2499999, False)])
def test_a_pause_as_long_as_the_time_left_is_not_taken(left_after_first, slept):
    # The first attempt is refused at once; the pause before the second is 0.25 s (Upper).
    clock, transport, client = world(left_after_first, REFUSED, ok(RUN))
    if slept:
        assert client.get("/v1/runs/x") == RUN
        assert clock.sleeps == [0.25]
    else:
        assert error_of(lambda: client.get("/v1/runs/x")).code is ErrorCode.TIMEOUT
        assert clock.sleeps == [] and len(transport.calls) == 1


def test_restart_gives_a_fresh_deadline():
    clock = Clock()
    deadline = Deadline(5.0, clock=clock)
    clock.now = 7.0
    assert deadline.left() == -2.0
    deadline.restart(3.0)
    assert deadline.left() == 3.0
    clock.now = 10.0
    assert deadline.left() == 0.0


def test_a_client_without_a_deadline_is_bounded_by_its_attempts_only():
    transport = Transport(Clock(), Deadline(float("inf")), REFUSED)
    client = ApiClient(transport, sleep=lambda _s: None)
    assert client.deadline.left() == float("inf")
    assert error_of(lambda: client.get("/v1/runs/x")).code is ErrorCode.API_UNREACHABLE
    assert len(transport.calls) == 3


# --- full jitter ----------------------------------------------------------------------------------


def test_each_pause_is_drawn_from_zero_to_the_capped_exponential():
    rng = Upper()
    clock, transport, client = world(1000.0, REFUSED, rng=rng, max_attempts=8, backoff_s=0.25, backoff_cap_s=4.0)
    error_of(lambda: client.get("/v1/runs/x"))
    # 0.25 x 2^k, capped at 4 s: exactly at the cap for k = 4, capped for k = 5 and 6
    assert rng.ranges == [(0.0, 0.25), (0.0, 0.5), (0.0, 1.0), (0.0, 2.0), (0.0, 4.0), (0.0, 4.0), (0.0, 4.0)]
    assert clock.sleeps == [0.25, 0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_the_cap_one_step_below_and_above_the_exponential():
    for cap, ceilings in ((3.9999, [0.25, 0.5, 1.0, 2.0, 3.9999]), (4.0001, [0.25, 0.5, 1.0, 2.0, 4.0])):
        rng = Upper()
        _clock, _transport, client = world(1000.0, REFUSED, rng=rng, max_attempts=6, backoff_cap_s=cap)
        error_of(lambda: client.get("/v1/runs/x"))
        assert [high for _low, high in rng.ranges] == ceilings


@pytest.mark.parametrize("seed", range(8))
def test_seeded_draws_stay_within_each_attempts_bounds(seed):
    clock, transport, client = world(10_000.0, REFUSED, rng=random.Random(seed), max_attempts=12,
                                     backoff_s=0.25, backoff_cap_s=4.0)
    error_of(lambda: client.get("/v1/runs/x"))
    assert len(clock.sleeps) == 11
    for attempt, pause in enumerate(clock.sleeps):
        assert 0.0 <= pause <= min(4.0, 0.25 * 2 ** attempt)
    # full jitter, not equal jitter: the draws reach the lower half of their ranges
    assert any(pause < min(4.0, 0.25 * 2 ** a) / 2 for a, pause in enumerate(clock.sleeps))


def test_the_same_seed_gives_the_same_pauses_and_another_seed_others():
    def pauses(seed):
        clock, _t, client = world(1000.0, REFUSED, rng=random.Random(seed), max_attempts=6)
        error_of(lambda: client.get("/v1/runs/x"))
        return clock.sleeps
    assert pauses(1) == pauses(1) and pauses(1) != pauses(2)


def test_the_lower_end_of_the_range_is_no_pause_at_all():
    class Lower(Upper):
        def uniform(self, low, high):
            super().uniform(low, high)
            return low
    clock, _t, client = world(1000.0, REFUSED, ok(RUN), rng=Lower())
    assert client.get("/v1/runs/x") == RUN and clock.sleeps == [0.0]


# --- the real transport: socket timeouts cut to the deadline ------------------------------------


def hung_server():
    """A loopback socket that accepts every connection and never answers."""
    return fake_api_holding("silent")


def test_the_read_timeout_is_cut_to_the_time_left():
    with hung_server() as (url, held):
        port = int(url.rsplit(":", 1)[1])
        transport = HttpTransport(Endpoint("http", "127.0.0.1", port), None, connect_timeout_s=3.0,
                                  total_timeout_s=30.0, deadline=Deadline(0.4))
        started = time.monotonic()
        with pytest.raises(NoAnswer) as info:
            transport.request("GET", "/v1/runs/x", None)
        elapsed = time.monotonic() - started
    assert info.value.timed_out and 0.35 <= elapsed < 1.5


@pytest.mark.parametrize("left,connect_timeout", [(1.25, 1.25), (3.0, 3.0), (3.0001, 3.0), (60.0, 3.0)])
def test_the_connect_timeout_is_cut_to_the_time_left(monkeypatch, left, connect_timeout):
    clock = Clock()
    asked: list[float] = []

    def create_connection(address, timeout=None, *args, **kwargs):
        asked.append(timeout)
        raise ConnectionRefusedError

    monkeypatch.setattr(socket, "create_connection", create_connection)
    transport = HttpTransport(Endpoint("http", "127.0.0.1", 9), None, connect_timeout_s=3.0, total_timeout_s=30.0,
                              deadline=Deadline(left, clock=clock))
    with pytest.raises(NotDelivered) as info:
        transport.request("GET", "/v1/runs/x", None)
    assert asked == [connect_timeout] and info.value.timed_out is False


@pytest.mark.parametrize("left", [0.0, -0.5])
def test_no_connection_is_opened_once_the_deadline_passed(monkeypatch, left):
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("connected"))
    transport = HttpTransport(Endpoint("http", "127.0.0.1", 9), None, connect_timeout_s=3.0, total_timeout_s=30.0,
                              deadline=Deadline(left, clock=Clock()))
    with pytest.raises(NotDelivered) as info:
        transport.request("GET", "/v1/runs/x", None)
    assert info.value.timed_out is True


# --- the CLI: --timeout, and a real hung API ----------------------------------------------------


def parsed_timeout(*argv: str) -> float:
    return cli.build_parser().parse_args(list(argv)).timeout


def test_the_default_timeout_and_both_positions_of_the_flag():
    assert cli.DEFAULT_TIMEOUT_S == 120.0
    assert parsed_timeout("status", "run_x") == 120.0
    assert parsed_timeout("--timeout", "2", "status", "run_x") == 2.0
    assert parsed_timeout("status", "run_x", "--timeout", "2.5") == 2.5
    assert parsed_timeout("--timeout", "9", "desk", "proposals", "list", "run_x") == 9.0  # not reset by a subcommand
    assert parsed_timeout("desk", "proposals", "list", "run_x", "--timeout", "7") == 7.0
    assert "default 120" in cli.TIMEOUT_HELP


@pytest.mark.parametrize("value,ok", [("0", False), ("-1", False), ("1e-9", True), ("3600", True),
                                      ("3600.000001", False), ("nan", False), ("inf", False), ("abc", False),
                                      ("", False)])
def test_timeout_bounds(value, ok):
    if ok:
        assert parsed_timeout("--timeout", value, "status", "run_x") == float(value)
    else:
        for argv in (["--timeout", value, "status", "run_x"], ["status", "run_x", "--timeout", value]):
            document, status = cli.run([*argv, "--json"])
            assert status == 2 and document["error"]["code"] == "USAGE_ERROR"
            if len(value) >= 3:  # "0" or "-1" would be found inside the message's own "above 0"
                assert value not in document["error"]["message"]


RUN_ID = "run_" + "0" * 26
REF = "cfr_" + "0" * 26


@pytest.fixture
def root(tmp_path) -> Path:
    return Path(os.path.realpath(tmp_path))  # the manifest reader refuses symlinked parents


@pytest.fixture
def client_env(root) -> dict[str, str]:
    token = root / "token"
    token.write_text("ito_acct_" + "a" * 43 + "\n")  # well-formed; a hung API never checks it
    token.chmod(0o600)
    return {"ITO_TOKEN_FILE": str(token)}


def ito(env: dict[str, str], *argv: str) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "ito_assets.api.cli", *argv], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=60)
    return done, time.monotonic() - started


# Beyond the deadline: the same command's start and exit, measured in the same test with `--help`
# (on a loaded CI machine an interpreter start took 2.7 s), and seconds for the verb's own work
# (`train` verifies its manifest: 1.7 s of it on a clean clone's loaded 2-core VM, 2026-12-07). A
# client without its deadline waits for the hung server to the test's 60 s.
SLACK_S = 3.0


def startup_seconds(env: dict[str, str]) -> float:
    """An interpreter start, the client's imports and its exit: `ito --help`, now, on this machine."""
    done, elapsed = ito(env, "--help")
    assert done.returncode == 0, done.stderr
    return elapsed


@pytest.mark.parametrize("verb", ["status", "train"])
def test_a_hung_api_is_given_up_within_the_timeout(root, client_env, verb):
    argv = (["status", RUN_ID] if verb == "status" else
            ["train", "--booking", "bkg_x", "--manifest", write_manifest(root / "m.json", valid_manifest()),
             "--confirmation-ref", REF, "--idempotency-key", "deadline-key-0001"])
    startup = startup_seconds(client_env)
    with hung_server() as (url, held):
        done, elapsed = ito({**client_env, "ITO_API_URL": url}, "--timeout", "1.5", *argv, "--json")
        connections = len(held)
    document = envelope_of(done)
    expected = "TIMEOUT" if verb == "status" else "OUTCOME_UNKNOWN"
    assert done.returncode == 1 and document["error"]["code"] == expected, done.stderr
    assert 1.5 <= elapsed < 1.5 + startup + SLACK_S
    assert connections == 1  # the first request used the whole deadline: no retry, no lookup left


def test_watch_bounds_each_poll_by_the_timeout_and_the_watch_by_max_wait(client_env):
    startup = startup_seconds(client_env)
    with hung_server() as (url, held):
        done, elapsed = ito({**client_env, "ITO_API_URL": url}, "status", RUN_ID, "--watch", "--interval", "1",
                            "--max-wait", "2.5", "--timeout", "1", "--json")
        connections = len(held)
    assert envelope_of(done)["error"]["code"] == "TIMEOUT"
    # a 1 s poll, a 1 s pause, then a poll cut to the 0.5 s that --max-wait leaves
    assert connections == 2 and 2.5 <= elapsed < 2.5 + startup + SLACK_S


def test_in_process_the_operation_itself_takes_the_timeout(client_env, monkeypatch):
    with hung_server() as (url, _held):
        monkeypatch.setenv("ITO_API_URL", url)
        monkeypatch.setenv("ITO_TOKEN_FILE", client_env["ITO_TOKEN_FILE"])
        started = time.monotonic()
        document, status = cli.run(["status", RUN_ID, "--timeout", "0.8", "--json"])
        elapsed = time.monotonic() - started
    assert status == 1 and document["error"]["code"] == "TIMEOUT" and document["live_api_contacted"] is True
    assert 0.8 <= elapsed < 1.3


def envelope_of(done: subprocess.CompletedProcess) -> dict:
    import json

    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, (done.stdout, done.stderr)
    return json.loads(lines[0])
