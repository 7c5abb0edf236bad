"""The stage worker with rank 0's completion marker failing for a full disk at given steps
(`ITO_ENOSPC_AT_STEPS`, comma-separated): a save that fails on one rank only, the case every rank
must still agree on. Launched under torchrun like the worker itself."""

from __future__ import annotations

import errno
import os
import sys

from ito_assets.runtime.checkpoint import markers
from ito_assets.runtime.worker import main

FAILING = {int(s) for s in os.environ["ITO_ENOSPC_AT_STEPS"].split(",")}
_write_marker = markers.write_marker


def write_marker(folder, step, **fields):
    if step in FAILING:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder / markers.MARKER_NAME))
    return _write_marker(folder, step, **fields)


markers.write_marker = write_marker

if __name__ == "__main__":
    sys.exit(main.main(sys.argv[1:]))
