"""Runs the stage worker once per config, one after another, in one process group: what
`ito_assets.runtime.worker.main` does for one config, without paying torchrun's start-up per
layout (a two-rank launch costs 8-9 CPU-seconds on two cores, whatever it trains). Launched by
the layout tests under torchrun:

    python -m torch.distributed.run --standalone --nproc-per-node 4 layout_driver.py A.json B.json

A config that stops itself (`stop_after_step`: the first half of a resume) goes on to the next;
any other failure ends the launch with its code.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ito_assets.runtime.stage.config import WorkerConfig
from ito_assets.runtime.worker import distributed
from ito_assets.runtime.worker.main import EXIT_STOPPED, StageWorker
from ito_assets.runtime.worker.reporting import open_reporter


def main(paths: list[str]) -> int:
    group = distributed.init(collective_timeout_s=120.0)
    try:
        for path in paths:
            config = WorkerConfig.from_argument(path)
            with open_reporter(group.rank, Path(config.metrics_path), pipes=False) as reporter:
                code = StageWorker(config, group, reporter).run()
            if code and not (code == EXIT_STOPPED and config.stop_after_step is not None):
                return code
        return 0
    finally:
        distributed.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
