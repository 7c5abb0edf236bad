"""`ito plan`: a local plan with its cost, one JSON envelope, no workload, refusals by code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ito_assets.api import envelope
from ito_assets.api.cli import _Parser
from ito_assets.api.commands import plan
from ito_assets.errors import ErrorCode, ItoError

from helpers import write_manifest

MANIFESTS = Path(__file__).resolve().parents[2] / "data" / "fixtures" / "manifests"
HARDWARE = ["--gpu-type", "H100-SXM", "--nodes", "1", "--gpus-per-node", "8", "--network", "infiniband",
            "--price-cents-per-gpu-hour", "250"]


def _run(argv: list[str]) -> dict:
    """What `ito` does with a registered verb (cli.run), for this verb alone."""
    parser = _Parser(prog="ito")
    plan.register(parser.add_subparsers(dest="verb", parser_class=_Parser, required=True))
    try:
        args = parser.parse_args(argv)
        outcome = args.handler(args)
    except ItoError as error:
        return envelope.failure(error, live_api_contacted=False)
    return envelope.success(outcome.data, live_api_contacted=outcome.live_api_contacted, notice=outcome.notice)


@pytest.fixture
def manifest(tmp_path) -> str:
    return write_manifest(tmp_path / "m.json", json.loads((MANIFESTS / "fixture-small.json").read_text()))


def test_plan_answers_with_cost_and_creates_no_workload(manifest):
    document = _run(["plan", "--booking", "bkg_123", "--manifest", manifest, *HARDWARE, "--json"])
    assert document["ok"] and document["live_api_contacted"] is False
    data = document["data"]
    assert data["workload_created"] is False and data["booking_id"] == "bkg_123"
    assert data["manifest_digest"].startswith("sha256:")
    assert data["plan"]["cost_cents"] > 0 and len(data["plan"]["stages"]) == 3
    assert data["plan"]["budget"]["within_cap"] is True
    envelope.dumps(document)  # strict JSON


def test_refused_plan_is_plan_refused_with_reasons(tmp_path):
    document = json.loads((MANIFESTS / "fixture-small.json").read_text())
    document["model"]["size"] = "unknown-size"
    path = write_manifest(tmp_path / "m.json", document)
    result = _run(["plan", "--booking", "bkg_1", "--manifest", path, *HARDWARE, "--json"])
    assert not result["ok"] and result["error"]["code"] == ErrorCode.PLAN_REFUSED.value
    assert result["error"]["reasons"] == ["UNKNOWN_MODEL_SIZE"]


@pytest.mark.parametrize("change", [["--gpu-type", "TPU"], ["--nodes", "0"], ["--booking", "bad id with spaces"]])
def test_bad_flags_are_usage_errors_that_echo_nothing(manifest, change):
    argv = ["plan", "--booking", "bkg_1", "--manifest", manifest, *HARDWARE, "--json"]
    flag = change[0]
    argv[argv.index(flag) + 1] = change[1]
    result = _run(argv)
    assert result["error"]["code"] == ErrorCode.USAGE_ERROR.value
    assert change[1] not in result["error"]["message"]


def test_unsafe_manifest_is_refused_by_the_secure_read(manifest):
    result = _run(["plan", "--booking", "bkg_1", "--manifest", "relative/path.json", *HARDWARE, "--json"])
    assert not result["ok"] and result["error"]["code"].startswith("MANIFEST_")


def test_the_quote_prices_the_very_bytes_the_plan_was_made_from(manifest, monkeypatch):
    # The file is rewritten (another budget, another stage length) after the first read: `ito plan`
    # read it again for the quote, so it printed the first manifest's plan and digest next to the
    # cost and budget the server priced for the second.
    import argparse

    from ito_assets.manifest import verify

    changed = json.loads(Path(manifest).read_text())
    changed["budget"] = {"cap_cents": 5, "max_incremental_cents": 5}
    real_verify, reads = verify.verify_manifest, []

    def verify_then_rewrite(path, **kwargs):
        verified = real_verify(path, **kwargs)
        reads.append(verified.digest)
        if len(reads) == 1:
            Path(path).chmod(0o600)
            write_manifest(Path(path), changed)
        return verified

    posted = []

    class Client:
        contacted = True

        def post(self, route, body):
            posted.append(body["manifest_digest"])
            booking = {"booking_id": "bkg_123", "gpu_type": "H100", "network": "ib-400g", "num_nodes": 1,
                       "num_gpus": 8, "price_per_gpu_hour_cents": 250}
            budget = {"cap_cents": 1, "committed_cents": 0, "left_cents": 1}
            return {"booking": booking, "cost_cents": 96000, "budget": budget, "manifest_digest": body["manifest_digest"]}

    monkeypatch.setattr(verify, "verify_manifest", verify_then_rewrite)
    monkeypatch.setattr("ito_assets.api.client_config.connect", lambda **_: Client())
    args = argparse.Namespace(booking="bkg_123", manifest=manifest, json=True, timeout=5.0,
                              **{name: None for name in plan._HARDWARE_FLAGS})
    data = plan._plan(args).data
    assert posted == [data["manifest_digest"]] == reads[:1]


def test_the_offline_notice_is_in_the_readable_output_too(manifest, capsys):
    from ito_assets.api import cli

    assert cli.main(["plan", "--booking", "bkg_123", "--manifest", manifest, *HARDWARE]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == f"notice: {plan.OFFLINE_NOTICE}" and sum(line.startswith("notice:") for line in lines) == 1
    assert cli.main(["plan", "--booking", "bkg_123", "--manifest", manifest, *HARDWARE, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["notice"] == plan.OFFLINE_NOTICE
