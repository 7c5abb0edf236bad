"""Rank 0's metrics file, relayed by the supervisor to its Pipes channel when ranks run remotely."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest

from ito_assets.launch.backend import BackendKind
from ito_assets.runtime.supervision.relay import MetricsRelay, open_relay
from ito_assets.runtime.worker.reporting import PIPES_CONTEXT_ENV_VAR, JsonlReporter
from runtime_helpers import Recorder


def test_forwards_whole_lines_once_and_only_those_written_after_it_started(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    rank0 = JsonlReporter(path)
    rank0.metrics(1, {"loss": 9.0})  # an earlier run of the step: not relayed again
    recorder = Recorder()
    relay = MetricsRelay(path, recorder)
    rank0.metrics(2, {"loss": 4.5, "tokens_per_second": 10.0})
    rank0.log("saved checkpoint step-2")
    with path.open("ab") as handle:  # a line rank 0 is still writing
        handle.write(json.dumps({"kind": "metrics", "step": 3, "loss": 4.0}).encode())
    assert relay.forward() == 2
    assert recorder.metrics_seen == [(2, {"loss": 4.5, "tokens_per_second": 10.0})] and recorder.logs == ["saved checkpoint step-2"]
    assert relay.forward() == 0
    with path.open("ab") as handle:
        handle.write(b"\n")
    assert relay.forward() == 1 and recorder.metrics_seen[-1] == (3, {"loss": 4.0}) and relay.num_forwarded == 3


def test_a_missing_file_is_nothing_yet(tmp_path: Path) -> None:
    assert MetricsRelay(tmp_path / "metrics.jsonl", Recorder()).forward() == 0


@pytest.mark.parametrize("backend", list(BackendKind))
def test_relays_only_for_remote_ranks_under_pipes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: BackendKind) -> None:
    monkeypatch.delenv(PIPES_CONTEXT_ENV_VAR, raising=False)
    with open_relay(backend, tmp_path / "metrics.jsonl") as relay:
        assert relay is None  # not under Pipes: nobody listens
    if backend is BackendKind.LOCAL:
        monkeypatch.setenv(PIPES_CONTEXT_ENV_VAR, "unused")
        with open_relay(backend, tmp_path / "metrics.jsonl") as relay:
            assert relay is None  # local ranks inherit the channel and report themselves


def test_a_malformed_line_is_skipped_and_the_rest_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    recorder = Recorder()
    relay = MetricsRelay(path, recorder)
    path.write_bytes(b'not json\n\xff\xfe\n["a list"]\n{"kind": "metrics"}\n' + json.dumps({"kind": "metrics", "step": 4, "loss": 2.0}).encode() + b"\n")
    assert relay.forward() == 1 and relay.num_skipped == 4 and recorder.metrics_seen == [(4, {"loss": 2.0})]


def test_the_relay_reaches_a_real_pipes_session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Dagster step opens a Pipes session; the "supervisor" (here, in the step's process, with the
    session's environment) relays a line rank 0 wrote; the step receives it as a custom message."""
    path, received = tmp_path / "metrics.jsonl", []

    @dg.asset
    def stage(context):
        with dg.open_pipes_session(context=context, context_injector=dg.PipesTempFileContextInjector(),
                                   message_reader=dg.PipesTempFileMessageReader()) as session:
            for name, value in session.get_bootstrap_env_vars().items():
                monkeypatch.setenv(name, value)
            with open_relay(BackendKind.SLURM, path) as relay:
                assert relay is not None
                JsonlReporter(path).metrics(3, {"loss": 1.5})
                assert relay.forward() == 1
        received.extend(session.get_custom_messages())
        return dg.MaterializeResult()

    assert dg.materialize([stage]).success
    assert received == [{"kind": "metrics", "step": 3, "loss": 1.5}]
