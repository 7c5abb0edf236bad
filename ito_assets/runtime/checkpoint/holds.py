"""Holds: checkpoints that pruning must keep although they are older than `keep_last`.

A pending spike proposal holds the checkpoint it proposes to restart from, so that the checkpoint
still exists when the desk approves; the hold is released when the proposal is rejected or applied.
"""

from __future__ import annotations

from pathlib import Path

HOLDS_NAME = "holds"


def hold(stage_dir: Path, step: int, holder: str) -> None:
    """Keep the checkpoint of `step` through pruning until `holder` releases it (a spike proposal
    must still find the checkpoint it proposes to restart from when the desk approves it)."""
    folder = stage_dir / HOLDS_NAME
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"step-{step:09d}.{holder}").touch()


def release(stage_dir: Path, holder: str) -> None:
    for path in (stage_dir / HOLDS_NAME).glob(f"step-*.{holder}"):
        path.unlink(missing_ok=True)


def held_steps(stage_dir: Path) -> set[int]:
    folder = stage_dir / HOLDS_NAME
    return {int(p.name[5:14]) for p in folder.glob("step-*.*")} if folder.is_dir() else set()
