"""The whole flow of docs/api.md through the client against a real server."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import bound_pair_steps


def test_desk_books_account_confirms_desk_approves_train_status_logs_cancel_cleanup(api) -> None:
    booking = api.booking()
    manifest = api.manifest()
    requested = api.ok("confirm", "request", "--action", "train", "--booking", booking, "--manifest", manifest)
    binding = requested["binding"]
    assert binding["action"] == "train" and binding["booking_id"] == booking and not binding["approved"]
    assert binding["cost_cents"] == 100 * 8 * 48
    shown = api.ok("desk", "show", requested["confirmation_ref"], token="desk")
    assert shown["manifest_digest"] == binding["manifest_digest"]
    api.approve(requested["confirmation_ref"], binding["cost_cents"])
    run = api.ok("train", "--booking", booking, "--manifest", manifest, "--confirmation-ref",
                 requested["confirmation_ref"], "--idempotency-key", "flow-train-0001")
    assert run["state"] == "queued" and run["manifest_sha256"] == binding["manifest_digest"]
    assert set(run) >= {"run_id", "booking_id", "manifest_sha256", "idempotency_key", "state"}
    assert api.ok("status", run["run_id"])["state"] == "queued"
    assert api.ok("status", "--idempotency-key", "flow-train-0001")["run_id"] == run["run_id"]
    assert api.ok("logs", run["run_id"])["logs"] == []
    assert api.ok("metrics", run["run_id"])["metrics"] == []
    assert api.ok("checkpoints", run["run_id"])["checkpoints"] == []
    cancel_ref = api.ok("confirm", "request", "--action", "cancel", "--run", run["run_id"])["confirmation_ref"]
    api.approve(cancel_ref)
    cancelled = api.ok("cancel", run["run_id"], "--confirmation-ref", cancel_ref, "--idempotency-key", "flow-cancel-01")
    assert cancelled["state"] == "cancelled"
    cleanup_ref = api.ok("confirm", "request", "--action", "cleanup")["confirmation_ref"]
    api.approve(cleanup_ref)
    report = api.ok("cleanup", "--confirmation-ref", cleanup_ref, "--idempotency-key", "flow-clean-001")
    assert report["num_runs_cleaned"] >= 1 and report["bookings_changed"] == []
    bookings = api.ok("desk", "bookings", "list", token="desk")["bookings"]
    assert next(b for b in bookings if b["booking_id"] == booking)["state"] == "completed"


def test_readiness_lists_every_gate_and_lifecycle_operation(api) -> None:
    data = api.ok("readiness", token=None)
    names = {c["name"] for c in data["capabilities"]}
    assert {"entitlement", "confirmation", "idempotency", "status", "logs", "cancel", "cleanup"} <= names
    assert data["ready"] is True


def test_client_verbs_import_no_dagster_torch_or_polars(api) -> None:
    """Client verbs start fast; heavy packages load lazily, if ever."""
    _booking, run = api.started_run()
    probe = ("import sys; from ito_assets.api import cli; doc, _ = cli.run(sys.argv[1:]); assert doc['ok'], doc; "
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'dagster', 'torch', 'polars'}))")
    for argv in (["status", run, "--json"], ["logs", run, "--json"], ["readiness", "--json"]):
        env = {**os.environ, **{k: v for k, v in api.env("account").items() if v is not None}}
        done = subprocess.run([sys.executable, "-c", probe, *argv], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-500:]
        assert done.stdout.strip() == "[]"


def test_the_server_imports_no_dagster_torch_or_polars() -> None:
    """`ito serve` starts in a second (the desk's routes read the runtime's folders without torch)."""
    probe = ("import sys; import ito_assets.api.server, ito_assets.api.routes; "
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'dagster', 'torch', 'polars'}))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-500:]
    assert done.stdout.strip() == "[]"


def test_cleanup_releases_a_booking_only_when_separately_confirmed(api) -> None:
    booking = api.booking()
    release_ref = api.ok("confirm", "request", "--action", "release", "--booking", booking)["confirmation_ref"]
    cleanup_ref = api.ok("confirm", "request", "--action", "cleanup")["confirmation_ref"]
    api.approve(cleanup_ref)
    refused = api.ito("cleanup", "--confirmation-ref", cleanup_ref, "--idempotency-key", "release-clean-01",
                      "--release-booking", booking, "--release-confirmation-ref", release_ref)
    assert refused["error"]["code"] == "CONFIRMATION_NOT_APPROVED"
    api.approve(release_ref)
    report = api.ok("cleanup", "--confirmation-ref", cleanup_ref, "--idempotency-key", "release-clean-01",
                    "--release-booking", booking, "--release-confirmation-ref", release_ref)
    assert report["bookings_changed"] == [{"booking_id": booking, "state": "released"}]
    listed = api.ok("desk", "bookings", "list", token="desk")["bookings"]
    assert next(b for b in listed if b["booking_id"] == booking)["state"] == "released"


def test_planning_post_training_imports_no_dagster_torch_or_polars(api) -> None:
    """Gate 5 reads the recipe's pair files per quote, and an offline `ito plan` on this machine: both
    stay off the data plane's and the trainer's libraries."""
    steps = bound_pair_steps(api.server.data_root)
    manifest = api.manifest(post_training=[*steps, {"kind": "rlvr"}])
    flags = ["--gpu-type", "H100-SXM", "--nodes", "1", "--gpus-per-node", "8", "--network", "infiniband",
             "--price-cents-per-gpu-hour", "250"]
    heavy = "print(sorted({m.split('.')[0] for m in sys.modules} & {'dagster', 'torch', 'polars'}))"
    probes = [
        ("import sys; from ito_assets.api import cli; doc, _ = cli.run(sys.argv[1:]); assert doc['ok'], doc; "
         "assert doc['data']['plan']['post_training_included'], doc; " + heavy,
         ["plan", "--booking", "bkg_1", "--manifest", manifest, *flags, "--json"]),
        ("import sys; from pathlib import Path; from ito_assets.manifest.verify import verify_manifest; "
         "from ito_assets.posttraining.plan import read_pair_shapes; "
         "shapes = read_pair_shapes(verify_manifest(sys.argv[1], max_bytes=1 << 20).manifest.post_training, "
         "Path(sys.argv[2])); assert set(shapes) == {'sft', 'dpo'}; " + heavy,
         [manifest, str(api.server.data_root)]),
    ]
    for probe, argv in probes:
        env = {**os.environ, **{k: v for k, v in api.env("account").items() if v is not None},
               "ITO_DATA_ROOT": str(api.server.data_root)}
        done = subprocess.run([sys.executable, "-c", probe, *argv], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-800:]
        assert done.stdout.strip().splitlines()[-1] == "[]"
