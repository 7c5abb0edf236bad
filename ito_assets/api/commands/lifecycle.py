"""The run lifecycle through the same client: `status`
(by run id or idempotency key, `--watch` with backoff), `logs`, `metrics`, `checkpoints`,
`cancel` and `cleanup`; the last two are mutations with their own confirmation and key.
"""

from __future__ import annotations

import argparse
import math
import time

from ito_assets.api.commands import paging
from ito_assets.api.commands.result import VerbResult
from ito_assets.errors import ErrorCode, ItoError

# Watch backoff: start at --interval, grow by half each poll, never above 15 s, so a long run
# costs a poll every 15 s and a short one is seen ending within about a second.
_WATCH_GROWTH = 1.5
_WATCH_MAX_INTERVAL_S = 15.0
_LAST_POLL_S = 0.1
_STOP = frozenset({ErrorCode.AUTH_REQUIRED, ErrorCode.CREDENTIAL_REVOKED, ErrorCode.PERMISSION_DENIED,
                   ErrorCode.RUN_NOT_FOUND})
# Named `<stage>/<metric>` (ito_assets.runtime.record.publish, ito_assets.posttraining.publish).
_METRICS_HELP = ("the run's metrics, paged: per training stage its loss, held-out eval, goodput and "
                 "predicted and measured step time (step_time_ratio); per "
                 "post-training stage (sft, dpo, rlvr) its loss or reward curve, KL to reference, held-out "
                 "reward, gate and RLVR's staleness histogram")


def _json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def _page_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--after", type=int, default=0, help="only entries after this sequence number")
    parser.add_argument("--limit", type=int, default=None,
                        help="at most this many entries (1-500, default 100); with --all, per request (default 500)")
    parser.add_argument("--all", action="store_true",
                        help="every entry: follows the cursor page by page to the end, one document in all")


def register(verbs: argparse._SubParsersAction) -> None:
    status = verbs.add_parser("status", help="a run's state, by run id or by idempotency key")
    status.add_argument("run_id", nargs="?", help="run id (run_...)")
    status.add_argument("--idempotency-key", help="find the run created under this key")
    status.add_argument("--watch", action="store_true", help="poll with backoff until the run ends")
    status.add_argument("--interval", type=float, default=1.0, help="first poll interval in seconds")
    status.add_argument("--max-wait", type=float, default=3600.0, help="stop watching after this many seconds")
    _json_flag(status)
    status.set_defaults(handler=_status)
    for name, help_text in (("logs", "the run's event log, redacted, paged; each line at its own time (ISO 8601 UTC)"), ("metrics", _METRICS_HELP),
                            ("checkpoints", "the run's checkpoint list (empty until checkpoints exist)")):
        parser = verbs.add_parser(name, help=help_text)
        parser.add_argument("run_id", help="run id (run_...)")
        _page_flags(parser)
        _json_flag(parser)
        parser.set_defaults(handler=_telemetry(name))
    cancel = verbs.add_parser("cancel", help="cancel a run (its own confirmation and idempotency key)")
    cancel.add_argument("run_id", help="run id (run_...)")
    _mutation_flags(cancel)
    cancel.set_defaults(handler=_cancel)
    cleanup = verbs.add_parser("cleanup", help="remove this account's finished-run artifacts (a booking only "
                                               "with --release-booking and its own confirmation)")
    _mutation_flags(cleanup)
    cleanup.add_argument("--release-booking", help="also release this booking (needs --release-confirmation-ref)")
    cleanup.add_argument("--release-confirmation-ref", help="cfr_ reference of an approved release confirmation")
    cleanup.set_defaults(handler=_cleanup)


def _mutation_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--confirmation-ref", required=True, help="opaque cfr_ reference approved by the desk")
    parser.add_argument("--idempotency-key", required=True, help="stable retry key (8-128 characters)")
    _json_flag(parser)


def _run_path(run_id: str) -> str:
    from ito_assets.control.ids import is_run_id

    if not is_run_id(run_id):
        raise ItoError(ErrorCode.USAGE_ERROR, "a run id has the form run_ followed by 26 characters")
    return f"/v1/runs/{run_id}"


def _status_text(data: dict) -> list[str]:
    from ito_assets.api.commands.spend import budget_lines

    lines = [f"run: {data.get('run_id')}", f"state: {data.get('state')}",
             f"booking: {data.get('booking_id')}", f"manifest: {data.get('manifest_sha256')}",
             f"idempotency key: {data.get('idempotency_key')}"]
    if data.get("budget"):
        lines += ["manifest budget:", *budget_lines([data["budget"]])]
    return lines


def _fetch(client, args: argparse.Namespace) -> dict:
    if args.idempotency_key:
        from ito_assets.control.fingerprint import validate_key

        found = client.lookup(validate_key(args.idempotency_key))
        if not found or "run_id" not in found:
            raise ItoError(ErrorCode.RUN_NOT_FOUND, "no run was created with this idempotency key")
        return client.get(_run_path(found["run_id"]))
    return client.get(_run_path(args.run_id))


def _watch(client, args: argparse.Namespace) -> tuple[dict, str | None]:
    """Poll until the run ends or --max-wait passes. A revoked credential stops at once (and
    starts no login); a transient failure is retried on the next poll. --max-wait bounds the
    watch; --timeout bounds each poll, cut to what --max-wait leaves (at least a moment: a
    sleep may overshoot by a little, and the last poll still deserves an answer)."""
    deadline = time.monotonic() + args.max_wait
    interval = max(0.05, args.interval)
    data: dict | None = None
    while True:
        client.deadline.restart(max(_LAST_POLL_S, min(args.timeout, deadline - time.monotonic())))
        try:
            data = _fetch(client, args)
        except ItoError as error:
            if error.code in _STOP or not error.retryable or time.monotonic() >= deadline:
                raise
        if data is not None and data.get("terminal"):
            return data, None
        if time.monotonic() + interval > deadline:
            if data is None:
                raise ItoError(ErrorCode.TIMEOUT, "the run's state could not be read before --max-wait")
            return data, "polling stopped before the run ended (--max-wait)"
        time.sleep(interval)
        interval = min(interval * _WATCH_GROWTH, _WATCH_MAX_INTERVAL_S)


def _status(args: argparse.Namespace) -> VerbResult:
    from ito_assets.api.client_config import connect

    if bool(args.run_id) == bool(args.idempotency_key):
        raise ItoError(ErrorCode.USAGE_ERROR, "give a run id or --idempotency-key (exactly one)")
    if args.run_id:
        _run_path(args.run_id)
    # argparse's float() takes "nan" and "inf": a NaN deadline is never reached (the watch would
    # poll forever) and an infinite interval overflows time.sleep
    if not all(math.isfinite(v) and v > 0 for v in (args.max_wait, args.interval)):
        raise ItoError(ErrorCode.USAGE_ERROR, "--interval and --max-wait must be positive numbers of seconds")
    client = connect(timeout_s=args.timeout)
    try:
        data, notice = _watch(client, args) if args.watch else (_fetch(client, args), None)
    except ItoError as error:
        error.live_api_contacted = getattr(error, "live_api_contacted", False) or client.contacted
        raise
    # A watch that gave up at --max-wait must not read like a plain status: the notice is printed
    # after these lines in readable output (cli._print_text), as every command's notice is.
    return VerbResult(data=data, live_api_contacted=client.contacted, notice=notice, text=_status_text(data))


def _telemetry(name: str):
    def handler(args: argparse.Namespace) -> VerbResult:
        from ito_assets.api.client_config import connect

        path = _run_path(args.run_id)
        limit = args.limit if args.limit is not None else (paging.ALL_PAGE if args.all else 100)
        if args.after < 0 or not 0 < limit <= 500:
            raise ItoError(ErrorCode.USAGE_ERROR, "--after must be >= 0 and --limit between 1 and 500")
        client = connect(timeout_s=args.timeout)
        get = lambda after: client.get(f"{path}/{name}?after={after}&limit={limit}")  # noqa: E731
        data = paging.follow(get, args.after, name) if args.all else get(args.after)
        return VerbResult(data=data, live_api_contacted=client.contacted, text=_telemetry_text(name, data))
    return handler


def _telemetry_text(name: str, data: dict) -> list[str]:
    """A header with how many entries of how many, one line per entry (times in ISO 8601 UTC),
    and, when more follow, how to read them."""
    items = data.get(name, [])
    total = data.get("num_total")
    text = [f"{name} of {data.get('run_id')} ({data.get('state')}): {paging.count_phrase(len(items), total, 'entries')}"]
    for item in items:
        text.append("  " + "  ".join(f"{k}={paging.shown_value(k, v)}" for k, v in item.items()))
    return text + paging.more_lines(len(items), total, data.get("next_after"))


def _checked_mutation(args: argparse.Namespace) -> str:
    from ito_assets.control.fingerprint import validate_key
    from ito_assets.control.ids import is_confirmation_ref

    if not is_confirmation_ref(args.confirmation_ref):
        raise ItoError(ErrorCode.CONFIRMATION_INVALID, "the confirmation reference is malformed (expected cfr_...)")
    return validate_key(args.idempotency_key)


def _cancel(args: argparse.Namespace) -> VerbResult:
    from ito_assets.api.client_config import connect

    path = _run_path(args.run_id)
    key = _checked_mutation(args)
    client = connect(timeout_s=args.timeout)
    from ito_assets.control.fingerprint import request_fingerprint

    data = client.post_idempotent(f"{path}/cancel", {"confirmation_ref": args.confirmation_ref,
                                                     "idempotency_key": key}, key=key, action="cancel",
                                  fingerprint=request_fingerprint("cancel", run_id=args.run_id))
    return VerbResult(data=data, live_api_contacted=client.contacted, text=_status_text(data))


def _cleanup(args: argparse.Namespace) -> VerbResult:
    from ito_assets.api.client_config import connect

    from ito_assets.control.ids import is_confirmation_ref

    key = _checked_mutation(args)
    body = {"confirmation_ref": args.confirmation_ref, "idempotency_key": key}
    if bool(args.release_booking) != bool(args.release_confirmation_ref):
        raise ItoError(ErrorCode.USAGE_ERROR, "--release-booking and --release-confirmation-ref go together")
    if args.release_booking:
        if not is_confirmation_ref(args.release_confirmation_ref):
            raise ItoError(ErrorCode.CONFIRMATION_INVALID, "the release confirmation reference is malformed")
        body.update(release_booking_id=args.release_booking, release_confirmation_ref=args.release_confirmation_ref)
    client = connect(timeout_s=args.timeout)
    # After a lost answer, the answer under this key must be this cleanup's (a release or none).
    from ito_assets.control.fingerprint import cleanup_fingerprint

    data = client.post_idempotent("/v1/cleanup", body, key=key, action="cleanup",
                                  fingerprint=cleanup_fingerprint(args.release_booking or None))
    text = [f"runs cleaned: {data.get('num_runs_cleaned')}, bytes removed: {data.get('num_bytes_removed')}",
            *[f"  - {r['run_id']}: {r['num_files_removed']} files, {r['num_checkpoints_removed']} checkpoints"
              for r in data.get("runs", [])],
            *[f"  kept {r['run_id']} ({r['num_files_removed']} files removed): {r['reason']}"
              for r in data.get("runs_kept", [])],
            f"bookings released: {', '.join(b['booking_id'] for b in data.get('bookings_changed', [])) or 'none'}"]
    return VerbResult(data=data, live_api_contacted=client.contacted, text=text)


