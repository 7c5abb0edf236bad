"""`ito plan --booking ID --manifest PATH --json`: the parallelism, precision and cost plan of a
manifest's run, computed on this machine. Inspection only: no workload is created, no API is
contacted. The hardware comes from flags until the booking lookup of the canonical API is wired
here; the booking id is carried through so that the plan names what it was made for.
"""

from __future__ import annotations

import argparse
import re

from ito_assets.api.cli import Outcome
from ito_assets.errors import ErrorCode, ItoError

_BOOKING_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
NOTICE = "plan computed locally from the manifest and the hardware flags; the booking was not looked up and no workload was created"


def register(verbs: argparse._SubParsersAction) -> None:
    from ito_assets.training.hardware import GPUS, Network

    plan = verbs.add_parser("plan", help="plan a manifest's run on booked hardware (creates no workload)")
    plan.add_argument("--booking", required=True, help="server-verified booking id the plan is for")
    plan.add_argument("--manifest", required=True, help="absolute, canonical path of the reviewed JSON file")
    plan.add_argument("--gpu-type", required=True, choices=sorted(GPUS), help="the booked GPU type")
    plan.add_argument("--nodes", required=True, type=int, help="number of nodes")
    plan.add_argument("--gpus-per-node", required=True, type=int, help="GPUs per node")
    plan.add_argument("--network", required=True, choices=[n.value for n in Network], help="inter-node fabric")
    plan.add_argument("--price-cents-per-gpu-hour", required=True, type=int, help="booking price, US cents per GPU-hour")
    plan.add_argument("--json", action="store_true", help="print one JSON document")
    plan.set_defaults(handler=_plan)


def _hardware(args: argparse.Namespace):
    from ito_assets.training.hardware import gpu_spec, network_spec
    from ito_assets.training.planner import Hardware

    for name in ("nodes", "gpus_per_node"):
        if getattr(args, name) < 1:
            raise ItoError(ErrorCode.USAGE_ERROR, f"--{name.replace('_', '-')} must be a positive integer")
    if args.price_cents_per_gpu_hour < 0:
        raise ItoError(ErrorCode.USAGE_ERROR, "--price-cents-per-gpu-hour must be >= 0")
    return Hardware(gpu=gpu_spec(args.gpu_type), network=network_spec(args.network), num_nodes=args.nodes,
                    gpus_per_node=args.gpus_per_node, price_cents_per_gpu_hour=args.price_cents_per_gpu_hour)


def _plan(args: argparse.Namespace) -> Outcome:
    from ito_assets.manifest import verify
    from ito_assets.settings import load_settings
    from ito_assets.training.run_plan import plan_run

    if not _BOOKING_ID.fullmatch(args.booking):
        raise ItoError(ErrorCode.USAGE_ERROR, "--booking must be a booking id (letters, digits, . _ : -)")
    hardware = _hardware(args)
    verified = verify.verify_manifest(args.manifest, max_bytes=load_settings().max_manifest_bytes)
    run_plan = plan_run(verified.manifest, hardware)  # PlanRefused is an ItoError (PLAN_REFUSED)
    data = {"booking_id": args.booking, "manifest_digest": verified.digest, "workload_created": False,
            "plan": run_plan.to_dict()}
    return Outcome(data=data, live_api_contacted=False, notice=NOTICE, text=_text(data))


def _text(data: dict) -> list[str]:
    plan = data["plan"]
    lines = [f"plan for booking {data['booking_id']}, manifest {data['manifest_digest']}",
             f"model: {plan['model']['name']} ({plan['model']['num_parameters']:,} parameters)"]
    for stage in plan["stages"]:
        layout = ", ".join(f"{k}={v}" for k, v in stage["layout"].items())
        lines.append(f"  {stage['stage']}: {layout}; {stage['memory_per_gpu']['total_gib']} GiB/GPU, "
                     f"MFU {stage['step']['mfu']:.1%}, {stage['num_steps']} steps, {stage['cost_cents'] / 100:,.2f} USD")
    budget = plan["budget"]
    lines.append(f"cost: {plan['cost_cents'] / 100:,.2f} USD (cap {budget['cap_cents'] / 100:,.2f}, "
                 f"max incremental {budget['max_incremental_cents'] / 100:,.2f}); no workload created")
    return lines
