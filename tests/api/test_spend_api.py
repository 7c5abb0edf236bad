"""Spend through the real server and client: `ito runs list`, `ito budget`, the budget in `ito
status`, `ito desk accounts budgets`, and `ito plan` reading the booking through the API and
showing the very cost the confirmation then binds."""

from __future__ import annotations

import pytest

from helpers import bound_pair_steps, valid_manifest

HOUR = 3600
BUDGET = {"cap_cents": 3_000_000, "max_incremental_cents": 1_000_000}
COST = 100 * 8 * 48  # price x GPUs x the 48 booked hours of the harness's bookings


def _train(api, booking: str, manifest: str) -> dict:
    run = api.train(booking, manifest, api.confirm_train(booking, manifest), api.unique("key"))
    assert run["ok"], run
    return run["data"]


@pytest.fixture(scope="module")
def spent(api):
    """Two runs of one manifest on two bookings, and one run of another manifest."""
    manifest = api.manifest(budget=BUDGET)
    other = api.manifest(budget=BUDGET)
    first, second = api.booking(), api.booking()
    runs = [_train(api, first, manifest), _train(api, second, manifest), _train(api, api.booking(), other)]
    return {"manifest": manifest, "bookings": (first, second), "runs": runs}


def _listed_order(runs: list[dict]) -> list[dict]:
    """Oldest first; runs created in the same second follow their run ids."""
    return sorted(runs, key=lambda r: (r["created_at"], r["run_id"]))


def test_runs_list_shows_the_accounts_runs_filtered(api, spent) -> None:
    ids = [r["run_id"] for r in spent["runs"]]
    listed = [r["run_id"] for r in api.ok("runs", "list")["runs"]]
    assert set(ids) <= set(listed)
    digest = spent["runs"][0]["manifest_sha256"]
    of_manifest = [r["run_id"] for r in _listed_order(spent["runs"][:2])]
    assert [r["run_id"] for r in api.ok("runs", "list", "--manifest", digest)["runs"]] == of_manifest
    assert [r["run_id"] for r in api.ok("runs", "list", "--booking", spent["bookings"][1])["runs"]] == [ids[1]]
    assert api.ok("runs", "list", "--state", "succeeded")["runs"] == []
    assert api.ok("runs", "list", token="other")["runs"] == []  # another account sees none of them


def test_runs_list_pages_with_after(api, spent) -> None:
    digest = spent["runs"][0]["manifest_sha256"]
    oldest, newest = _listed_order(spent["runs"][:2])
    first = api.ok("runs", "list", "--manifest", digest, "--limit", "1")
    assert first["next_after"] == oldest["run_id"]
    second = api.ok("runs", "list", "--manifest", digest, "--limit", "1", "--after", first["next_after"])
    # The last page carries no cursor, even when it is full: none is needed to know the end.
    assert [r["run_id"] for r in second["runs"]] == [newest["run_id"]] and second["next_after"] is None
    assert first["num_total"] == second["num_total"] == 2
    third = api.ok("runs", "list", "--manifest", digest, "--limit", "1", "--after", newest["run_id"])
    assert third["runs"] == [] and third["next_after"] is None
    every = api.ok("runs", "list", "--manifest", digest, "--limit", "1", "--all")
    assert [r["run_id"] for r in every["runs"]] == [oldest["run_id"], newest["run_id"]]
    assert (every["num_runs"], every["next_after"]) == (2, None)


@pytest.mark.parametrize("limit", ["0", "501"])
def test_runs_list_limit_is_bounded(api, limit) -> None:
    assert api.ito("runs", "list", "--limit", limit)["error"]["code"] == "USAGE_ERROR"


def test_budget_is_the_same_for_the_account_its_status_and_the_desk(api, spent) -> None:
    digest = spent["runs"][0]["manifest_sha256"]
    [mine] = api.ok("budget", "--manifest", digest)["budgets"]
    expected = {"manifest_digest": digest, "cap_cents": BUDGET["cap_cents"],
                "max_incremental_cents": BUDGET["max_incremental_cents"], "spent_cents": 0,
                "reserved_cents": 2 * COST, "committed_cents": 2 * COST, "num_runs": 2,
                "left_cents": BUDGET["cap_cents"] - 2 * COST}
    assert mine == expected
    assert api.ok("status", spent["runs"][1]["run_id"])["budget"] == expected
    desk = api.ok("desk", "accounts", "budgets", api.accounts["account"], "--manifest", digest, token="desk")
    assert desk["budgets"] == [expected]
    assert api.ito("desk", "accounts", "budgets", api.accounts["account"])["error"]["code"] == "PERMISSION_DENIED"
    assert api.ito("budget", "--manifest", digest, token="other")["error"]["code"] == "RUN_NOT_FOUND"


def test_plan_reads_the_booking_and_shows_the_cost_the_confirmation_binds(api, spent) -> None:
    booking = api.booking()
    manifest = spent["manifest"]
    plan = api.ok("plan", "--booking", booking, "--manifest", manifest)
    assert plan["confirmation_issued"] is False and plan["workload_created"] is False
    assert plan["booking"]["booking_id"] == booking and plan["booking"]["num_gpus"] == 8
    assert plan["budget"]["committed_cents"] == 2 * COST
    assert plan["plan"]["hardware"]["gpu_type"] == "H100-SXM"  # "H100" on a 1x8-nvlink topology
    confirmation = api.ok("confirm", "request", "--action", "train", "--booking", booking, "--manifest", manifest)
    assert plan["cost_cents"] == confirmation["binding"]["cost_cents"] == COST


def test_plan_of_a_booking_that_is_not_yours_is_not_found(api, spent) -> None:
    document = api.ito("plan", "--booking", spent["bookings"][0], "--manifest", spent["manifest"], token="other")
    assert document["error"]["code"] == "BOOKING_NOT_FOUND" and document["live_api_contacted"] is True


def test_plan_refuses_what_the_confirmation_would_refuse(api) -> None:
    tight = api.manifest(budget={"cap_cents": COST - 1, "max_incremental_cents": COST - 1})
    document = api.ito("plan", "--booking", api.booking(), "--manifest", tight)
    assert document["error"]["code"] == "BUDGET_EXCEEDED"


def test_plan_offline_needs_every_hardware_flag(api, spent) -> None:
    document = api.ito("plan", "--booking", "bkg_1", "--manifest", spent["manifest"], "--gpu-type", "H100-SXM")
    assert document["error"]["code"] == "USAGE_ERROR" and document["live_api_contacted"] is False


def test_plan_shows_the_time_the_plan_takes_in_the_window_the_confirmation_checks(api, spent) -> None:
    booking = api.booking()
    plan = api.ok("plan", "--booking", booking, "--manifest", spent["manifest"])
    # The server's plan (in the quote) is the client's: one planner, the same booking.
    assert plan["time"]["planned_wall_seconds"] == plan["plan"]["wall_seconds"]
    assert 46 * HOUR < plan["time"]["window_left_seconds"] <= 47 * HOUR
    document = valid_manifest()
    document["model"]["size"] = "proxy-150m"  # 3T tokens: months on 8 GPUs, not the window's 47 hours
    document["training_target"] = {"num_tokens": 3 * 10**12, "stages": [
        {"name": "pretraining", "num_tokens": 3 * 10**12, "sequence_length": 2048}]}
    too_long = api.manifest(document)
    for verb in (("plan",), ("confirm", "request", "--action", "train")):
        refused = api.ito(*verb, "--booking", booking, "--manifest", too_long)
        assert refused["error"]["code"] == "CAPACITY_UNAVAILABLE" and refused["error"]["retryable"] is False
        assert "left" in refused["error"]["message"] and refused["live_api_contacted"] is True


def test_plan_prints_the_servers_plan_with_its_post_training(api, tmp_path) -> None:
    from ito_assets.api.commands.plan import _text

    steps = bound_pair_steps(api.server.data_root)
    manifest = api.manifest(post_training=[*steps, {"kind": "rlvr"}])
    online = api.ok("plan", "--booking", api.booking(), "--manifest", manifest)
    assert [p["stage"] for p in online["plan"]["post_training"]] == ["sft", "dpo", "rlvr"]
    assert online["plan"]["post_training_included"] is True and online["time"]["post_training_included"] is True
    assert online["time"]["planned_wall_seconds"] == online["plan"]["wall_seconds"]
    lines = _text(online)
    assert any(line.startswith("  sft: fp32 on ") for line in lines) and "(post-training included)" in lines[-2]
    flags = ("--gpu-type", "H100-SXM", "--nodes", "1", "--gpus-per-node", "8", "--network", "infiniband",
             "--price-cents-per-gpu-hour", "250")
    offline = api.ok("plan", "--booking", "bkg_1", "--manifest", manifest, *flags, ITO_DATA_ROOT=str(api.server.data_root))
    def timed(plan: dict) -> list:  # the booking's price is not the flags'
        return [{k: v for k, v in p.items() if k != "cost_cents"} for p in plan["post_training"]]
    assert timed(offline["plan"]) == timed(online["plan"])
    # Without the pair files here, the offline plan leaves post-training out and says why.
    elsewhere = tmp_path / "empty-data"
    elsewhere.mkdir()
    unplanned = api.ok("plan", "--booking", "bkg_1", "--manifest", manifest, *flags, ITO_DATA_ROOT=str(elsewhere))
    assert unplanned["plan"]["post_training"] is None and unplanned["plan"]["post_training_included"] is False
    assert unplanned["post_training_unplanned"].startswith("SOURCE_NOT_FOUND: ")
    assert unplanned["plan"]["wall_seconds"] < offline["plan"]["wall_seconds"]
    assert any(line.startswith("  post-training: not planned (SOURCE_NOT_FOUND") for line in _text(unplanned))
