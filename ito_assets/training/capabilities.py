"""What the stage runtime can execute, in one place: the planner searches and judges layouts
within it, so that it never prices a layout the runtime would refuse or quietly run differently.

Free of torch (the planner runs in the code location). The price model knows pipeline and
context parallelism and fp8 matmuls; the worker has no pipeline schedule, no ring attention and
no fp8 conversion yet, so the planner does not offer them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Capabilities:
    tensor_parallel: bool = True
    pipeline_parallel: bool = False  # no pipeline schedule in the worker
    context_parallel: bool = False  # no ring attention in the worker
    fp8: bool = False

    @classmethod
    def everything(cls) -> "Capabilities":
        """Every dimension the price model knows: for judging the rules themselves."""
        return cls(tensor_parallel=True, pipeline_parallel=True, context_parallel=True, fp8=True)

    def describe(self) -> dict[str, bool]:
        return dict(vars(self))


def runtime_capabilities() -> Capabilities:
    """The stage worker's (`ito_assets.runtime.worker`): data parallelism (DDP, FSDP2, HSDP,
    torchft replica groups) and tensor parallelism, in bf16."""
    return Capabilities()
