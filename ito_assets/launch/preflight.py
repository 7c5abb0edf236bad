"""A distributed preflight: every rank joins the process group and all-reduces its rank. Run
through any launcher before a training block is spent, it proves that rendezvous, the backend
and the network work at the planned world size. Rank 0 writes the result as JSON."""

from __future__ import annotations

import argparse
import json
import os
import socket

import torch
import torch.distributed as dist


def main() -> int:
    parser = argparse.ArgumentParser(prog="ito-preflight")
    parser.add_argument("--out", required=True, help="JSON file rank 0 writes")
    parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    args = parser.parse_args()
    if args.backend == "nccl":  # each local rank on its own device before NCCL binds one
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend=args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if args.backend == "nccl" else torch.device("cpu")
    total = torch.tensor([float(rank)], device=device)
    dist.all_reduce(total)
    hosts = [None] * world
    dist.all_gather_object(hosts, {"rank": rank, "host": socket.gethostname(), "group_rank": os.environ.get("GROUP_RANK")})
    if rank == 0:
        with open(args.out, "w") as handle:
            json.dump({"world_size": world, "rank_sum": total.item(), "ranks": hosts}, handle)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
