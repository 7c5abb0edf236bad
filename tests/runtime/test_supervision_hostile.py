"""The supervision's files and streams when they are tampered with, corrupt, huge or hostile:
heartbeats, spike proposals, the metrics relay and the spike detector. Each must be skipped or
refused, never crash or block the supervisor, and never keep a hung rank alive."""

from __future__ import annotations

import json
import math
import os
import threading
import tracemalloc
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.runtime.supervision import heartbeat, proposals
from ito_assets.runtime.supervision.proposals import ProposalState, ProposalStore, ProposedAction
from ito_assets.runtime.supervision.spikes import RollingDetector, Spike, SpikeConfig, SpikeDetector
from ito_assets.runtime.supervision import supervisor as supervisor_module
from ito_assets.runtime.supervision.relay import MAX_LINE_BYTES, MetricsRelay
from ito_assets.runtime.supervision.supervisor import AttemptEnd, Supervisor, SupervisorConfig
from runtime_helpers import Recorder, worker_config

pytestmark = pytest.mark.timeout(60)

T0 = 1_000_000.0


def _beat(rank: int = 0, **changes) -> dict:
    beat = heartbeat.Heartbeat(rank=0, pid=os.getpid(), attempt=0, step=4, phase="training", at=T0)
    return {**asdict(beat), "rank": rank, **changes}


def _write(folder: Path, name: str, content: dict | bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    return path


# --- heartbeats --------------------------------------------------------------------------------


def test_a_fifo_in_place_of_a_heartbeat_never_blocks_the_poll(tmp_path: Path) -> None:
    folder = tmp_path / "heartbeats"
    _write(folder, "rank0.json", _beat(0))
    os.mkfifo(folder / "rank1.json")
    found: list[dict] = []
    reader = threading.Thread(target=lambda: found.append(heartbeat.read_all(folder)), daemon=True)
    reader.start()
    reader.join(timeout=5)
    blocked = reader.is_alive()
    if blocked:  # free the reader: a writer opening the FIFO ends its wait
        os.close(os.open(folder / "rank1.json", os.O_WRONLY | os.O_NONBLOCK))
    assert not blocked, "reading the heartbeats blocked on a FIFO"
    assert list(found[0]) == [0]


@pytest.mark.parametrize("content", [
    b"{", b"", b"\xff\xfe", b"[" * 100_000, b"[]", b'"rank"',
    json.dumps(_beat(at=float("nan"))).encode(), json.dumps(_beat(at=float("inf"))).encode(),
    json.dumps(_beat(step="4")).encode(), json.dumps(_beat(rank=True)).encode(),
    json.dumps(_beat(phase=None)).encode(), json.dumps(_beat(step=-7)).encode(),
    json.dumps(_beat(extra=1)).encode(), json.dumps(_beat(rank=1)).encode(),  # rank 1 in rank0.json
], ids=["truncated", "empty", "binary", "deep", "list", "string", "nan-at", "inf-at", "str-step", "bool-rank",
        "null-phase", "negative-step", "extra-field", "other-rank"])
def test_a_heartbeat_that_is_no_heartbeat_is_skipped(tmp_path: Path, content: bytes) -> None:
    folder = tmp_path / "heartbeats"
    _write(folder, "rank0.json", content)
    _write(folder, "rank2.json", _beat(2))
    assert list(heartbeat.read_all(folder)) == [2]


def test_links_directories_and_huge_files_are_not_heartbeats(tmp_path: Path) -> None:
    folder, elsewhere = tmp_path / "heartbeats", tmp_path / "elsewhere"
    (folder / "rank0.json").parent.mkdir(parents=True)
    (folder / "rank0.json").symlink_to(_write(elsewhere, "rank0.json", _beat(0)))  # speaks for another folder
    (folder / "rank1.json").mkdir()
    _write(folder, "rank2.json", json.dumps(_beat(2)).encode() + b" " * (heartbeat.MAX_BYTES + 1))
    _write(folder, "rank3.json", _beat(3))
    assert list(heartbeat.read_all(folder)) == [3]


@dataclass
class _Attempt:
    number: int
    launched_at: float

    def exit_code(self) -> None:
        return None  # running


def _watched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Supervisor, SimpleNamespace]:
    """A supervisor polling a running attempt of one rank, its clock the test's (1 s per poll)."""
    clock = SimpleNamespace(now=T0)
    monkeypatch.setattr(supervisor_module, "time", SimpleNamespace(time=lambda: clock.now))
    worker = worker_config(tmp_path, (tmp_path / "train.npy", tmp_path / "heldout.npy"))
    config = SupervisorConfig(hang_timeout_s=3.0, startup_timeout_s=5.0, poll_interval_s=1.0)
    return Supervisor(worker=worker, config=config, backend=SimpleNamespace()), clock


def test_a_heartbeat_from_the_future_does_not_keep_a_hung_rank_alive(tmp_path, monkeypatch) -> None:
    supervisor, clock = _watched(tmp_path, monkeypatch)
    folder, attempt = Path(supervisor.worker.heartbeat_dir), _Attempt(number=0, launched_at=T0)
    _write(folder, "rank0.json", _beat(0, at=T0 + 3600.0))  # the rank's clock an hour ahead; then it hangs
    kinds = []
    for _ in range(6):
        clock.now += 1.0
        kinds.append(supervisor._poll(attempt).kind)
    # first seen at T0 + 1 s; stale past the 3 s bound on the supervisor's clock at T0 + 5 s
    assert kinds == [None] * 4 + [AttemptEnd.HUNG] * 2


def test_a_heartbeat_from_the_past_does_not_kill_a_healthy_rank(tmp_path, monkeypatch) -> None:
    supervisor, clock = _watched(tmp_path, monkeypatch)
    folder, attempt = Path(supervisor.worker.heartbeat_dir), _Attempt(number=0, launched_at=T0)
    for step in range(10):  # the rank's clock an hour behind; it beats at every poll
        clock.now += 1.0
        _write(folder, "rank0.json", _beat(0, step=step, at=clock.now - 3600.0))
        assert supervisor._poll(attempt).kind is None


# --- the metrics relay -------------------------------------------------------------------------


def _relay(tmp_path: Path) -> tuple[MetricsRelay, Recorder, Path]:
    path, recorder = tmp_path / "metrics.jsonl", Recorder()
    return MetricsRelay(path, recorder), recorder, path


def _good(step: int) -> bytes:
    return json.dumps({"kind": "metrics", "step": step, "loss": 2.0}).encode() + b"\n"


@pytest.mark.parametrize("line", [b"[" * 100_000, b'{"kind": "metrics", "step": Infinity}',
                                  b'{"kind": "metrics", "step": 1e999}', b"\x00\x00\xff binary \x00"],
                         ids=["deep", "infinite-step", "overflowing-step", "binary"])
def test_a_hostile_line_is_skipped_and_the_supervision_goes_on(tmp_path: Path, line: bytes) -> None:
    relay, recorder, path = _relay(tmp_path)
    path.write_bytes(line + b"\n" + _good(3))
    assert relay.forward() == 1 and relay.num_skipped == 1 and recorder.metrics_seen == [(3, {"loss": 2.0})]


def test_a_huge_line_without_a_newline_is_never_held_whole(tmp_path: Path) -> None:
    relay, recorder, path = _relay(tmp_path)
    size = 16 * MAX_LINE_BYTES
    with path.open("wb") as handle:
        handle.write(_good(1) + b"x" * size)  # a writer that never ends its line
    rest = b"y" * size + b"\n" + _good(2)  # made before the count starts: the test's bytes, not the relay's
    tracemalloc.start()
    try:
        assert relay.forward() == 1
        with path.open("ab") as handle:
            handle.write(rest)
        assert relay.forward() == 1
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * MAX_LINE_BYTES, peak
    assert [s for s, _ in recorder.metrics_seen] == [1, 2] and relay.num_skipped == 1
    assert relay.offset == path.stat().st_size


def test_a_line_shaped_as_a_pipes_message_forges_nothing(tmp_path: Path) -> None:
    """The relay sends only log lines and custom messages: whatever rank 0's file holds, it never
    becomes a materialization or a check result."""
    relay, recorder, path = _relay(tmp_path)
    forged = {"__dagster_pipes_version": "0.1", "method": "report_asset_materialization",
              "params": {"asset_key": "x", "metadata": {}, "data_version": None}}
    path.write_bytes(json.dumps(forged).encode() + b"\n"
                     + json.dumps({"kind": "metrics", "step": 1, "method": "report_asset_check"}).encode() + b"\n")
    assert relay.forward() == 1 and relay.num_skipped == 1
    assert recorder.metrics_seen == [(1, {"method": "report_asset_check"})]  # a custom message's payload


# --- spike proposals ---------------------------------------------------------------------------


def _proposal(stage_dir: Path, *, value: float = 9.0, std: float = 0.1) -> ProposedAction:
    spike = Spike(step=40, metric="loss", value=value, mean=3.0, std=std)
    made = proposals.propose(spike, run_key="run_a", stage=stage_dir.name, restart_from_step=30, skip_first=31,
                             skip_end=41)
    return ProposalStore(stage_dir).add(made)


def _stored(made: ProposedAction, **changes) -> bytes:
    return json.dumps({**asdict(made), "state": made.state.value, **changes}).encode()


@pytest.mark.parametrize("content", [
    b"{", b"", b"\xff", b"[" * 100_000, b"[]", b'{"proposal_id": "spk_0"}',
    "restart-as-text", "restart-as-float", "state-unknown",
], ids=["truncated", "empty", "binary", "deep", "list", "partial", "restart-as-text", "restart-as-float",
        "state-unknown"])
def test_a_proposal_file_that_is_no_proposal_never_stops_the_supervisor_or_the_desk(tmp_path, content) -> None:
    stage_dir = tmp_path / "run_a" / "pretraining"
    good = _proposal(stage_dir)
    ProposalStore(stage_dir).decide(good.proposal_id, approve=True, actor="desk")
    bad_id = "spk_" + "0" * 16
    if isinstance(content, str):
        changes = {"restart-as-text": {"restart_from_step": "0"}, "restart-as-float": {"restart_from_step": 0.5},
                   "state-unknown": {"state": "approved!"}}[content]
        content = _stored(replace(good, proposal_id=bad_id), **changes)
    (stage_dir / proposals.FOLDER_NAME / f"{bad_id}.json").write_bytes(content)
    (stage_dir / proposals.FOLDER_NAME / "spk_stray.json").write_bytes(b"{")  # not even an id
    assert proposals.approved_restart(stage_dir).proposal_id == good.proposal_id
    assert [p.proposal_id for p in proposals.in_run(tmp_path / "run_a")] == [good.proposal_id]
    assert ProposalStore(stage_dir).pending() == []
    with pytest.raises(ItoError) as refused:
        proposals.decide_in_run(tmp_path / "run_a", bad_id, approve=True, actor="desk")
    assert refused.value.code is ErrorCode.PROPOSAL_NOT_FOUND


def test_a_proposal_planted_as_a_link_or_a_copy_is_not_one(tmp_path: Path) -> None:
    other_dir, stage_dir = tmp_path / "run_b" / "pretraining", tmp_path / "run_a" / "pretraining"
    other, own = _proposal(other_dir), _proposal(stage_dir)  # another run's, this run's
    folder = stage_dir / proposals.FOLDER_NAME
    (folder / f"{other.proposal_id}.json").symlink_to(ProposalStore(other_dir).path(other.proposal_id))
    copy_id = "spk_" + "1" * 16
    (folder / f"{copy_id}.json").write_bytes(ProposalStore(stage_dir).path(own.proposal_id).read_bytes())
    assert [p.proposal_id for p in ProposalStore(stage_dir).all()] == [own.proposal_id]
    for planted in (other.proposal_id, copy_id):
        with pytest.raises(ItoError) as refused:
            proposals.decide_in_run(tmp_path / "run_a", planted, approve=True, actor="desk")
        assert refused.value.code is ErrorCode.PROPOSAL_NOT_FOUND
    assert ProposalStore(other_dir).get(other.proposal_id).state is ProposalState.PENDING  # not decided through it


def test_a_fifo_in_the_proposals_folder_never_blocks(tmp_path: Path) -> None:
    stage_dir = tmp_path / "pretraining"
    own = _proposal(stage_dir)
    fifo = stage_dir / proposals.FOLDER_NAME / f"spk_{'2' * 16}.json"
    os.mkfifo(fifo)
    found: list[list] = []
    reader = threading.Thread(target=lambda: found.append(ProposalStore(stage_dir).all()), daemon=True)
    reader.start()
    reader.join(timeout=5)
    blocked = reader.is_alive()
    if blocked:  # free the reader: a writer opening the FIFO ends its wait
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert not blocked, "listing the proposals blocked on a FIFO"
    assert [p.proposal_id for p in found[0]] == [own.proposal_id]


@pytest.mark.parametrize("value, std", [(float("nan"), float("nan")), (float("inf"), float("nan")), (9.0, 0.0)],
                         ids=["nan-loss", "infinite-loss", "flat-history"])
def test_a_non_finite_spike_is_listed_to_the_desk_as_strict_json(tmp_path: Path, value: float, std: float) -> None:
    stage_dir = tmp_path / "pretraining"
    made = _proposal(stage_dir, value=value, std=std)
    shown = made.as_dict()
    json.dumps(shown, allow_nan=False)  # what the API's envelope requires
    assert (shown["value"] is None) != math.isfinite(value) and shown["z_score"] is None
    stored = ProposalStore(stage_dir).get(made.proposal_id)  # the file keeps the figure itself
    assert (math.isnan(stored.value) if math.isnan(value) else stored.value == value) and stored.z_score == math.inf


def test_concurrent_decisions_decide_once(tmp_path: Path) -> None:
    stage_dir = tmp_path / "pretraining"
    made = _proposal(stage_dir)
    outcomes: list[str] = []

    def decide(approve: bool) -> None:
        try:
            outcomes.append(proposals.decide(stage_dir, made.proposal_id, approve=approve, actor="desk").state.value)
        except ItoError as error:
            outcomes.append(error.code.value)

    threads = [threading.Thread(target=decide, args=(i % 2 == 0,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    decided = [o for o in outcomes if o != "PROPOSAL_ALREADY_DECIDED"]
    assert len(decided) == 1 and ProposalStore(stage_dir).get(made.proposal_id).state.value == decided[0]


# --- the spike detector ------------------------------------------------------------------------


def test_a_loss_near_the_float_limit_in_the_window_never_raises(tmp_path: Path) -> None:
    config = SpikeConfig(window=30, min_history=20)
    detector = RollingDetector("loss", config)
    assert detector.observe(0, 1e308) is None  # before min_history: taken into the window unjudged
    for step in range(1, 40):
        assert detector.observe(step, 3.0) is None  # judged against it: no spike, no OverflowError
    assert detector.observe(40, 30.0) is not None  # once it left the window, spikes are seen again


def test_a_restored_window_drops_non_finite_values(tmp_path: Path) -> None:
    detector = SpikeDetector(SpikeConfig(window=30, min_history=20))
    noisy = [3.0 + 0.01 * (i % 3) for i in range(25)]
    detector.restore({"loss": [float("nan"), "inf", *noisy, float("-inf")], "grad_norm": noisy})
    assert detector.state()["loss"] == noisy
    assert detector.observe(100, 30.0, 3.0).metric == "loss"  # a NaN kept would have hidden this spike


def test_a_stray_file_named_like_an_attempt_log_is_no_attempt(tmp_path, monkeypatch):
    supervisor, _ = _watched(tmp_path, monkeypatch)
    supervisor.stage_dir.mkdir(parents=True)
    for name in ("attempt-0.json", "attempt-4.json", "attempt-notes.json", "attempt-.json", "attempt-7-old.json",
                 "attempt-١٢.json"):
        (supervisor.stage_dir / name).write_text("{}")
    assert supervisor._next_attempt_number() == 5


def test_the_outcome_line_is_for_a_person_at_a_terminal_not_for_pipes(monkeypatch, capsys) -> None:
    """Under Pipes the stage reads the report file; the line reached `make run`'s terminal among
    its progress lines."""
    from ito_assets.runtime.worker.reporting import PIPES_CONTEXT_ENV_VAR

    summary = {"stage": "pretraining", "outcome": "succeeded", "num_attempts": 1}
    monkeypatch.delenv(PIPES_CONTEXT_ENV_VAR, raising=False)
    supervisor_module.print_outcome(summary)
    assert json.loads(capsys.readouterr().out) == summary
    monkeypatch.setenv(PIPES_CONTEXT_ENV_VAR, "e30=")
    supervisor_module.print_outcome(summary)
    assert capsys.readouterr().out == ""
