"""The run tags are spelled once: what the sensors write is what the assets read back."""

from types import SimpleNamespace

from ito_assets.control import run_tags


def test_a_ledger_runs_tags_round_trip_to_its_run_id() -> None:
    run = SimpleNamespace(run_id="run_1", account_id="acct", booking_id="bk_1",
                          manifest_digest="sha256:" + "a" * 64, idempotency_key="key-0001")
    tags = run_tags.for_run(run)
    assert tags == {"ito/run_id": "run_1", "ito/account_id": "acct", "ito/booking_id": "bk_1",
                    "ito/manifest_digest": "sha256:" + "a" * 64, "ito/idempotency_key": "key-0001"}
    assert run_tags.run_id_of(tags) == "run_1"


def test_a_preparation_run_is_no_ledger_run() -> None:
    tags = run_tags.for_preparation("sha256:" + "b" * 64, "sha256:" + "c" * 64)
    assert tags == {"ito/manifest_digest": "sha256:" + "b" * 64, "ito/eval_suite_digest": "sha256:" + "c" * 64}
    assert run_tags.for_preparation("sha256:" + "b" * 64) == {"ito/manifest_digest": "sha256:" + "b" * 64}
    assert run_tags.run_id_of(tags) is None
    assert run_tags.run_id_of({"ito/run_id": ""}) is None
