"""What an account has spent: `ito runs list` (its runs, filtered and paged) and `ito budget`
(each manifest's cap, spent, reserved and left), read from the ledger through the API with the
query the budget gate itself sums. Read-only."""

from __future__ import annotations

import argparse
from urllib.parse import urlencode

from ito_assets.api.commands import paging
from ito_assets.api.commands.result import VerbResult
from ito_assets.errors import ErrorCode, ItoError

MAX_LIMIT = 500


def register(verbs: argparse._SubParsersAction) -> None:
    from ito_assets.control.states import RunState

    listing = verbs.add_parser("runs", help="this account's runs").add_subparsers(dest="runs_verb", required=True)
    runs = listing.add_parser("list", help="this account's runs, oldest first, filtered and paged")
    runs.add_argument("--manifest", help="only runs of this manifest digest (sha256:...)")
    runs.add_argument("--booking", help="only runs on this booking")
    runs.add_argument("--state", choices=[s.value for s in RunState], help="only runs in this state")
    runs.add_argument("--after", help="the last run id of the previous page")
    runs.add_argument("--limit", type=int, default=None,
                      help=f"at most this many runs (1-{MAX_LIMIT}, default 100); with --all, per request")
    runs.add_argument("--all", action="store_true",
                      help="every run: follows the cursor page by page to the end, one document in all")
    runs.add_argument("--json", action="store_true", help="print one JSON document")
    runs.set_defaults(handler=_runs)
    budget = verbs.add_parser("budget", help="each manifest's budget: cap, spent, reserved, left")
    budget.add_argument("--manifest", help="only this manifest digest (sha256:...)")
    budget.add_argument("--json", action="store_true", help="print one JSON document")
    budget.set_defaults(handler=_budget)


def query(**params: object) -> str:
    given = {name: value for name, value in params.items() if value is not None}
    return f"?{urlencode(given)}" if given else ""


def budget_lines(budgets: list[dict]) -> list[str]:
    return [f"  {b['manifest_digest']}: cap {b['cap_cents'] / 100:,.2f}, spent {b['spent_cents'] / 100:,.2f}, "
            f"reserved {b['reserved_cents'] / 100:,.2f}, left {b['left_cents'] / 100:,.2f} USD "
            f"({b['num_runs']} runs)" for b in budgets]


def _runs(args: argparse.Namespace) -> VerbResult:
    from ito_assets.api.client_config import connect

    limit = args.limit if args.limit is not None else (MAX_LIMIT if args.all else 100)
    if not 1 <= limit <= MAX_LIMIT:
        raise ItoError(ErrorCode.USAGE_ERROR, f"--limit must be between 1 and {MAX_LIMIT}")
    client = connect(timeout_s=args.timeout)
    filters = dict(manifest_digest=args.manifest, booking_id=args.booking, state=args.state, limit=limit)
    get = lambda after: client.get("/v1/runs" + query(**filters, after=after))  # noqa: E731
    data = paging.follow(get, args.after, "runs") if args.all else get(args.after)
    listed, total = data.get("runs", []), data.get("num_total")
    text = [paging.count_phrase(len(listed), total, "runs")]
    text += [f"  {r['run_id']}  {r['state']}  booking {r['booking_id']}  {r['cost_cents'] / 100:,.2f} USD  "
             f"manifest {r['manifest_sha256']}" for r in listed]
    text += paging.more_lines(len(listed), total, data.get("next_after"))
    return VerbResult(data=data, live_api_contacted=client.contacted, text=text)


def _budget(args: argparse.Namespace) -> VerbResult:
    from ito_assets.api.client_config import connect

    client = connect(timeout_s=args.timeout)
    data = client.get("/v1/budgets" + query(manifest_digest=args.manifest))
    return VerbResult(data=data, live_api_contacted=client.contacted,
                   text=[f"budgets of {data.get('account_id')}: {data.get('num_budgets')}",
                         *budget_lines(data.get("budgets", []))])
