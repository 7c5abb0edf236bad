"""The stage worker with its loss made NaN at one step (`ITO_NAN_AT_STEP`, 1-based; one micro-batch
per step), for the non-finite fault test. Launched under torchrun like the worker itself:

    python -m torch.distributed.run --standalone --nproc-per-node 2 nan_driver.py --config CONFIG
"""

from __future__ import annotations

import os
import sys

from ito_assets.runtime.worker import execution, main

BROKEN_STEP = int(os.environ["ITO_NAN_AT_STEP"])
_forward = execution.LossModule.forward
_calls = [0]


def forward(self, tokens, targets):
    _calls[0] += 1
    loss = _forward(self, tokens, targets)
    return loss * float("nan") if _calls[0] == BROKEN_STEP else loss


execution.LossModule.forward = forward

if __name__ == "__main__":
    sys.exit(main.main(sys.argv[1:]))
