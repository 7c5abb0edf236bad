"""Where compute is spent, a data decision that did not pass stops training with its own code, not
an eval gate's: NO_GO, and the verdicts that could not tell (WITHIN_NOISE, INCONCLUSIVE)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import dagster as dg
import pytest

from helpers import valid_manifest
from ito_assets.defs.training.assets import _require_data
from ito_assets.manifest.schema import Manifest
from ito_assets.training.decision_gate import decision_gate
from ito_assets.training.verdict import Verdict


@pytest.mark.parametrize(("verdict", "code"), [
    (Verdict.NO_GO, "DATA_DECISION_NO_GO"),
    (Verdict.WITHIN_NOISE, "DATA_DECISION_INCONCLUSIVE"),
    (Verdict.INCONCLUSIVE, "DATA_DECISION_INCONCLUSIVE"),
])
def test_a_blocked_decision_stops_training_with_its_own_code(verdict: Verdict, code: str) -> None:
    unreviewed = Manifest.model_validate_json(json.dumps(valid_manifest()))
    assert unreviewed.data_decision is None
    decision = SimpleNamespace(gate=decision_gate(verdict, unreviewed))
    with pytest.raises(dg.Failure) as refused:
        _require_data(SimpleNamespace(), decision)
    assert refused.value.metadata["error_code"].value == code
    assert f"the data decision did not pass: {verdict.value}" in refused.value.description


def _clean(*digests: str, holds: bool = True) -> SimpleNamespace:
    """Clean shards as training reads them: their digests, accounting, and no digest failure."""
    shards = SimpleNamespace(shards=tuple(SimpleNamespace(sha256=d) for d in digests), verify=lambda: [])
    return SimpleNamespace(shards=shards, conservation=SimpleNamespace(holds=holds))


@pytest.mark.parametrize("judged", [("a", "c"), ("a",), ("a", "b", "c"), ("b", "a"), None],
                         ids=["changed", "fewer", "more", "reordered", "not recorded"])
def test_a_go_about_other_clean_shards_stops_training_as_stale(judged) -> None:
    """A GO judged shards `judged`; clean shards prepared again since (other rules or data) are
    not what it judged."""
    reviewed = Manifest.model_validate_json(json.dumps(valid_manifest()))
    decision = SimpleNamespace(gate=decision_gate(Verdict.GO, reviewed), decision=SimpleNamespace(candidate_shards=judged))
    with pytest.raises(dg.Failure) as refused:
        _require_data(_clean("a", "b"), decision)
    assert refused.value.metadata["error_code"].value == "DATA_DECISION_STALE"


def test_a_go_about_these_clean_shards_passes_on_to_their_accounting() -> None:
    reviewed = Manifest.model_validate_json(json.dumps(valid_manifest()))
    decision = SimpleNamespace(gate=decision_gate(Verdict.GO, reviewed), decision=SimpleNamespace(candidate_shards=("a", "b")))
    _require_data(_clean("a", "b"), decision)  # nothing refused
    with pytest.raises(dg.Failure) as refused:
        _require_data(_clean("a", "b", holds=False), decision)
    assert refused.value.metadata["error_code"].value == "DATA_POLICY_VIOLATION"


def test_a_go_not_worth_it_on_the_run_s_own_booking_stops_training() -> None:
    from ito_assets.defs.training.assets import _require_worth_it
    from ito_assets.training.economics import Economics

    reviewed = Manifest.model_validate_json(json.dumps(valid_manifest()))
    dear = Economics(decision_num_tokens=1, decision_cost_cents=1, full_run_cost_cents=10**6, decision_cost_fraction=0.0,
                     relative_improvement=0.01, cost_cents_per_improvement_point=10**6, max_cost_cents_per_improvement_point=1,
                     within_budget_cap=True, within_max_incremental=True, worth_it=False, reasons=("too dear",), notes=())
    hardware = SimpleNamespace(world_size=16, gpu=SimpleNamespace(name="H100-SXM"), price_cents_per_gpu_hour=900)
    booked = SimpleNamespace(run_plan=SimpleNamespace(hardware=hardware))
    decision = SimpleNamespace(for_booking=lambda run_plan, manifest: decision_gate(Verdict.GO, manifest, dear))
    with pytest.raises(dg.Failure) as refused:
        _require_worth_it(decision, booked, reviewed)
    assert refused.value.metadata["error_code"].value == "DATA_DECISION_NOT_WORTH_IT"
    assert "on the run's booking (16 x H100-SXM at 900 cents a GPU-hour): NOT_WORTH_IT (too dear)" in refused.value.description
    decision = SimpleNamespace(for_booking=lambda run_plan, manifest: decision_gate(Verdict.GO, manifest))
    _require_worth_it(decision, booked, reviewed)  # worth it there: nothing refused
