"""The authorization gate as every training step enforces it: the stored `run_authorization` is
only a record (Dagster keeps one per manifest partition, shared by every run and every re-execution),
so a step that spends compute asks the ledger again, now, for the run it was launched for, and
trains the manifest bytes the ledger stored when the run was confirmed (never a file read again)."""

from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from ito_assets.defs.failures import failure
from ito_assets.defs.resources import LedgerResource
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import authorization, run_tags, runs
from ito_assets.control.entitlement import Eligibility
from ito_assets.control.validation import require_within_window
from ito_assets.manifest.verify import VerifiedManifest, parse_manifest
from ito_assets.posttraining.plan import read_pair_shapes
from ito_assets.training.run_plan import PlanOutcome, booked_hardware, plan_outcome


def _refuse(code: ErrorCode, why: str, step: str) -> dg.Failure:
    return dg.Failure(description=f"{code.value}: {why}; {step} refuses to run", metadata={"error_code": code.value})


@dataclass(frozen=True)
class LiveRun:
    run_id: str
    checkpoint_dir: Path
    manifest: VerifiedManifest  # parsed from the ledger's confirmed bytes
    booking: Eligibility  # the run's booking as the ledger holds it now (its hardware among its terms)
    price_per_gpu_hour_cents: int
    started_at: int | None  # None: no stage launched yet, so no compute spent
    verified_at: int  # the ledger's clock when the authorization was asked again

    def booked_plan(self, data_root: Path | None) -> PlanOutcome:
        """The plan for this run's own booking, the one `ito plan --booking` showed: what the job
        executes. The stored `training_plan` was made for the configured `booked_hardware`,
        before any booking existed. `data_root`: where the recipe's pair files are read from, as
        gate 5 read them (their refusals raised as ItoError); None plans the curriculum alone, for
        a caller that needs only the plan's hardware."""
        terms = self.booking
        hardware = booked_hardware(gpu_type=terms.gpu_type, topology=terms.topology, network=terms.network, num_nodes=terms.num_nodes,
                                   num_gpus=terms.num_gpus, price_per_gpu_hour_cents=self.price_per_gpu_hour_cents)
        manifest = self.manifest.manifest
        shapes = None if data_root is None else read_pair_shapes(
            manifest.post_training, data_root, held_out_fraction=manifest.post_training_eval.held_out_fraction)
        return plan_outcome(manifest, hardware, pair_shapes=shapes)

    def require_time_for(self, outcome: PlanOutcome) -> None:
        """Before any stage has launched, the whole plan must still fit what is left of the booked
        window, as gate 5 required when the run was created: a run that waited in the queue past
        that point stops here, its cost given back, instead of training into the window's end. Once
        a stage has launched, a resumed run needs only what is left of its plan, so it goes on."""
        if self.started_at is not None or outcome.run_plan is None:
            return
        terms = self.booking
        try:
            require_within_window(outcome.run_plan.wall_seconds, starts_at=terms.starts_at, ends_at=terms.ends_at,
                                  num_gpus=terms.num_gpus, now=self.verified_at)
        except ItoError as error:
            raise failure(error) from None


def require_live_authorization(context: dg.AssetExecutionContext, ledger: LedgerResource, recorded: dict,
                               step: str, *, prepared: VerifiedManifest | None = None) -> LiveRun:
    """The ledger run, its checkpoint folder and its confirmed manifest, or a Failure with the
    gate's code when the record is not this run's, the ledger no longer authorizes it, another
    Dagster run holds it, or the manifest the data was prepared from (`prepared`, the preparation
    job's stored record) is not the one the confirmation was bound to, by digest and by content."""
    if not recorded.get("authorized"):
        code = ErrorCode(recorded.get("error_code") or ErrorCode.CONFIRMATION_INVALID.value)
        raise _refuse(code, "the run is not authorized", step)
    run_id = run_tags.run_id_of(context.run.tags)
    if not run_id or recorded.get("run_id") != run_id:
        raise _refuse(ErrorCode.CONFIRMATION_INVALID, "the authorization on record belongs to another run", step)
    with ledger.open() as opened:
        try:
            if runs.get(opened, run_id).dagster_run_id != context.run_id:
                raise _refuse(ErrorCode.CONFIRMATION_INVALID, "another Dagster run holds this ledger run", step)
            granted = authorization.reverify(opened, run_id)
            confirmed = VerifiedManifest(manifest=parse_manifest(granted.manifest), raw=granted.manifest)
        except ItoError as error:
            raise failure(error) from None
    if prepared is not None and (prepared.digest != granted.manifest_digest or prepared.manifest != confirmed.manifest):
        raise _refuse(ErrorCode.MANIFEST_DIGEST_MISMATCH, "the manifest prepared is not the one confirmed", step)
    return LiveRun(run_id, Path(granted.checkpoint_dir), confirmed, granted.eligibility, granted.price_per_gpu_hour_cents,
                   granted.started_at, granted.verified_at)


def mark_training_started(ledger: LedgerResource, run_id: str) -> None:
    """Just before a stage launches its workers: from here the run's cost stays spent whatever its
    end (a run that ends before this point gives it back)."""
    with ledger.open() as opened:
        runs.mark_training_started(opened, run_id)
