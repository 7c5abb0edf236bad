"""The one ledger publisher: a finished stage's checkpoints and metrics are written once, and
publishing again (a retried step) adds only what the run does not have yet."""

from __future__ import annotations

import inspect

from test_lifecycle import make_run

from ito_assets.control import telemetry
from ito_assets.control.telemetry import FinishedCheckpoint


def test_publishing_again_adds_only_what_is_new_and_the_first_value_stands(world) -> None:
    run = make_run(world)
    first = [FinishedCheckpoint(step=10, path="step-10", size_bytes=100, sha256="a" * 64)]
    assert telemetry.publish(world.ledger, run.run_id, first, [(10, "s/loss", 2.5), (10, "s/eval", 1.0)]) == (1, 2)
    again = first + [FinishedCheckpoint(step=20, path="step-20", size_bytes=200)]
    assert telemetry.publish(world.ledger, run.run_id, again, [(10, "s/loss", 9.0), (20, "s/loss", 2.0)]) == (1, 1)
    listed = telemetry.every_page(telemetry.checkpoints, world.ledger, run.run_id)
    assert [(c.step, c.path, c.size_bytes, c.sha256) for c in listed] == [(10, "step-10", 100, "a" * 64), (20, "step-20", 200, None)]
    metrics = telemetry.every_page(telemetry.metrics, world.ledger, run.run_id)
    assert [(m.step, m.name, m.value) for m in metrics] == [(10, "s/loss", 2.5), (10, "s/eval", 1.0), (20, "s/loss", 2.0)]


def test_a_checkpoint_is_known_by_the_fields_its_publisher_names(world) -> None:
    run = make_run(world)
    by_file = ("path", "sha256")
    one = FinishedCheckpoint(step=5, path="policy.safetensors", size_bytes=10, sha256="b" * 64)
    assert telemetry.publish(world.ledger, run.run_id, [one], [], same_checkpoint=by_file) == (1, 0)
    moved_on = FinishedCheckpoint(step=6, path="policy.safetensors", size_bytes=10, sha256="b" * 64)
    assert telemetry.publish(world.ledger, run.run_id, [moved_on], [], same_checkpoint=by_file) == (0, 0)
    rewritten = FinishedCheckpoint(step=6, path="policy.safetensors", size_bytes=11, sha256="c" * 64)
    assert telemetry.publish(world.ledger, run.run_id, [rewritten], [], same_checkpoint=by_file) == (1, 0)
    later = FinishedCheckpoint(step=7, path="policy.safetensors", size_bytes=11, sha256="c" * 64)
    assert telemetry.publish(world.ledger, run.run_id, [later], [], same_checkpoint=by_file) == (0, 0)
    assert telemetry.publish(world.ledger, run.run_id, [later], []) == (1, 0)  # by (step, path) it is new


def test_both_stage_publishers_write_through_the_one_publisher() -> None:
    from ito_assets.posttraining import publish as posttraining_publish
    from ito_assets.runtime.record import publish as runtime_publish

    for module in (runtime_publish, posttraining_publish):
        source = inspect.getsource(module)
        assert "ledger_telemetry.publish(" in source
        assert "record_checkpoint" not in source and "record_metric" not in source


def test_a_pretraining_stage_publishes_its_whole_checkpoints_and_thinned_losses_once(world, tmp_path) -> None:
    from ito_assets.runtime.record import events
    from ito_assets.runtime.checkpoint import markers
    from ito_assets.runtime.checkpoint import registry
    from ito_assets.runtime.record.publish import publish_stage

    run = make_run(world)
    stage_dir = tmp_path / "pretraining"
    for step in (10, 20):
        folder = markers.checkpoint_dir(stage_dir, step)
        folder.mkdir(parents=True)
        (folder / ".metadata").write_bytes(b"m%d" % step)
        if step == 10:  # 20 never finished: no marker, not listed
            markers.write_marker(folder, step)
        registry.append(stage_dir, registry.CheckpointRecord(
            step=step, path=str(folder), num_bytes=5, blocking_seconds=0.0, total_seconds=1.0,
            metadata_sha256="d" * 64, completed_at=0.0))
    for step in range(1, 13):
        events.append(stage_dir, events.Event(kind=events.EventKind.STEP, at=float(step), step=step, seconds=1.0, loss=10.0 - step))
    added = publish_stage(world.ledger, run.run_id, "pretraining", stage_dir, {"heldout_loss": 3.5})
    assert added == (1, 4)  # the loss at steps 10 and 12 (the last), the eval, the goodput
    assert publish_stage(world.ledger, run.run_id, "pretraining", stage_dir, {"heldout_loss": 3.5}) == (0, 0)
    (listed,) = telemetry.every_page(telemetry.checkpoints, world.ledger, run.run_id)
    assert (listed.step, listed.path, listed.size_bytes, listed.sha256) == (10, str(markers.checkpoint_dir(stage_dir, 10)), 5, "d" * 64)
    names = [(m.step, m.name) for m in telemetry.every_page(telemetry.metrics, world.ledger, run.run_id)]
    assert names == [(10, "pretraining/loss"), (12, "pretraining/loss"), (12, "pretraining/heldout_loss"), (12, "pretraining/goodput")]


def test_a_step_saved_again_with_other_bytes_is_listed_anew_and_its_old_row_marked_removed(world, tmp_path) -> None:
    """A stage published, then run again where a restart rewound past a step and saved it again
    (an approved spike restart, say): `ito checkpoints` must not keep naming bytes that are gone."""
    from ito_assets.runtime.checkpoint import markers, registry
    from ito_assets.runtime.record.publish import publish_stage

    run = make_run(world)
    stage_dir = tmp_path / "pretraining"
    folder = markers.checkpoint_dir(stage_dir, 10)
    folder.mkdir(parents=True)
    (folder / ".metadata").write_bytes(b"first save")
    markers.write_marker(folder, 10)

    def saved(digest: str) -> None:
        registry.append(stage_dir, registry.CheckpointRecord(
            step=10, path=str(folder), num_bytes=5, blocking_seconds=0.0, total_seconds=1.0,
            metadata_sha256=digest, completed_at=0.0))

    saved("d" * 64)
    assert publish_stage(world.ledger, run.run_id, "pretraining", stage_dir, {})[0] == 1
    saved("e" * 64)  # the same step saved again: other bytes in the same folder
    assert publish_stage(world.ledger, run.run_id, "pretraining", stage_dir, {})[0] == 1
    assert publish_stage(world.ledger, run.run_id, "pretraining", stage_dir, {})[0] == 0
    old, new = telemetry.every_page(telemetry.checkpoints, world.ledger, run.run_id)
    assert (old.sha256, new.sha256) == ("d" * 64, "e" * 64)
    assert old.removed_at is not None and new.removed_at is None
    # A row that names no digest (an older release's) is replaced as well; other paths are not touched.
    telemetry.record_checkpoint(world.ledger, run.run_id, step=20, path="other", size_bytes=1)
    telemetry.record_checkpoint(world.ledger, run.run_id, step=20, path="step-20", size_bytes=1)
    telemetry.record_checkpoint(world.ledger, run.run_id, step=20, path="step-20", size_bytes=1, sha256="f" * 64)
    rows = {(c.path, c.sha256): c.removed_at for c in telemetry.every_page(telemetry.checkpoints, world.ledger, run.run_id)}
    assert rows[("other", None)] is None and rows[("step-20", None)] is not None and rows[("step-20", "f" * 64)] is None
    assert rows[(str(folder), "e" * 64)] is None
