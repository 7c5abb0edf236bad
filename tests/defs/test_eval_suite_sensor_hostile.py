"""`eval_suite_changed` left alone in the daemon, tick after tick: a suite that goes to another
version and comes back, a run that read the suite after it changed again, a run the daemon created
but never submitted, a run that failed, a manifests folder that cannot be listed, a suite file that
cannot be read, a cursor it never wrote. The tick never raises, asks for nothing twice under one
key, and leaves no manifest's report on another digest than the suite's for good.

Decontamination here is a stand-in `contamination_report` asset that reads the suite file when it
runs, as the real one does (the `eval_suite` asset), and records the digest it read."""

from __future__ import annotations

import os
import uuid

import dagster as dg
import pytest

from helpers import SUITE_LINES, write_file
from ito_assets.defs.manifest.partitions import manifests_partitions
from ito_assets.defs.resources import ItoSettingsResource
from ito_assets.evals.suite import load_suite
from ito_assets.manifest import discovery
from ito_assets.manifest.secure_read import read_manifest_bytes
from sensors.eval_suite import eval_suite_changed, run_key

EXTRA = '{"id": "q3", "benchmark": "trivia", "question": "Which keyword leaves a loop early?", "answer": "break"}\n'
OTHER = '{"id": "q4", "benchmark": "trivia", "question": "Which keyword skips to the next loop turn?", "answer": "continue"}\n'
SENSOR = "eval_suite_changed"


@dg.asset(key="contamination_report", partitions_def=manifests_partitions)
def stand_in_report(context, ito: ItoSettingsResource):  # no annotations: they are strings here
    context.add_output_metadata({"eval_suite_digest": load_suite(ito.settings().eval_suite_path).digest})


class Desk:
    """One manifest, registered, its suite file, the instance; the daemon's part played by hand."""

    def __init__(self, installation, instance):
        self.installation, self.instance = installation, instance
        self.resources = {"ito": ItoSettingsResource.from_settings(installation.settings)}
        path = installation.manifest("alpha")
        self.digest = "sha256:" + read_manifest_bytes(path).sha256_hex
        self.key = self.digest.removeprefix("sha256:")[:12]
        instance.add_dynamic_partitions(manifests_partitions.name, [self.key])

    def suite(self, content: str) -> str:
        """Writes the suite as an editor that renames into place does; its digest."""
        path = self.installation.settings.eval_suite_path
        write_file(path.with_suffix(".tmp"), content)
        os.replace(path.with_suffix(".tmp"), path)
        return load_suite(path).digest

    def tick(self, cursor: str | None = None) -> dg.SensorResult:
        context = dg.build_sensor_context(instance=self.instance, resources=self.resources, sensor_name=SENSOR, cursor=cursor)
        return eval_suite_changed(context)

    def decontaminate(self, tags: dict | None = None) -> None:
        """A run that makes the partition's report: the preparation's (no tags) or a launched request's."""
        result = dg.materialize([stand_in_report], instance=self.instance, resources=self.resources,
                                partition_key=self.key, tags=tags)
        assert result.success

    def launch(self, request: dg.RunRequest) -> None:
        """What the daemon does with a request: a run under its key (unless one exists), executed."""
        assert not self.instance.get_runs(dg.RunsFilter(tags={"dagster/run_key": request.run_key})), "launched twice"
        self.decontaminate({**request.tags, "dagster/run_key": request.run_key, "dagster/sensor_name": SENSOR})

    def report_digest(self) -> str:
        record = self.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("contamination_report"), asset_partitions=[self.key]), limit=1).records[0]
        return record.asset_materialization.metadata["eval_suite_digest"].value

    def created(self, request: dg.RunRequest, status: dg.DagsterRunStatus) -> None:
        """A run the daemon created for the request and left in `status` (no event of its own)."""
        self.instance.add_run(dg.DagsterRun(job_name="decontamination_job", run_id=str(uuid.uuid4()), status=status,
                                            tags={**request.tags, "dagster/run_key": request.run_key,
                                                  "dagster/sensor_name": SENSOR}))


@pytest.fixture
def desk(installation, instance) -> Desk:
    desk = Desk(installation, instance)
    desk.decontaminate()  # prepared against the suite it was reviewed with
    return desk


def _only(result: dg.SensorResult) -> dg.RunRequest:
    (request,) = result.run_requests
    return request


def test_a_suite_that_comes_back_to_an_earlier_digest_is_decontaminated_against_it_again(desk: Desk) -> None:
    first = desk.installation.suite_digest
    assert desk.tick().run_requests == []
    second = desk.suite(SUITE_LINES + EXTRA)
    desk.launch(_only(desk.tick()))
    assert desk.report_digest() == second and desk.tick().run_requests == []
    desk.suite(SUITE_LINES + OTHER)
    desk.launch(_only(desk.tick()))
    assert desk.suite(SUITE_LINES + EXTRA) == second  # back to a digest launched for already
    again = desk.tick()
    assert [r.run_key for r in again.run_requests] == [r.run_key for r in desk.tick().run_requests]  # deterministic
    desk.launch(_only(again))  # under a key of its own: the daemon would skip a used one
    assert desk.report_digest() == second
    assert desk.tick().run_requests == []  # and not again: a restarted daemon computes the same
    assert desk.suite(SUITE_LINES) == first  # back to the reviewed one, launched for by no run
    desk.launch(_only(desk.tick()))
    assert desk.report_digest() == first and desk.tick().run_requests == []


def test_a_run_that_read_the_suite_after_it_changed_again_is_asked_for_again(desk: Desk) -> None:
    # The suite changed between the tick that asked for the run and the run's read of it, then
    # changed back: the run's report names the digest it read, not its key's.
    second = desk.suite(SUITE_LINES + EXTRA)
    request = _only(desk.tick())
    desk.suite(SUITE_LINES + OTHER)
    desk.launch(request)
    assert desk.report_digest() != second
    desk.suite(SUITE_LINES + EXTRA)
    again = _only(desk.tick())
    assert again.run_key != request.run_key and again.tags["ito/eval_suite_digest"] == second
    desk.launch(again)
    assert desk.report_digest() == second and desk.tick().run_requests == []


def test_another_suites_report_made_after_the_pairs_run_is_replaced(desk: Desk) -> None:
    # `ito data prepare` (or any run) decontaminated the partition against another suite after the
    # sensor's run for the configured one succeeded.
    second = desk.suite(SUITE_LINES + EXTRA)
    desk.launch(_only(desk.tick()))
    desk.suite(SUITE_LINES + OTHER)
    desk.decontaminate()
    assert desk.suite(SUITE_LINES + EXTRA) == second
    desk.launch(_only(desk.tick()))
    assert desk.report_digest() == second and desk.tick().run_requests == []


def test_a_run_created_but_never_submitted_is_asked_for_again_under_its_key(desk: Desk) -> None:
    # The daemon stopped between creating the run (NOT_STARTED) and submitting it: it submits such a
    # run only when a tick asks for its key again.
    desk.suite(SUITE_LINES + EXTRA)
    request = _only(desk.tick())
    desk.created(request, dg.DagsterRunStatus.NOT_STARTED)
    assert _only(desk.tick()).run_key == request.run_key


@pytest.mark.parametrize("status", [dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.FAILURE,
                                    dg.DagsterRunStatus.CANCELED])
def test_a_run_in_flight_or_ended_without_a_report_is_not_asked_for_again(desk: Desk, status) -> None:
    desk.suite(SUITE_LINES + EXTRA)
    request = _only(desk.tick())
    desk.created(request, status)
    assert desk.tick().run_requests == [] and desk.tick().run_requests == []


def test_a_manifests_folder_that_cannot_be_listed_skips_the_tick(desk: Desk, monkeypatch) -> None:
    desk.suite(SUITE_LINES + EXTRA)

    def unreadable(_folder, **_kwargs):
        raise PermissionError(13, "Permission denied", str(desk.installation.manifests_dir))

    monkeypatch.setattr(discovery, "discover", unreadable)
    result = desk.tick()
    assert result.run_requests == [] and result.skip_reason.skip_message == "the manifests folder could not be listed"
    monkeypatch.undo()
    assert len(desk.tick().run_requests) == 1  # the next tick tries again


def _half_written(path) -> None:
    path.write_bytes(SUITE_LINES.encode() + EXTRA.encode()[:30])  # written in place, caught mid-line


def _fifo(path) -> None:
    path.unlink()
    os.mkfifo(path)


def _long_name(path) -> None:
    path.unlink()
    os.symlink("x" * 300, path)  # a link whose target no system call can take (ENAMETOOLONG)


@pytest.mark.parametrize("spoil", [
    _half_written, _fifo, _long_name,
    lambda path: path.unlink(),
    lambda path: (path.unlink(), path.mkdir()),
    lambda path: (path.unlink(), os.symlink("/dev/zero", path)),
    lambda path: path.write_bytes(b"\xff\xfe" + SUITE_LINES.encode("utf-16-le")),
], ids=["half-written", "fifo", "name-too-long", "deleted", "folder", "dev-zero", "not-utf-8"])
def test_a_suite_file_that_cannot_be_read_skips_the_tick_with_its_code(desk: Desk, spoil) -> None:
    desk.suite(SUITE_LINES + EXTRA)
    spoil(desk.installation.settings.eval_suite_path)
    result = desk.tick()
    assert result.run_requests == [] and result.skip_reason.skip_message == "the eval suite cannot be read: EVAL_SUITE_INVALID"
    assert desk.report_digest() == desk.installation.suite_digest  # nothing made is touched


@pytest.mark.parametrize("cursor", [None, "", "not json", '{"digest": 7}', "sha256:" + "0" * 64])
def test_a_cursor_it_never_wrote_changes_nothing(desk: Desk, cursor) -> None:
    # The sensor keeps no cursor: one an older release or an operator set is neither read nor kept.
    desk.suite(SUITE_LINES + EXTRA)
    result = desk.tick(cursor)
    assert [r.run_key for r in result.run_requests] == [run_key(desk.digest, load_suite(desk.installation.settings.eval_suite_path).digest)]
    assert result.cursor is None


def test_many_changes_between_two_ticks_ask_for_the_last_version_alone(desk: Desk) -> None:
    for extra in (EXTRA, OTHER, EXTRA + OTHER, OTHER + EXTRA):
        last = desk.suite(SUITE_LINES + extra)
    request = _only(desk.tick())
    assert request.run_key == run_key(desk.digest, last) and request.tags["ito/eval_suite_digest"] == last


def test_the_launched_pairs_reports_are_read_in_chunks_each_pair_once(desk: Desk, monkeypatch) -> None:
    from sensors import eval_suite

    monkeypatch.setattr(eval_suite, "_QUERY_CHUNK", 1)
    beta = Desk.__new__(Desk)
    beta.__dict__ |= desk.__dict__
    path = desk.installation.manifest("beta")
    beta.digest = "sha256:" + read_manifest_bytes(path).sha256_hex
    beta.key = beta.digest.removeprefix("sha256:")[:12]
    desk.instance.add_dynamic_partitions(manifests_partitions.name, [beta.key])
    beta.decontaminate()
    second = desk.suite(SUITE_LINES + EXTRA)
    for request in desk.tick().run_requests:
        (desk if request.partition_key == desk.key else beta).launch(request)
    desk.suite(SUITE_LINES + OTHER)
    for request in desk.tick().run_requests:
        (desk if request.partition_key == desk.key else beta).launch(request)
    desk.suite(SUITE_LINES + EXTRA)
    again = desk.tick().run_requests
    assert sorted(r.partition_key for r in again) == sorted([desk.key, beta.key])
    for request in again:
        (desk if request.partition_key == desk.key else beta).launch(request)
    assert desk.report_digest() == beta.report_digest() == second and desk.tick().run_requests == []


def test_two_manifests_under_one_registered_key_are_decontaminated_by_neither(desk: Desk, monkeypatch) -> None:
    # The key is 48 bits of the digest: a second manifest can share it, and which of the two a run
    # under the key would read could not be told (the manifest sensor registers neither).
    desk.suite(SUITE_LINES + EXTRA)
    assert _only(desk.tick()).partition_key == desk.key
    twin = discovery.DiscoveredManifest(str(desk.installation.manifests_dir / "twin.json"), desk.key + "0" * 52)
    discover = discovery.discover

    def with_twin(folder, **kwargs):
        found, rejected = discover(folder, **kwargs)
        return found + [twin], rejected

    monkeypatch.setattr(discovery, "discover", with_twin)
    assert desk.tick().run_requests == []
