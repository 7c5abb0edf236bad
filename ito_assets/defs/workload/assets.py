"""The first asset of the training job: the ledger's word that this run may spend the booking.

Defence in depth: the server already checked every gate when it
created the run; here the ledger is asked again, at the moment compute is about to be spent.
"""

import dagster as dg

from ito_assets.defs import owners
from ito_assets.defs.manifest.partitions import TRAINED_ONE_OF_TWO, manifests_partitions
from ito_assets.defs.resources import LedgerResource
from ito_assets.errors import ItoError
from ito_assets.control import authorization, run_tags, runs
from ito_assets.control.states import RunState

GROUP = "workload"


@dg.asset(
    group_name=GROUP,
    owners=[owners.TRAINING],
    kinds={"sqlite", "postgres"},
    partitions_def=manifests_partitions,
    deps=["training_manifest"],
    description="Re-verifies in the ledger that the run this job was launched for (its `ito/run_id` tag) "
    "is still authorized (booking entitlement, consumed confirmation, manifest digest); its blocking "
    "check stops the run." + TRAINED_ONE_OF_TWO,
)
def run_authorization(context: dg.AssetExecutionContext, ledger: LedgerResource) -> dict:
    run_id = run_tags.run_id_of(context.run.tags)
    if not run_id:
        raise dg.Failure(description="the training job runs only for a ledger run (tag ito/run_id)")
    with ledger.open() as opened:
        try:
            runs.attach_dagster_run(opened, run_id, context.run_id)
            granted = authorization.reverify(opened, run_id)
        except ItoError as error:
            # The blocking check stops the run; its end (gate_failed, with this code) reaches the
            # ledger through the run-status sensor, together with the run's event log.
            verdict = {"run_id": run_id, "authorized": False, "error_code": error.code.value}
            context.add_output_metadata({**verdict, "error_message": error.message})
            return verdict
        runs.set_state(opened, run_id, RunState.RUNNING)
    verdict = {"run_id": run_id, "authorized": True, "account_id": granted.account_id,
               "booking_id": granted.booking_id, "manifest_digest": granted.manifest_digest,
               "idempotency_key": granted.idempotency_key, "cost_cents": granted.cost_cents,
               "checkpoint_dir": granted.checkpoint_dir}
    context.add_output_metadata({k: v for k, v in verdict.items() if k != "checkpoint_dir"})
    return verdict
