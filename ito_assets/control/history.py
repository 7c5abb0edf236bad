"""What past runs on the same kind of block delivered, for the desk's quote of a new one.

A block is known by what the desk sells: the GPU type, the number of GPUs and the number of nodes.
The training telemetry of each finished run (`defs.telemetry` `training_telemetry`) is published to
the ledger as run figures (RUN_FIGURES, the run row of the warehouse table `training_telemetry`);
this module sums them over the runs of blocks like the one being quoted:

- expected goodput = productive seconds / allocated seconds, over all those runs (time-weighted:
  a long run counts for its length);
- unplanned interruptions per 1,000 device-hours, over their device-hours;
- effective price per productive GPU-hour = the list price / the expected goodput: what an hour of
  training that advances the model costs on such a block.

A run's figures are published at each of its stages' ends and by its telemetry, each time beside
the earlier ones: the last published stands. So a run that failed, was cancelled or stopped at a
gate counts with what it used; a run still queued or training does not count until it ends.

With no past run of that kind the quote says so and gives the list price alone.
"""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass

import sqlalchemy as sa

from ito_assets.control.bookings import BookingTerms
from ito_assets.control.ledger import bookings, run_metrics, runs
from ito_assets.control.states import TERMINAL_RUN_STATES

ALLOCATED = "run/allocated_seconds"
PRODUCTIVE = "run/productive_seconds"
DEVICE_HOURS = "run/device_hours"
UNPLANNED = "run/unplanned_interruptions"
RUN_FIGURES = (ALLOCATED, PRODUCTIVE, DEVICE_HOURS, UNPLANNED)


@dataclass(frozen=True, kw_only=True)
class BlockHistory:
    block: str  # "8 x H100-SXM over 1 node(s)"
    num_runs: int
    list_price_per_gpu_hour_cents: int
    expected_goodput: float | None  # None: no past run of this kind
    unplanned_interruptions_per_1000_device_hours: float | None
    effective_price_per_productive_gpu_hour_cents: float | None

    def to_dict(self) -> dict:
        return asdict(self)


def run_figures(row: dict) -> dict[str, float]:
    """A run row of `training_telemetry` as the figures this module reads back from the ledger."""
    return {ALLOCATED: row["allocated_seconds"], PRODUCTIVE: row["productive_seconds"],
            DEVICE_HOURS: row["device_hours"],
            UNPLANNED: row["unplanned_interruptions_per_1000_device_hours"] * row["device_hours"] / 1000.0}


def block_history(conn: sa.Connection, terms: BookingTerms) -> BlockHistory:
    # Past runs: ended, however (a run still training has published its first stages' figures only).
    like_runs = (sa.select(runs.c.run_id).join(bookings, bookings.c.booking_id == runs.c.booking_id)
                 .where(bookings.c.gpu_type == terms.gpu_type, bookings.c.num_gpus == terms.num_gpus,
                        bookings.c.num_nodes == terms.num_nodes,
                        runs.c.state.in_(sorted(state.value for state in TERMINAL_RUN_STATES))))
    # A run's figures are published at each stage's end and by its telemetry: the last of each stands.
    latest = (sa.select(sa.func.max(run_metrics.c.seq))
              .where(run_metrics.c.run_id.in_(like_runs), run_metrics.c.name.in_(RUN_FIGURES))
              .group_by(run_metrics.c.run_id, run_metrics.c.name))
    # A run whose last figure is not a number (an older release stored infinities, and NaN on
    # PostgreSQL; `ito metrics` shows them as null) is left out whole: what it delivered is unknown,
    # and one such figure would make the quote's JSON impossible. NaN compares above every number
    # on PostgreSQL (SQLite cannot store it: the column is NOT NULL).
    unknown = (sa.select(run_metrics.c.run_id)
               .where(run_metrics.c.seq.in_(latest),
                      sa.not_(run_metrics.c.value.between(-sys.float_info.max, sys.float_info.max))))
    query = (sa.select(run_metrics.c.name, sa.func.sum(run_metrics.c.value), sa.func.count(sa.distinct(run_metrics.c.run_id)))
             .where(run_metrics.c.seq.in_(latest), run_metrics.c.run_id.not_in(unknown)).group_by(run_metrics.c.name))
    sums, counts = {}, {}
    for name, total, count in conn.execute(query):
        if math.isfinite(float(total)):  # finite figures whose sum passes a double's range count as none
            sums[name], counts[name] = float(total), int(count)
    block = f"{terms.num_gpus} x {terms.gpu_type} over {terms.num_nodes} node(s)"
    price = terms.price_per_gpu_hour_cents
    if sums.get(ALLOCATED, 0.0) <= 0 or sums.get(DEVICE_HOURS, 0.0) <= 0:
        return BlockHistory(block=block, num_runs=0, list_price_per_gpu_hour_cents=price, expected_goodput=None,
                            unplanned_interruptions_per_1000_device_hours=None,
                            effective_price_per_productive_gpu_hour_cents=None)
    goodput = sums.get(PRODUCTIVE, 0.0) / sums[ALLOCATED]
    return BlockHistory(
        block=block, num_runs=counts[ALLOCATED], list_price_per_gpu_hour_cents=price, expected_goodput=goodput,
        unplanned_interruptions_per_1000_device_hours=1000.0 * sums.get(UNPLANNED, 0.0) / sums[DEVICE_HOURS],
        effective_price_per_productive_gpu_hour_cents=price / goodput if goodput > 0 else None,
    )


def describe(history: BlockHistory) -> str:
    """One line for a person reading the quote."""
    list_price = f"{history.list_price_per_gpu_hour_cents / 100:,.2f} USD per GPU-hour"
    if history.expected_goodput is None:
        return f"no past run on {history.block}: expected goodput unknown; list price {list_price}"
    effective = history.effective_price_per_productive_gpu_hour_cents
    priced = (f"{effective / 100:,.2f} USD per productive GPU-hour (list {list_price})" if effective is not None
              else f"no productive hour to price (list {list_price})")
    return (f"from {history.num_runs} past run(s) on {history.block}: expected goodput {history.expected_goodput:.1%}, "
            f"{history.unplanned_interruptions_per_1000_device_hours:.2f} unplanned interruptions per 1,000 "
            f"device-hours; {priced}")
