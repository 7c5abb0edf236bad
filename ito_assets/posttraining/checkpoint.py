"""A post-training stage's checkpoint: the policy's state dict in one file, with its digest.

`torch.save` of the state dict (the stages here are single-process); the sharded, asynchronous
torch.distributed.checkpoint path of the pretraining runtime takes over on a cluster. A checkpoint
is loaded only when its bytes still hash to the recorded digest: the file is read once, and the
bytes hashed are the bytes loaded (a file replaced between a check and a second read is never loaded).
"""

from __future__ import annotations

import hashlib
import io
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ito_assets.digests import file_sha256
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.posttraining.policy import CausalLM


@dataclass(frozen=True, kw_only=True)
class CheckpointRecord:
    stage: str  # sft, dpo or rlvr
    path: str
    sha256: str
    num_bytes: int
    policy_version: int  # optimizer steps taken in this stage

    def as_dict(self) -> dict:
        return {"stage": self.stage, "path": self.path, "sha256": self.sha256, "num_bytes": self.num_bytes,
                "policy_version": self.policy_version}


def save_policy(policy: CausalLM, path: Path, *, stage: str, policy_version: int) -> CheckpointRecord:
    """Write atomically (temporary file, fsync, rename): a crash never leaves a partial file
    under the final name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    state = {k: v.detach().cpu() for k, v in policy.state_dict().items()}
    with partial.open("wb") as handle:
        torch.save(state, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)
    return CheckpointRecord(stage=stage, path=str(path), sha256=file_sha256(path), num_bytes=path.stat().st_size,
                            policy_version=policy_version)


def load_policy(policy: CausalLM, record: CheckpointRecord) -> CausalLM:
    """Load `record` into `policy` (same architecture) after checking its digest."""
    try:
        data = Path(record.path).read_bytes()  # once: what is hashed is what is loaded
    except OSError:
        data = None
    if data is None or hashlib.sha256(data).hexdigest() != record.sha256:
        raise ItoError(ErrorCode.CHECKPOINT_DIGEST_MISMATCH, f"the {record.stage} checkpoint is missing or changed")
    policy.load_state_dict(torch.load(io.BytesIO(data), map_location="cpu", weights_only=True))
    return policy
