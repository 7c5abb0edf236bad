"""What past runs on the same kind of block delivered, for the desk's quote of a new one.

A block is known by what the desk sells: the GPU type, the number of GPUs and the number of nodes.
The training telemetry of each finished run (`defs.telemetry` `training_telemetry`) is published to
the ledger as run figures (RUN_FIGURES, the run row of the warehouse table `training_telemetry`);
this module sums them over the runs of blocks like the one being quoted:

- expected goodput = productive device-seconds / allocated device-seconds, over all those runs:
  each run's window counts every GPU of its booked block, so a long run counts for its length and
  a stage that held fewer GPUs than booked (post-training on one of eight) counts the rest as
  badput (`goodput.summarize_run`). A run published by an earlier release has its seconds only:
  it counts with its seconds' share, at the block's GPUs (every like run has that many), as it
  counted then;
- unplanned interruptions per 1,000 device-hours, over their device-hours (none where no run
  names its device-hours: logs written before they did);
- effective price per productive GPU-hour = the list price / the expected goodput: what an hour of
  training that advances the model costs on such a block. Not stated below MIN_PRICED_GOODPUT.

A run's figures are published at each of its stages' ends and by its telemetry, each time beside
the earlier ones: the last published stands. So a run that failed, was cancelled or stopped at a
gate counts with what it used; a run still queued or training does not count until it ends.

An account's quote pools every account's runs only where they are runs of at least
MIN_POOLED_ACCOUNTS accounts and no other account's runs dominate what the asker does not know
(`MIN_REST_PERCENT`); otherwise it states the account's own runs (`scope`). It reads the pooled
figures rounded (`_coarse`). The desk's view (no account) is always pooled, and exact.

With no past run of that kind the quote says so and gives the list price alone.
"""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass

import sqlalchemy as sa

from ito_assets.control.bookings import BookingTerms
from ito_assets.control.ledger import bookings, run_metrics, runs
from ito_assets.control.states import TERMINAL_RUN_STATES

ALLOCATED = "run/allocated_seconds"
PRODUCTIVE = "run/productive_seconds"
DEVICE_HOURS = "run/device_hours"
UNPLANNED = "run/unplanned_interruptions"
ALLOCATED_DEVICE_SECONDS = "run/allocated_device_seconds"
PRODUCTIVE_DEVICE_SECONDS = "run/productive_device_seconds"
RUN_FIGURES = (ALLOCATED, PRODUCTIVE, DEVICE_HOURS, UNPLANNED, ALLOCATED_DEVICE_SECONDS, PRODUCTIVE_DEVICE_SECONDS)

# The k of k-anonymity (Sweeney 2002) for the pooled figures an account reads: they stand for
# runs of at least k accounts. With two, one of them asking, the asker takes its own runs (which it
# knows) out of the sums and reads the other tenant's goodput and failure rate exactly; from three,
# what is left mixes at least two other tenants.
MIN_POOLED_ACCOUNTS = 3

# The p% rule (Hundepool et al., Handbook on Statistical Disclosure Control, ch. 4, "Sensitive cells
# in magnitude tables"), the asker as the intruder who knows its own runs: where one other account
# holds nearly all of the rest, the pooled goodput less the asker's runs is that account's, however
# many accounts took part. Pooled only where the runs of every account but the asker and the
# largest other add up to at least this share of the largest's, in allocated device-seconds (the
# goodput's weights) and in device-hours (the interruption rate's). The handbook keeps its p
# private; this one is public, and the bound it gives is loose: a tenant mixed with a tenth as much
# of others' runs.
MIN_REST_PERCENT = 10

# Below this expected goodput the effective price is not stated: the history is then nearly all
# badput (runs that failed while starting), and a price over 100 times the list price reads as a
# quote where it is no more than a division by almost nothing. The goodput itself is still shown.
MIN_PRICED_GOODPUT = 0.01


class HistoryScope(str, enum.Enum):
    POOLED = "pooled"  # every account's runs on such blocks
    ACCOUNT = "account"  # the asking account's own runs: too few accounts to pool


@dataclass(frozen=True, kw_only=True)
class BlockHistory:
    block: str  # "8 x H100-SXM over 1 node(s)"
    num_runs: int
    list_price_per_gpu_hour_cents: int
    expected_goodput: float | None  # None: no past run of this kind
    unplanned_interruptions_per_1000_device_hours: float | None
    effective_price_per_productive_gpu_hour_cents: float | None
    scope: str = HistoryScope.POOLED.value  # an older server sent none: its figures were pooled

    def to_dict(self) -> dict:
        return {**asdict(self), "scope": HistoryScope(self.scope).value}


@dataclass(frozen=True)
class _PastRun:
    account_id: str
    allocated_device_seconds: float
    productive_device_seconds: float
    device_hours: float
    unplanned: float


def run_figures(row: dict) -> dict[str, float]:
    """A run row of `training_telemetry` as the figures this module reads back from the ledger (a
    row without device-seconds, as an earlier release made, gives the figures it published)."""
    figures = {ALLOCATED: row["allocated_seconds"], PRODUCTIVE: row["productive_seconds"],
               DEVICE_HOURS: row["device_hours"],
               UNPLANNED: row["unplanned_interruptions_per_1000_device_hours"] * row["device_hours"] / 1000.0}
    if "allocated_device_seconds" in row:
        figures[ALLOCATED_DEVICE_SECONDS] = row["allocated_device_seconds"]
        figures[PRODUCTIVE_DEVICE_SECONDS] = row["productive_device_seconds"]
    return figures


def block_history(conn: sa.Connection, terms: BookingTerms, account_id: str | None = None) -> BlockHistory:
    """What past runs on blocks like `terms` delivered. `account_id`: the account asking, whose
    view is pooled only over runs of MIN_POOLED_ACCOUNTS accounts or more; None: the desk's."""
    past = [run for run in _past_runs(conn, terms) if run.allocated_device_seconds > 0]
    scope = HistoryScope.POOLED
    if account_id is not None and not _poolable(past, account_id):
        scope, past = HistoryScope.ACCOUNT, [run for run in past if run.account_id == account_id]
    block = f"{terms.num_gpus} x {terms.gpu_type} over {terms.num_nodes} node(s)"
    price = terms.price_per_gpu_hour_cents
    allocated = _sum(run.allocated_device_seconds for run in past)
    productive = _sum(run.productive_device_seconds for run in past)
    # Finite figures whose sum passes a double's range say nothing: no history, as with no run.
    goodput = _ratio(productive, allocated)
    if goodput is None:
        return BlockHistory(block=block, num_runs=0, list_price_per_gpu_hour_cents=price, expected_goodput=None,
                            unplanned_interruptions_per_1000_device_hours=None,
                            effective_price_per_productive_gpu_hour_cents=None, scope=scope.value)
    goodput = min(1.0, goodput)
    per_1000 = _ratio(1000.0 * _sum(run.unplanned for run in past), _sum(run.device_hours for run in past))
    if account_id is not None and scope is HistoryScope.POOLED:
        goodput, per_1000 = _coarse(goodput, per_1000)
    effective = price / goodput if goodput >= MIN_PRICED_GOODPUT else None
    return BlockHistory(
        block=block, num_runs=len(past), list_price_per_gpu_hour_cents=price, expected_goodput=goodput,
        unplanned_interruptions_per_1000_device_hours=per_1000,
        effective_price_per_productive_gpu_hour_cents=effective, scope=scope.value,
    )


def _poolable(past: list[_PastRun], asker: str) -> bool:
    """Runs of MIN_POOLED_ACCOUNTS accounts or more, none of the asker's rivals dominating them."""
    if len({run.account_id for run in past}) < MIN_POOLED_ACCOUNTS:
        return False
    return not (_dominated(past, asker, lambda run: run.allocated_device_seconds)
                or _dominated(past, asker, lambda run: run.device_hours))


def _dominated(past: list[_PastRun], asker: str, weight) -> bool:
    """The p% rule on `weight`: the accounts other than the asker and the largest other hold less
    than MIN_REST_PERCENT % of the largest's."""
    held: dict[str, list[float]] = {}
    for run in past:
        if run.account_id != asker:
            held.setdefault(run.account_id, []).append(weight(run))
    shares = sorted(_sum(values) for values in held.values())
    if not shares:
        return True
    return 100.0 * _sum(shares[:-1]) < MIN_REST_PERCENT * shares[-1]


def _coarse(goodput: float, per_1000: float | None) -> tuple[float, float | None]:
    """The pooled figures an account reads, rounded: to a percentage point of goodput and a tenth
    of an interruption per 1,000 device-hours. Exact figures would let an account that compares
    its quotes before and after a run of its own (whose figures it knows) solve for the pool's
    sums, and then read each rival run that ends between two later quotes; rounded, a run shows
    only as far as it moves the pool by a point."""
    return round(goodput, 2), None if per_1000 is None else round(per_1000, 1)


def _sum(values) -> float:
    """math.fsum, infinite where finite values add up past a double's range (fsum raises there)."""
    try:
        return math.fsum(values)
    except OverflowError:
        return math.inf


def _ratio(numerator: float, denominator: float) -> float | None:
    """numerator / denominator where both are finite, the denominator positive and the quotient
    finite; else None (the answer's JSON refuses infinities)."""
    if not (math.isfinite(numerator) and math.isfinite(denominator)) or denominator <= 0:
        return None
    quotient = numerator / denominator
    return quotient if math.isfinite(quotient) else None


def _past_runs(conn: sa.Connection, terms: BookingTerms) -> list[_PastRun]:
    """Each ended run on a block like `terms`, with the last of each of its figures. A run whose
    last figure is not a number (an older release stored infinities, and NaN on PostgreSQL; `ito
    metrics` shows them as null) is left out whole: what it delivered is unknown."""
    like_runs = (sa.select(runs.c.run_id).join(bookings, bookings.c.booking_id == runs.c.booking_id)
                 .where(bookings.c.gpu_type == terms.gpu_type, bookings.c.num_gpus == terms.num_gpus,
                        bookings.c.num_nodes == terms.num_nodes,
                        runs.c.state.in_(sorted(state.value for state in TERMINAL_RUN_STATES))))
    latest = (sa.select(sa.func.max(run_metrics.c.seq))
              .where(run_metrics.c.run_id.in_(like_runs), run_metrics.c.name.in_(RUN_FIGURES))
              .group_by(run_metrics.c.run_id, run_metrics.c.name))
    query = (sa.select(run_metrics.c.run_id, runs.c.account_id, run_metrics.c.name, run_metrics.c.value)
             .join(runs, runs.c.run_id == run_metrics.c.run_id).where(run_metrics.c.seq.in_(latest)))
    figures: dict[str, tuple[str, dict[str, float]]] = {}
    for run_id, account, name, value in conn.execute(query):
        figures.setdefault(run_id, (account, {}))[1][name] = float(value)
    return [_past_run(account, named, terms.num_gpus) for account, named in figures.values()
            if all(math.isfinite(v) for v in named.values())]


def _past_run(account_id: str, figures: dict[str, float], num_gpus: int) -> _PastRun:
    """One run's figures in device-seconds. Published by an earlier release (seconds only), its
    window and productive seconds count at the block's GPUs: its seconds' share, as it counted
    then. Negative figures (none is published so) count as nothing."""
    at = lambda name: max(0.0, figures.get(name, 0.0))
    if ALLOCATED_DEVICE_SECONDS in figures:
        allocated, productive = at(ALLOCATED_DEVICE_SECONDS), at(PRODUCTIVE_DEVICE_SECONDS)
    else:
        allocated, productive = at(ALLOCATED) * num_gpus, at(PRODUCTIVE) * num_gpus
    return _PastRun(account_id=account_id, allocated_device_seconds=allocated,
                    productive_device_seconds=min(productive, allocated), device_hours=at(DEVICE_HOURS),
                    unplanned=at(UNPLANNED))


def describe(history: BlockHistory) -> str:
    """One line for a person reading the quote."""
    list_price = f"{history.list_price_per_gpu_hour_cents / 100:,.2f} USD per GPU-hour"
    own = history.scope == HistoryScope.ACCOUNT.value
    whose = " of this account" if own else ""
    if history.expected_goodput is None:
        return f"no past run{whose} on {history.block}: expected goodput unknown; list price {list_price}"
    effective = history.effective_price_per_productive_gpu_hour_cents
    priced = (f"{effective / 100:,.2f} USD per productive GPU-hour (list {list_price})" if effective is not None
              else f"too little productive time to price (list {list_price})")
    rate = history.unplanned_interruptions_per_1000_device_hours
    interruptions = (f"{rate:.2f} unplanned interruptions per 1,000 device-hours" if rate is not None
                     else "interruption rate unknown (no device-hours recorded)")
    pooled = (f" (pooled only over runs of {MIN_POOLED_ACCOUNTS} or more accounts, none holding nearly all of"
              " the others')" if own else "")
    return (f"from {history.num_runs} past run(s){whose} on {history.block}{pooled}: expected goodput "
            f"{history.expected_goodput:.1%}, {interruptions}; {priced}")
