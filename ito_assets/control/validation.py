"""Gate 5, server-side validation before a workload is created: network and
region, capacity (GPUs, concurrent runs, and the booked window's time for the run's plan), data
policy, checkpoint storage. Cost is `cost.py`. Each check raises the ItoError of its own code;
messages name positions (data[1]), never paths or values.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Mapping

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control.bookings import Booking
from ito_assets.control.entitlement import Eligibility
from ito_assets.control.policy import ServerPolicy
from ito_assets.manifest.schema import DataReference, Manifest
from ito_assets.manifest.verify import provenance_problems
from ito_assets.posttraining.plan import PairShape, read_pair_shapes
from ito_assets.training.run_plan import RunPlan, booked_hardware, plan_run


@dataclass(frozen=True, kw_only=True)
class RunRequirements:
    """What the run needs from the booking. Callers that pass none ask for one GPU anywhere; a
    plan fills in its GPU count and, for multi-node plans, the network it assumes."""

    num_gpus: int = 1
    region: str | None = None
    network: str | None = None


def check_network(requirements: RunRequirements, eligibility: Eligibility) -> None:
    if requirements.region is not None and requirements.region != eligibility.region:
        raise ItoError(ErrorCode.NETWORK_MISMATCH, "the run needs a different region than the booking's")
    if requirements.network is not None and requirements.network != eligibility.network:
        raise ItoError(ErrorCode.NETWORK_MISMATCH, "the run needs a different network than the booking's")


def check_capacity(requirements: RunRequirements, eligibility: Eligibility, *, num_active_runs: int,
                   policy: ServerPolicy) -> None:
    if requirements.num_gpus > eligibility.num_gpus:
        raise ItoError(ErrorCode.CAPACITY_UNAVAILABLE, "the booking has fewer GPUs than the run needs",
                       retryable=False)
    if num_active_runs >= policy.max_concurrent_runs_per_booking:
        raise ItoError(ErrorCode.CAPACITY_UNAVAILABLE, "the booking already runs its maximum number of runs")


def window_left_s(starts_at: int, ends_at: int, now: int) -> int:
    """Seconds of a booked window still ahead: all of it before the window begins (a quote asked
    ahead), what remains once it has."""
    return max(0, ends_at - max(now, starts_at))


def require_within_window(planned_wall_s: float, *, starts_at: int, ends_at: int, num_gpus: int, now: int) -> int:
    """The window left, or CAPACITY_UNAVAILABLE (not retryable) when the plan is longer."""
    left = window_left_s(starts_at, ends_at, now)
    # `not <=`, never `>`: a NaN plan compares false both ways and must refuse, not fit.
    if not planned_wall_s <= left:
        raise ItoError(ErrorCode.CAPACITY_UNAVAILABLE,
                       f"the run's plan needs {_hours(planned_wall_s)} on the booking's {num_gpus} GPUs, "
                       f"and its window has {_hours(left)} left", retryable=False)
    return left


@dataclass(frozen=True)
class RecipePairs:
    """The recipe's pair-file shapes for the plan, read before gate 5's transaction: the read goes
    through each file's whole bytes, too long to hold the booking's lock for. A refusal found while
    reading is raised where the plan is checked, so the gates keep their order."""

    shapes: Mapping[str, PairShape] | None
    refusal: ItoError | None = None

    def require(self) -> Mapping[str, PairShape]:
        if self.refusal is not None:
            raise self.refusal
        if self.shapes is None:  # only when the data policy refused: check_data_policy raised first
            raise ItoError(ErrorCode.INTERNAL_ERROR, "the recipe's pair files were not read")
        return self.shapes


def read_recipe_pairs(manifest: Manifest, policy: ServerPolicy) -> RecipePairs:
    """No file is read that the data policy does not allow (a path outside the allowed roots would
    tell by its refusal whether it exists); that refusal is gate 5's own, raised in its order. A
    file is opened only if, once open, it is still the file the policy allowed (a link swapped in
    between is refused as outside the roots)."""
    try:
        check_data_policy(manifest, policy)
    except ItoError:
        return RecipePairs(shapes=None)

    def allowed(path: Path) -> bool:
        return any(inside(path, root) for root in policy.allowed_data_roots)

    try:
        return RecipePairs(shapes=read_pair_shapes(manifest.post_training, policy.data_root, allowed=allowed,
                                                    held_out_fraction=manifest.post_training_eval.held_out_fraction))
    except ItoError as refusal:
        return RecipePairs(shapes=None, refusal=refusal)


def check_plan_fits(manifest: Manifest, booking: Booking, *, now: int,
                    pair_shapes: Mapping[str, PairShape]) -> RunPlan:
    """Capacity in time: the manifest planned on the booking's own hardware, the plan the training
    job executes, its post-training recipe included, must end inside what is left of the window.
    The booked block is what is charged; a plan longer than it would be confirmed, charged and then
    cut off. PLAN_REFUSED where the planner cannot plan it (its GPU, network or model size unknown,
    or no layout fits). `pair_shapes`: `read_recipe_pairs`."""
    hardware = booked_hardware(gpu_type=booking.gpu_type, topology=booking.topology, network=booking.network, num_nodes=booking.num_nodes,
                               num_gpus=booking.num_gpus, price_per_gpu_hour_cents=booking.price_per_gpu_hour_cents)
    run_plan = plan_run(manifest, hardware, pair_shapes=pair_shapes)
    require_within_window(run_plan.wall_seconds, starts_at=booking.starts_at, ends_at=booking.ends_at,
                          num_gpus=booking.num_gpus, now=now)
    return run_plan


def _hours(seconds: float) -> str:
    """Whole seconds rounded up, so that a plan a fraction of a second too long never reads as fitting."""
    if not math.isfinite(seconds):
        return "no finite time"  # math.ceil would raise instead of refusing with the gate's code
    return f"{seconds / 3600:,.2f} h ({math.ceil(seconds):,} s)"


def _relative_parts(text: str) -> tuple[str, ...]:
    """Components of a relative location; '..', '.', empty and absolute forms are refused."""
    path = PurePosixPath(text)
    if not text or path.is_absolute() or any(p in ("..", ".") for p in text.split("/")) or "\x00" in text:
        raise ValueError("not a plain relative location")
    return path.parts


def inside(path: Path | str, root: Path | str) -> bool:
    """True when `path` (links resolved) is `root` or lies below it."""
    real, real_root = os.path.realpath(path), os.path.realpath(root)
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)


def resolve_data_uri(uri: str, policy: ServerPolicy) -> Path:
    """`dataroot://rel` under the data root, `file:///abs` as is; either must lie (after links are
    resolved) inside one of the allowed data roots."""
    if uri.startswith("dataroot://"):
        path = policy.data_root.joinpath(*_relative_parts(uri[len("dataroot://"):]))
    elif uri.startswith("file:///"):
        path = Path("/").joinpath(*_relative_parts(uri[len("file:///"):]))
    else:
        raise ValueError("unsupported scheme")
    if not any(inside(path, root) for root in policy.allowed_data_roots):
        raise ValueError("outside the allowed data roots")
    return path


def _bound_data(manifest: Manifest) -> list[tuple[str, DataReference]]:
    """Every data file the manifest trains on: its corpora and the post-training pair files."""
    corpora = [(f"data[{i}]", ref) for i, ref in enumerate(manifest.data)]
    pairs = [(f"post_training[{i}].data", step.data) for i, step in enumerate(manifest.post_training)
             if getattr(step, "data", None) is not None]
    return corpora + pairs


def check_data_policy(manifest: Manifest, policy: ServerPolicy) -> None:
    missing = provenance_problems(manifest)
    if missing:
        raise ItoError(ErrorCode.PROVENANCE_MISSING,
                       f"data references without decontamination provenance: {', '.join(missing)}")
    bound = _bound_data(manifest)
    unlicensed = [name for name, ref in bound if ref.license not in policy.allowed_licenses]
    if unlicensed:
        raise ItoError(ErrorCode.DATA_POLICY_VIOLATION,
                       f"data references whose licence does not allow training: {', '.join(unlicensed)}")
    outside = []
    for name, ref in bound:
        try:
            resolve_data_uri(ref.uri, policy)
        except ValueError:
            outside.append(name)
    if outside:
        raise ItoError(ErrorCode.DATA_POLICY_VIOLATION,
                       f"data references outside the allowed data roots: {', '.join(outside)}")


def resolve_checkpoint_dir(storage_uri: str, account_id: str, policy: ServerPolicy) -> Path:
    """The folder of `checkpoint_policy.storage_uri`, which must lie inside the tenant's area:
    `tenant://rel` is relative to it, `file:///abs` must point into it."""
    area = policy.tenant_area(account_id)
    try:
        if storage_uri.startswith("tenant://"):
            path = area.joinpath(*_relative_parts(storage_uri[len("tenant://"):]))
        elif storage_uri.startswith("file:///"):
            path = Path("/").joinpath(*_relative_parts(storage_uri[len("file:///"):]))
        else:
            raise ValueError("unsupported scheme")
    except ValueError:
        raise ItoError(ErrorCode.CHECKPOINT_STORAGE_INVALID, "the checkpoint storage uri is malformed") from None
    if not inside(path, area):
        raise ItoError(ErrorCode.CHECKPOINT_STORAGE_INVALID, "checkpoint storage must lie inside the tenant's area")
    return path


def check_checkpoint_storage(storage_uri: str, account_id: str, policy: ServerPolicy, *,
                             create: bool = True) -> Path:
    """Resolve, create (0700) and prove writable by writing a probe file; re-check containment
    after creation so that a link planted inside the area cannot lead out of it.

    `create=False` (a quote, which writes nothing): the containment of the path as it stands
    (links resolved), and an existing folder must be a writable, real folder; the confirmation
    request still creates and probes it."""
    path = resolve_checkpoint_dir(storage_uri, account_id, policy)
    if not create:
        if path.is_symlink() or (path.exists() and not (path.is_dir() and os.access(path, os.W_OK | os.X_OK))):
            raise ItoError(ErrorCode.CHECKPOINT_STORAGE_INVALID, "checkpoint storage is not a writable folder")
        return path
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not inside(path, policy.tenant_area(account_id)) or path.is_symlink():
            raise ItoError(ErrorCode.CHECKPOINT_STORAGE_INVALID, "checkpoint storage must lie inside the tenant's area")
        with tempfile.NamedTemporaryFile(dir=path, prefix=".ito-probe-"):
            pass
    except OSError:
        raise ItoError(ErrorCode.CHECKPOINT_STORAGE_INVALID, "checkpoint storage is not writable") from None
    return path
