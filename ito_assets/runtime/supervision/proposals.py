"""Proposed actions after a loss spike: nothing restarts until a person approves.

A restart skips data and spends booked compute again, so it is a proposal a person approves.
A proposal says: restart the stage from the checkpoint at `restart_from_step` and skip the global
batches [skip_first, skip_end) (PaLM's remedy, Chowdhery et al. 2022, section 5.1). Its state
moves pending -> approved or pending -> rejected, once; a decided proposal never changes again.

Storage is one JSON file per proposal in the stage folder, replaced atomically under an exclusive
`flock`, so the desk (through the API) and the supervisor can race without losing a decision.
Once the supervisor has carried out an approved proposal it marks it applied (approved -> applied),
so that a restarted supervisor never rewinds twice.
`decide_in_run` is what the API calls when the desk approves or rejects; `in_run` is what it lists.
"""

from __future__ import annotations

import enum
import fcntl
import json
import logging
import math
import re
import secrets
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Iterator

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.runtime.checkpoint import holds
from ito_assets.runtime.supervision.spikes import Spike
from ito_assets.runtime.record.storage import read_regular_file, write_atomic

FOLDER_NAME = "proposals"
_ID = re.compile(r"^spk_[0-9a-f]{16}$")
# A proposal is under a kilobyte; a larger file is not one and is never read whole.
MAX_BYTES = 64 * 1024
_log = logging.getLogger(__name__)


class ProposalState(str, enum.Enum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    APPLIED = "applied"  # approved, and carried out by the supervisor


@dataclass(frozen=True, kw_only=True)
class ProposedAction:
    proposal_id: str
    run_key: str
    stage: str
    spike_step: int
    metric: str
    value: float
    z_score: float
    restart_from_step: int
    skip_first: int  # global batch positions, half-open
    skip_end: int
    state: ProposalState = ProposalState.PENDING
    created_at: float = 0.0
    decided_by: str | None = None
    decided_at: float | None = None
    applied_at: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", ProposalState(self.state))
        # A file is read back with these checks: a wrong type must fail here, not in the supervisor.
        steps = (self.spike_step, self.restart_from_step, self.skip_first, self.skip_end)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in steps):
            raise TypeError("steps and batch positions must be integers")
        if not all(isinstance(v, str) for v in (self.proposal_id, self.run_key, self.stage, self.metric)):
            raise TypeError("ids, names and the metric must be strings")
        if not _ID.fullmatch(self.proposal_id):
            raise ValueError("proposal_id must be spk_ followed by 16 hex digits")
        if not 0 <= self.restart_from_step <= self.spike_step:
            raise ValueError("restart_from_step must lie in [0, spike_step]")
        if not 0 <= self.skip_first < self.skip_end:
            raise ValueError("skip range must be a non-empty half-open range")
        if (self.state is ProposalState.PENDING) != (self.decided_by is None):
            raise ValueError("decided_by is set exactly when the proposal is decided")
        if (self.state is ProposalState.APPLIED) != (self.applied_at is not None):
            raise ValueError("applied_at is set exactly when the proposal was applied")


    def as_dict(self) -> dict:
        """Strict JSON for the desk: a non-finite figure (the loss of a step that was not finite,
        the z-score against a flat history) is null, as JSON has no NaN or infinity."""
        shown = {k: _finite(v) for k, v in asdict(self).items() if k in _FIGURES}
        return {**asdict(self), **shown, "state": self.state.value}


_FIGURES = ("value", "z_score", "created_at", "decided_at", "applied_at")


def _finite(value: object) -> object:
    return value if not isinstance(value, float) or math.isfinite(value) else None


def propose(spike: Spike, *, run_key: str, stage: str, restart_from_step: int, skip_first: int,
            skip_end: int) -> ProposedAction:
    return ProposedAction(
        proposal_id=f"spk_{secrets.token_hex(8)}", run_key=run_key, stage=stage, spike_step=spike.step,
        metric=spike.metric, value=spike.value, z_score=spike.z_score,
        restart_from_step=restart_from_step, skip_first=skip_first, skip_end=skip_end, created_at=time.time(),
    )


def plan_restart(spike_step: int, spike_position: int, *, whole_steps: list[int], next_positions: dict[int, int],
                 rewind_steps: int) -> tuple[int, int, int]:
    """(restart_from_step, skip_first, skip_end) for a spike at `spike_step` on global batch
    `spike_position`: restart from the newest whole checkpoint at least `rewind_steps` before the
    spike (else the oldest one before it, else the stage's start) and skip every batch from the one
    after that checkpoint through the spike's. `next_positions` maps a step to the position of
    the batch after it; a restart point it does not know is estimated from the spike's position."""
    before = sorted(s for s in whole_steps if s < spike_step)
    early = [s for s in before if s <= spike_step - rewind_steps]
    restart = early[-1] if early else (before[0] if before else 0)
    skip_first = next_positions.get(restart, spike_position - (spike_step - 1 - restart))
    return restart, max(0, skip_first), spike_position + 1


def transition(proposal: ProposedAction, *, approve: bool, actor: str, at: float) -> ProposedAction:
    """The only state change: pending -> approved | rejected."""
    if proposal.state is not ProposalState.PENDING:
        raise ItoError(ErrorCode.PROPOSAL_ALREADY_DECIDED, "this proposal was already decided")
    if not actor:
        raise ValueError("actor must name who decided")
    state = ProposalState.APPROVED if approve else ProposalState.REJECTED
    return replace(proposal, state=state, decided_by=actor, decided_at=at)


class ProposalStore:
    def __init__(self, stage_dir: Path):
        self.folder = stage_dir / FOLDER_NAME

    def path(self, proposal_id: str) -> Path:
        if not _ID.fullmatch(proposal_id):
            raise ItoError(ErrorCode.PROPOSAL_NOT_FOUND, "no such proposal")
        return self.folder / f"{proposal_id}.json"

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / ".lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def add(self, proposal: ProposedAction) -> ProposedAction:
        with self._locked():
            write_atomic(self.path(proposal.proposal_id), _dump(proposal))
        return proposal

    def get(self, proposal_id: str) -> ProposedAction:
        proposal = _read(self.path(proposal_id))
        if proposal is None:
            raise ItoError(ErrorCode.PROPOSAL_NOT_FOUND, "no such proposal")
        return proposal

    def all(self) -> list[ProposedAction]:
        if not self.folder.is_dir():
            return []
        found = []
        for path in self.folder.glob("spk_*.json"):
            proposal = _read(path)
            if proposal is None:
                _log.warning("ignoring %s: not a proposal this store wrote", path)
            else:
                found.append(proposal)
        return sorted(found, key=lambda p: (p.created_at, p.proposal_id))

    def pending(self) -> list[ProposedAction]:
        return [p for p in self.all() if p.state is ProposalState.PENDING]

    def decide(self, proposal_id: str, *, approve: bool, actor: str) -> ProposedAction:
        with self._locked():
            decided = transition(self.get(proposal_id), approve=approve, actor=actor, at=time.time())
            write_atomic(self.path(proposal_id), _dump(decided))
        if decided.state is ProposalState.REJECTED:
            holds.release(self.folder.parent, proposal_id)
        return decided

    def mark_applied(self, proposal_id: str) -> ProposedAction:
        with self._locked():
            proposal = self.get(proposal_id)
            if proposal.state is not ProposalState.APPROVED:
                raise ValueError("only an approved proposal can be applied")
            applied = replace(proposal, state=ProposalState.APPLIED, applied_at=time.time())
            write_atomic(self.path(proposal_id), _dump(applied))
        return applied


def decide(stage_dir: Path, proposal_id: str, *, approve: bool, actor: str) -> ProposedAction:
    """For the API: the desk approves or rejects a pending proposal of a run's stage."""
    return ProposalStore(stage_dir).decide(proposal_id, approve=approve, actor=actor)


def in_run(run_dir: Path) -> list[ProposedAction]:
    """Every proposal of every stage of one run, oldest first: what the desk reviews."""
    found = [p for folder in sorted(run_dir.glob(f"*/{FOLDER_NAME}")) for p in ProposalStore(folder.parent).all()]
    return sorted(found, key=lambda p: (p.created_at, p.proposal_id))


def decide_in_run(run_dir: Path, proposal_id: str, *, approve: bool, actor: str) -> ProposedAction:
    """The desk's decision on one proposal of a run, in whichever stage folder holds it."""
    for folder in sorted(run_dir.glob(f"*/{FOLDER_NAME}")):
        store = ProposalStore(folder.parent)
        if store.path(proposal_id).exists():
            return store.decide(proposal_id, approve=approve, actor=actor)
    raise ItoError(ErrorCode.PROPOSAL_NOT_FOUND, "no such proposal")


def approved_restart(stage_dir: Path) -> ProposedAction | None:
    """The oldest approved proposal not yet applied: the only thing that may restart a stage."""
    return next((p for p in ProposalStore(stage_dir).all() if p.state is ProposalState.APPROVED), None)


def restarts(stage_dir: Path) -> list[ProposedAction]:
    """Every restart the desk ordered, oldest first: the approved proposals and the applied ones."""
    chosen = (ProposalState.APPROVED, ProposalState.APPLIED)
    return [p for p in ProposalStore(stage_dir).all() if p.state in chosen]


def skip_ranges(stage_dir: Path) -> tuple[tuple[int, int], ...]:
    """The batch ranges every later attempt skips: those of the ordered restarts."""
    return tuple((p.skip_first, p.skip_end) for p in restarts(stage_dir))


def _dump(proposal: ProposedAction) -> bytes:
    # Python's JSON, NaN and infinities included: the stored figures read back as they were.
    return json.dumps({**asdict(proposal), "state": proposal.state.value}, sort_keys=True).encode()


def _read(path: Path) -> ProposedAction | None:
    """The proposal in `path`, or None for anything the store never writes there: a missing file,
    a link (it could speak for another run's proposal), a FIFO (a read would block the supervisor
    and the desk), a file too large to be one, JSON that is no proposal, or one whose id is not
    its file's (a copy under another name would be decided under one id and listed under two)."""
    data = read_regular_file(path, MAX_BYTES)
    if data is None:
        return None
    try:
        proposal = ProposedAction(**json.loads(data))
    except (ValueError, TypeError, RecursionError):
        return None
    return proposal if path.name == f"{proposal.proposal_id}.json" else None
