"""The training domain's slice of the asset graph, loaded with the domains it reads from: a change
to its keys, groups, inputs or checks is a visible change in review."""

from __future__ import annotations

import dagster as dg
import pytest

from ito_assets.defs import data, decision, manifest, posttraining, telemetry, training, workload
from ito_assets.defs.resources import ItoSettingsResource, LedgerResource
from ito_assets.settings import load_settings

pytestmark = pytest.mark.filterwarnings("ignore::dagster.PreviewWarning")

EXPECTED_ASSETS = {"training_tokens", "pretraining_checkpoint", "mid_training_checkpoint", "long_context_checkpoint"}
EXPECTED_CHECKS = {("pretraining_checkpoint", "pretraining_eval_gate"), ("mid_training_checkpoint", "mid_training_eval_gate"),
                   ("long_context_checkpoint", "long_context_eval_gate")}
EXPECTED_UPSTREAM = {
    "training_tokens": {"clean_shards", "training_plan", "data_decision", "run_authorization"},
    "pretraining_checkpoint": {"run_authorization", "training_manifest", "training_tokens", "training_plan"},
    "mid_training_checkpoint": {"run_authorization", "training_manifest", "training_tokens", "training_plan",
                                "pretraining_checkpoint"},
    "long_context_checkpoint": {"run_authorization", "training_manifest", "training_tokens", "training_plan",
                                "mid_training_checkpoint"},
}
# Desk telemetry is the lineage's last asset: every stage's event log, post-training included.
TELEMETRY_UPSTREAM = {"pretraining_checkpoint", "mid_training_checkpoint", "long_context_checkpoint",
                      "sft_checkpoint", "dpo_checkpoint", "rlvr_checkpoint"}


def _graph():
    settings = load_settings()
    shell = dg.Definitions(resources={"ito": ItoSettingsResource.from_settings(settings),
                                      "ledger": LedgerResource.from_settings(settings)})
    merged = dg.Definitions.merge(manifest.defs(), data.defs(), decision.defs(), workload.defs(), training.defs(),
                                   posttraining.defs(), telemetry.defs(), shell)
    return merged.resolve_asset_graph()


def test_training_assets_checks_and_lineage():
    graph = _graph()
    group = {k.to_user_string() for k in graph.get_all_asset_keys() if graph.get(k).group_name == "training"}
    assert group == EXPECTED_ASSETS
    upstream = {name: {p.to_user_string() for p in graph.get(dg.AssetKey(name)).parent_keys} for name in EXPECTED_ASSETS}
    assert upstream == EXPECTED_UPSTREAM
    checks = {(k.asset_key.to_user_string(), k.name) for k in graph.asset_check_keys
              if k.name.endswith("_eval_gate") and k.asset_key.to_user_string() in EXPECTED_ASSETS}
    assert checks == EXPECTED_CHECKS
    assert all(graph.get_check_spec(dg.AssetCheckKey(dg.AssetKey(a), n)).blocking for a, n in EXPECTED_CHECKS)


def test_training_telemetry_reads_every_stage_last_and_writes_under_the_duckdb_pool():
    node = _graph().get(dg.AssetKey("training_telemetry"))
    assert {p.to_user_string() for p in node.parent_keys} == TELEMETRY_UPSTREAM
    assert node.group_name == "telemetry" and node.pools == {"duckdb_writer"}
    assert not node.child_keys
