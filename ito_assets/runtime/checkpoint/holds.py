"""Holds: checkpoints that pruning must keep although they are older than `keep_last`.

A pending spike proposal holds the checkpoint it proposes to restart from, so that the checkpoint
still exists when the desk approves; the hold is released when the proposal is rejected or applied.

A hold is an entry `holds/step-NNNNNNNNN.<holder>` (nine ASCII digits). Its name alone decides:
an empty file is what `hold` writes, and an entry of that name of any other kind (a directory)
still holds its step, since keeping a checkpoint too long loses nothing while pruning a held one
loses the desk's restart point. A name not of that form (a stray or hand-made file) holds nothing
and is logged once; it must never stop pruning, which runs after every save.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

HOLDS_NAME = "holds"
_HOLD = re.compile(r"step-([0-9]{9})\.(.+)")  # the whole name (fullmatch); ASCII digits, a holder
_log = logging.getLogger(__name__)
_reported: set[Path] = set()  # malformed names already logged: pruning reads the folder at every save


def hold(stage_dir: Path, step: int, holder: str) -> None:
    """Keep the checkpoint of `step` through pruning until `holder` releases it (a spike proposal
    must still find the checkpoint it proposes to restart from when the desk approves it)."""
    folder = stage_dir / HOLDS_NAME
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"step-{step:09d}.{holder}").touch()


def release(stage_dir: Path, holder: str) -> None:
    folder = stage_dir / HOLDS_NAME
    if not folder.is_dir():
        return
    for path in folder.iterdir():
        match = _HOLD.fullmatch(path.name)
        if match is None or match.group(2) != holder:
            continue
        if path.is_dir() and not path.is_symlink():
            try:
                path.rmdir()  # an empty one; anything inside is not ours to delete, so it keeps holding
            except OSError:
                _log.warning("hold %s is a non-empty directory; left in place, still holding", path)
        else:
            path.unlink(missing_ok=True)


def held_steps(stage_dir: Path) -> set[int]:
    """The steps held. Raises OSError when the folder cannot be listed: the caller must then keep
    everything, as an unreadable hold is not a released one."""
    folder = stage_dir / HOLDS_NAME
    if not folder.is_dir():
        return set()
    steps = set()
    for path in folder.iterdir():
        match = _HOLD.fullmatch(path.name)
        if match is not None:
            steps.add(int(match.group(1)))
        elif path not in _reported:
            _reported.add(path)
            _log.warning("ignoring %s in the holds folder: not a hold's name (step-NNNNNNNNN.<holder>)", path)
    return steps
