"""`ito plan --booking ID --manifest PATH --json`: the parallelism, precision and memory plan of a
manifest's run on the booked hardware, and the cost a train confirmation for them will bind.

Inspection only: no confirmation is issued and no workload is created. The booking is read
through the API (POST /v1/quotes), which prices the run with the very gate a confirmation
request runs, so `cost_cents` here is the cost the desk will be asked to approve. The plan's own
per-stage figures are the compute the run is expected to use inside that block.

The plan printed is the server's, the one gate 5 checked against the booked window (post-training
included: the server reads the recipe's pair files). With every hardware flag (--gpu-type, --nodes,
--gpus-per-node, --network, --price-cents-per-gpu-hour) the plan is computed offline instead, for a
booking not yet made: no API is contacted and there is no bound cost; the recipe's pair files are
read under this machine's data root, and where one cannot be read post-training is left out of the
plan, which says so (`post_training_included: false`, `post_training_unplanned`).
"""

from __future__ import annotations

import argparse
import base64
import re

from ito_assets.api.commands.result import VerbResult
from ito_assets.errors import ErrorCode, ItoError

_BOOKING_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
_HARDWARE_FLAGS = ("gpu_type", "nodes", "gpus_per_node", "network", "price_cents_per_gpu_hour")
OFFLINE_NOTICE = ("plan computed offline from the hardware flags: the booking was not looked up, no cost is "
                  "bound and no workload was created")


def register(verbs: argparse._SubParsersAction) -> None:
    from ito_assets.training.hardware import GPUS, Network

    plan = verbs.add_parser("plan", help="plan a manifest's run on its booking and price it (creates nothing)")
    plan.add_argument("--booking", required=True, help="server-verified booking id the plan is for")
    plan.add_argument("--manifest", required=True, help="absolute, canonical path of the reviewed JSON file")
    offline = plan.add_argument_group("offline", "all five together: plan without the API, for hardware not yet booked")
    offline.add_argument("--gpu-type", choices=sorted(GPUS), help="the GPU type")
    offline.add_argument("--nodes", type=int, help="number of nodes")
    offline.add_argument("--gpus-per-node", type=int, help="GPUs per node")
    offline.add_argument("--network", choices=[n.value for n in Network], help="inter-node fabric")
    offline.add_argument("--price-cents-per-gpu-hour", type=int, help="price, US cents per GPU-hour")
    plan.add_argument("--json", action="store_true", help="print one JSON document")
    plan.set_defaults(handler=_plan)


def _offline_hardware(args: argparse.Namespace):
    from ito_assets.training.hardware import gpu_spec, network_spec
    from ito_assets.training.planner import Hardware

    for name in ("nodes", "gpus_per_node"):
        if getattr(args, name) < 1:
            raise ItoError(ErrorCode.USAGE_ERROR, f"--{name.replace('_', '-')} must be a positive integer")
    if args.price_cents_per_gpu_hour < 0:
        raise ItoError(ErrorCode.USAGE_ERROR, "--price-cents-per-gpu-hour must be >= 0")
    return Hardware(gpu=gpu_spec(args.gpu_type), network=network_spec(args.network), num_nodes=args.nodes,
                    gpus_per_node=args.gpus_per_node, price_cents_per_gpu_hour=args.price_cents_per_gpu_hour)


def booked_hardware(booking: dict):
    """The planner's hardware for a booking as the API describes it."""
    from ito_assets.training.run_plan import booked_hardware as hardware

    return hardware(gpu_type=booking["gpu_type"], topology=booking.get("topology", ""), network=booking["network"], num_nodes=booking["num_nodes"],
                    num_gpus=booking["num_gpus"], price_per_gpu_hour_cents=booking["price_per_gpu_hour_cents"])


def _quote(args: argparse.Namespace, verified) -> tuple[dict, bool]:
    """The quote for the very bytes the plan was made from: reading the file a second time would
    let a manifest changed in between be priced while the first one's plan is printed."""
    from ito_assets.api.client_config import connect
    from ito_assets.manifest.verify import require_provenance

    require_provenance(verified.manifest)  # as the upload's own read refuses it, before anything is sent
    client = connect(timeout_s=args.timeout)
    quote = client.post("/v1/quotes", {"booking_id": args.booking, "manifest_digest": verified.digest,
                                       "manifest_b64": base64.b64encode(verified.raw.data).decode("ascii")})
    return quote, client.contacted


def _plan(args: argparse.Namespace) -> VerbResult:
    from ito_assets.manifest import verify
    from ito_assets.settings import load_settings
    from ito_assets.training.run_plan import plan_run

    if not _BOOKING_ID.fullmatch(args.booking):
        raise ItoError(ErrorCode.USAGE_ERROR, "--booking must be a booking id (letters, digits, . _ : -)")
    given = [name for name in _HARDWARE_FLAGS if getattr(args, name) is not None]
    if given and len(given) != len(_HARDWARE_FLAGS):
        raise ItoError(ErrorCode.USAGE_ERROR, "the offline hardware flags go together: give all five or none")
    verified = verify.verify_manifest(args.manifest, max_bytes=load_settings().max_manifest_bytes)
    data = {"booking_id": args.booking, "manifest_digest": verified.digest, "workload_created": False,
            "confirmation_issued": False}
    if given:
        shapes, unplanned = _local_pair_shapes(verified.manifest, load_settings().data_root)
        run_plan = plan_run(verified.manifest, _offline_hardware(args), pair_shapes=shapes)  # PlanRefused is PLAN_REFUSED
        data.update(cost_cents=None, plan=run_plan.to_dict())
        if unplanned:
            data["post_training_unplanned"] = unplanned
        return VerbResult(data=data, live_api_contacted=False, notice=OFFLINE_NOTICE, text=_text(data))
    quote, contacted = _quote(args, verified)
    # An older server sends no plan: the curriculum's, planned here, is what it checked.
    plan = quote.get("plan") or plan_run(verified.manifest, booked_hardware(quote["booking"]), pair_shapes=None).to_dict()
    data.update(cost_cents=quote["cost_cents"], budget=quote["budget"], booking=quote["booking"],
                history=quote.get("history"), time=quote.get("time"), plan=plan)
    return VerbResult(data=data, live_api_contacted=contacted, text=_text(data))


def _local_pair_shapes(manifest, data_root) -> tuple[dict | None, str | None]:
    """(the recipe's pair-file shapes, None) or (None, why they cannot be read here)."""
    from ito_assets.posttraining.plan import read_pair_shapes

    try:
        return read_pair_shapes(manifest.post_training, data_root,
                                held_out_fraction=manifest.post_training_eval.held_out_fraction), None
    except ItoError as error:
        return None, f"{error.code.value}: {error.message}"


def _text(data: dict) -> list[str]:
    plan = data["plan"]
    lines = [f"plan for booking {data['booking_id']}, manifest {data['manifest_digest']}",
             f"model: {plan['model']['name']} ({plan['model']['num_parameters']:,} parameters)"]
    for stage in plan["stages"]:
        layout = ", ".join(f"{k}={v}" for k, v in stage["layout"].items())
        lines.append(f"  {stage['stage']}: {layout}; {stage['memory_per_gpu']['total_gib']} GiB/GPU, "
                     f"MFU {stage['step']['mfu']:.1%}, {stage['num_steps']} steps, "
                     f"compute {stage['cost_cents'] / 100:,.2f} USD")
    for step in plan.get("post_training") or ():
        lines.append(f"  {step['stage']}: fp32 on {step['num_ranks']} rank(s), {step['num_steps']} steps of "
                     f"{step['sequence_length']} positions, worker {step['worker_seconds']:,.1f} s + host "
                     f"{step['host_seconds']:,.1f} s, compute {step['cost_cents'] / 100:,.2f} USD")
    if not plan.get("post_training_included", True):
        lines.append("  post-training: not planned" + (f" ({data['post_training_unplanned']})"
                                                       if data.get("post_training_unplanned") else ""))
    if data["cost_cents"] is None:
        lines.append(f"compute: {plan['cost_cents'] / 100:,.2f} USD at the flags' price; no cost bound, "
                     "no workload created")
        return lines
    budget = data["budget"]
    lines.append(f"cost: {data['cost_cents'] / 100:,.2f} USD, the booked block a confirmation binds "
                 f"(compute used: {plan['cost_cents'] / 100:,.2f} USD of it)")
    lines.append(f"budget: cap {budget['cap_cents'] / 100:,.2f}, committed {budget['committed_cents'] / 100:,.2f}, "
                 f"left {budget['left_cents'] / 100:,.2f} USD; no confirmation issued, no workload created")
    if data.get("time"):  # an older server sends none
        time = data["time"]
        covers = " (post-training included)" if time.get("post_training_included") else " (its curriculum stages; post-training is not planned)"
        lines.append(f"time: the plan takes {time['planned_wall_seconds'] / 3600:,.2f} h of the "
                     f"{time['window_left_seconds'] / 3600:,.2f} h left in the booked window{covers}")
    if data.get("history"):  # an older server sends none
        from ito_assets.control.history import BlockHistory, describe

        lines.append("history: " + describe(BlockHistory(**data["history"])))
    return lines
