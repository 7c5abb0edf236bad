"""A loss spike's proposed restart waits for a person at the desk, through the API.

The worker writes proposals into the run's stage folders; the desk lists and decides them through
`ito desk proposals`. Only a desk token decides, once; the decision is audited in the ledger.
"""

from __future__ import annotations

from pathlib import Path

from ito_assets.control import audit, runs
from ito_assets.control.ledger import open_ledger
from ito_assets.runtime.supervision import proposals
from ito_assets.runtime.supervision.proposals import ProposalStore
from ito_assets.runtime.supervision.spikes import Spike
from ito_assets.runtime.record.storage import RunLayout


def _propose(api, run_id: str, stage: str, step: int) -> str:
    ledger = open_ledger(api.server.env["ITO_LEDGER_URL"])
    try:
        run = runs.get(ledger, run_id)
    finally:
        ledger.dispose()
    stage_dir = RunLayout.for_run(Path(run.checkpoint_dir), run_id).stage_dir(stage)
    spike = Spike(step=step, metric="loss", value=9.0, mean=3.0, std=0.1)
    made = proposals.propose(spike, run_key=run_id, stage=stage, restart_from_step=step - 8, skip_first=step - 8,
                             skip_end=step + 1)
    return ProposalStore(stage_dir).add(made).proposal_id


def _audited(api, run_id: str) -> list[audit.AuditEvent]:
    ledger = open_ledger(api.server.env["ITO_LEDGER_URL"])
    try:
        return [e for e in audit.events(ledger, subject=run_id, limit=1000) if e.kind.startswith("proposal.")]
    finally:
        ledger.dispose()


def test_the_desk_lists_and_decides_a_runs_spike_proposals_once(api) -> None:
    _booking, run_id = api.started_run()
    assert api.ok("desk", "proposals", "list", run_id, token="desk")["proposals"] == []
    first = _propose(api, run_id, "pretraining", 40)
    second = _propose(api, run_id, "mid_training", 12)
    listed = api.ok("desk", "proposals", "list", run_id, token="desk")
    assert [p["proposal_id"] for p in listed["proposals"]] == [first, second] and listed["num_pending"] == 2

    approved = api.ok("desk", "proposals", "approve", run_id, first, token="desk")
    assert approved["state"] == "approved" and approved["stage"] == "pretraining" and approved["decided_by"]
    assert api.ok("desk", "proposals", "reject", run_id, second, token="desk")["state"] == "rejected"
    again = api.ito("desk", "proposals", "reject", run_id, first, token="desk")
    assert again["error"]["code"] == "PROPOSAL_ALREADY_DECIDED" and again["live_api_contacted"]
    assert api.ok("desk", "proposals", "list", run_id, token="desk")["num_pending"] == 0
    kinds = sorted((e.kind, e.detail["proposal_id"]) for e in _audited(api, run_id))
    assert kinds == sorted([("proposal.approved", first), ("proposal.rejected", second)])


def test_only_the_desk_decides_and_unknown_ids_are_refused(api) -> None:
    _booking, run_id = api.started_run()
    proposal = _propose(api, run_id, "pretraining", 30)
    refused = api.ito("desk", "proposals", "approve", run_id, proposal)  # an account token
    assert refused["ok"] is False and refused["error"]["code"] == "PERMISSION_DENIED"
    assert api.ok("desk", "proposals", "list", run_id, token="desk")["num_pending"] == 1
    missing = api.ito("desk", "proposals", "approve", run_id, "spk_0000000000000000", token="desk")
    assert missing["error"]["code"] == "PROPOSAL_NOT_FOUND"
    bad = api.ito("desk", "proposals", "approve", run_id, "../../etc", token="desk")
    assert bad["error"]["code"] == "USAGE_ERROR" and bad["live_api_contacted"] is False
    unknown_run = api.ito("desk", "proposals", "list", "run_" + "0" * 26, token="desk")
    assert unknown_run["error"]["code"] == "RUN_NOT_FOUND"
    assert _audited(api, run_id) == []
