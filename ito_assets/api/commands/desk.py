"""`ito desk ...`: the booking desk's administration through the API, with a desk token.

accounts (create, list), tokens (issue to a new 0600 file, revoke by id), bookings (create,
list, complete, amend, revoke, release), `show` and `approve` for confirmations. `bootstrap`
is the one local action: on the server's machine it writes the first desk token straight from
the ledger. Issued tokens are written once to a file and never printed.
"""

from __future__ import annotations

import argparse
import errno
import os
from datetime import datetime

from ito_assets.api.commands.result import VerbResult
from ito_assets.errors import ErrorCode, ItoError


ACCOUNT_COLUMNS = ["account_id", "name", "created_at"]
BOOKING_COLUMNS = ["booking_id", "account_id", "state", "gpu_type", "num_gpus", "num_nodes", "topology", "region",
                   "network", "starts_at", "ends_at", "price_per_gpu_hour_cents", "revision"]


def _time(value: str) -> int:
    """Epoch seconds, or ISO 8601 with an explicit zone (a bare local time is ambiguous)."""
    if value.isdigit():
        return int(value)
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError("expected epoch seconds or ISO 8601 with a zone") from None
    if parsed.tzinfo is None:
        raise argparse.ArgumentTypeError("the time needs a zone, e.g. 2026-12-01T08:00:00Z")
    return int(parsed.timestamp())


def _add(actions, name: str, help_text: str, handler, *args: tuple) -> argparse.ArgumentParser:
    parser = actions.add_parser(name, help=help_text)
    for flags, options in args:
        parser.add_argument(*flags, **options)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.set_defaults(handler=handler)
    return parser


def register(verbs: argparse._SubParsersAction) -> None:
    desk = verbs.add_parser("desk", help="the booking desk: accounts, tokens, bookings, approvals")
    groups = desk.add_subparsers(dest="desk_group", required=True, parser_class=type(desk))
    _add(groups, "bootstrap", "write the first desk token from the local ledger (server machine only)", _bootstrap,
         (("--token-out",), {"required": True, "help": "absolute path of the new 0600 token file"}))
    _add(groups, "show", "show what a confirmation binds", _show, (("ref",), {"help": "cfr_ reference"}))
    _add(groups, "approve", "approve a confirmation after reading its binding", _approve,
         (("ref",), {"help": "cfr_ reference"}),
         (("--cost-cents",), {"type": int, "required": True, "help": "the cost you read, in cents"}),
         (("--manifest-digest",), {"help": "the manifest digest you read (sha256:...)"}))
    spikes = groups.add_parser("proposals", help="restarts proposed after loss spikes").add_subparsers(
        dest="p", required=True, parser_class=type(desk))
    _add(spikes, "list", "list a run's proposals", _list_proposals, (("run_id",), {"help": "run id (run_...)"}))
    for decision in ("approve", "reject"):
        _add(spikes, decision, f"{decision} a pending proposal (decided once, for good)", _decide_proposal(decision),
             (("run_id",), {"help": "run id (run_...)"}), (("proposal_id",), {"help": "spk_ id"}))
    accounts = groups.add_parser("accounts", help="tenant accounts").add_subparsers(dest="a", required=True,
                                                                                    parser_class=type(desk))
    _add(accounts, "create", "create an account", _post("/v1/desk/accounts", name="name"),
         (("--name",), {"required": True}))
    _add(accounts, "list", "list accounts (a table; --json for the document)",
         _listing("/v1/desk/accounts", "accounts", ACCOUNT_COLUMNS))
    _add(accounts, "budgets", "an account's budget per manifest: cap, spent, reserved, left", _budgets,
         (("account_id",), {"help": "account id (acc_...)"}),
         (("--manifest",), {"help": "only this manifest digest (sha256:...)"}))
    tokens = groups.add_parser("tokens", help="identity tokens").add_subparsers(dest="t", required=True,
                                                                                parser_class=type(desk))
    _add(tokens, "issue", "issue a token into a new 0600 file", _issue,
         (("--role",), {"choices": ["account", "desk"], "default": "account"}),
         (("--account",), {"help": "account id (account tokens)"}),
         (("--label",), {"default": ""}),
         (("--out",), {"required": True, "help": "absolute path of the new 0600 token file"}))
    _add(tokens, "revoke", "revoke a token by id", _post("/v1/desk/tokens/revoke", token_id="token_id"),
         (("token_id",), {"help": "tok_ id"}))
    bookings = groups.add_parser("bookings", help="booked GPU blocks").add_subparsers(dest="b", required=True,
                                                                                      parser_class=type(desk))
    terms = ((("--gpu-type",), {"dest": "gpu_type"}), (("--gpus",), {"dest": "num_gpus", "type": int}),
             (("--nodes",), {"dest": "num_nodes", "type": int}), (("--topology",), {}), (("--region",), {}),
             (("--network",), {}), (("--start",), {"dest": "starts_at", "type": _time}),
             (("--end",), {"dest": "ends_at", "type": _time}),
             (("--price-cents",), {"dest": "price_per_gpu_hour_cents", "type": int,
                                   "help": "price per GPU-hour in US cents"}))
    _add(bookings, "create", "create a pending booking", _create_booking,
         (("--account",), {"required": True}), *terms)
    _add(bookings, "list", "list bookings (a table; --json for the document)", _list_bookings,
         (("--account",), {"help": "only this account's bookings (acc_...)"}))
    for verb in ("complete", "revoke", "release"):
        _add(bookings, verb, f"{verb} a booking", _transition(verb), (("booking_id",), {}))
    amendable = tuple(t for t in terms if t[1].get("dest", t[0][0][2:]) not in ("gpu_type", "num_gpus", "num_nodes"))
    _add(bookings, "amend", "amend region, network, topology, window or price", _amend,
         (("booking_id",), {}), *amendable)


def _client(args: argparse.Namespace):
    from ito_assets.api.client_config import connect

    return connect(timeout_s=args.timeout)


def _done(client, data: dict, text: list[str] | None = None) -> VerbResult:
    return VerbResult(data=data, live_api_contacted=client.contacted, text=text or [])


def _post(path: str, **fields: str):
    def handler(args: argparse.Namespace) -> VerbResult:
        client = _client(args)
        return _done(client, client.post(path, {name: getattr(args, attr) for name, attr in fields.items()}))
    return handler


def listing_text(data: dict, key: str, columns: list[str]) -> list[str]:
    """`accounts: 3` and an aligned table of them, times in ISO 8601 UTC."""
    from ito_assets.api.commands.paging import shown_value
    from ito_assets.api.terminal import table

    rows = [{c: shown_value(c, item.get(c)) for c in columns} for item in data.get(key, [])]
    return [f"{key}: {len(rows)}", *table(rows, columns)]


def _listing(path: str, key: str, columns: list[str]):
    def handler(args: argparse.Namespace) -> VerbResult:
        client = _client(args)
        data = client.get(path)
        return _done(client, data, listing_text(data, key, columns))
    return handler


def _budgets(args: argparse.Namespace) -> VerbResult:
    from urllib.parse import quote

    from ito_assets.api.commands.spend import budget_lines, query

    client = _client(args)
    data = client.get(f"/v1/desk/accounts/{quote(args.account_id, safe='')}/budgets" + query(manifest_digest=args.manifest))
    return _done(client, data, [f"budgets of {data.get('account_id')}: {data.get('num_budgets')}",
                                *budget_lines(data.get("budgets", []))])


def _reserve_token_file(path: str, flag: str) -> int:
    """Create the token file empty (0600, exclusively, never through a link) before any token is
    issued: a path that cannot take the token refuses the command with no token made."""
    if not os.path.isabs(path):
        raise ItoError(ErrorCode.USAGE_ERROR, f"{flag} must be an absolute path")
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        raise ItoError(ErrorCode.USAGE_ERROR, f"{flag} already exists; choose a new path") from None
    except OSError as exc:
        raise ItoError(ErrorCode.USAGE_ERROR, f"{flag} cannot be created ({_reason(exc)})") from None


def _reason(exc: Exception) -> str:
    return errno.errorcode.get(getattr(exc, "errno", None) or 0, type(exc).__name__)


def _drop_token_file(path: str, fd: int) -> None:
    """Remove the reserved file, only while the path still names the file this command created."""
    try:
        if os.path.samestat(os.fstat(fd), os.lstat(path)):
            os.unlink(path)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_token(fd: int, secret: str) -> None:
    os.fchmod(fd, 0o600)  # the umask cannot widen it, but make the mode explicit
    line = (secret + "\n").encode("ascii")
    if os.write(fd, line) != len(line):
        raise OSError(errno.ENOSPC, "short write")
    os.fsync(fd)


def _issue(args: argparse.Namespace) -> VerbResult:
    if (args.role == "account") != bool(args.account):
        raise ItoError(ErrorCode.USAGE_ERROR, "account tokens need --account; desk tokens take none")
    client = _client(args)
    fd = _reserve_token_file(args.out, "--out")
    try:
        data = client.post("/v1/desk/tokens", {"role": args.role, "account_id": args.account, "label": args.label})
    except BaseException:
        _drop_token_file(args.out, fd)
        raise
    try:
        _write_token(fd, data.pop("token"))
    except Exception as exc:  # a full disk, or anything else: nobody holds the token
        _drop_token_file(args.out, fd)
        raise _unwritten(client, data["token_id"], exc) from None
    os.close(fd)
    data["written_to_file"] = True
    return _done(client, data, [f"token {data['token_id']} ({args.role}) written to the 0600 file given by --out"])


def _unwritten(client, token_id: str, exc: Exception) -> ItoError:
    """A token issued but not written is revoked: nobody holds it. The id (never the token) is
    reported so that the desk can revoke it by hand if the revocation failed too."""
    try:
        client.post("/v1/desk/tokens/revoke", {"token_id": token_id})
    except ItoError:
        return ItoError(ErrorCode.USAGE_ERROR, f"the token could not be written to --out ({_reason(exc)}) and "
                                               f"could not be revoked; revoke it: ito desk tokens revoke {token_id}")
    return ItoError(ErrorCode.USAGE_ERROR,
                    f"the token could not be written to --out ({_reason(exc)}); token {token_id} was revoked")


def _unwritten_here(ledger, token_id: str, exc: Exception, revoke_token) -> ItoError:
    """`_unwritten` for bootstrap, which holds the ledger itself (on a full disk its revocation
    may fail too: the id is then named for the desk to revoke)."""
    try:
        revoke_token(ledger, token_id, actor="bootstrap")
    except Exception:
        return ItoError(ErrorCode.USAGE_ERROR, f"the token could not be written to --token-out ({_reason(exc)}) and "
                                               f"could not be revoked; revoke it: ito desk tokens revoke {token_id}")
    return ItoError(ErrorCode.USAGE_ERROR,
                    f"the token could not be written to --token-out ({_reason(exc)}); token {token_id} was revoked")


def _create_booking(args: argparse.Namespace) -> VerbResult:
    names = ("gpu_type", "num_gpus", "num_nodes", "topology", "region", "network", "starts_at", "ends_at",
             "price_per_gpu_hour_cents")
    missing = [n for n in names if getattr(args, n) is None]
    if missing:
        raise ItoError(ErrorCode.USAGE_ERROR, f"bookings create needs: {', '.join(missing)}")
    client = _client(args)
    return _done(client, client.post("/v1/desk/bookings", {"account_id": args.account,
                                                           **{n: getattr(args, n) for n in names}}))


def _list_bookings(args: argparse.Namespace) -> VerbResult:
    from urllib.parse import quote

    client = _client(args)
    suffix = f"?account_id={quote(args.account, safe='')}" if args.account else ""
    data = client.get("/v1/desk/bookings" + suffix)
    return _done(client, data, listing_text(data, "bookings", BOOKING_COLUMNS))


def _booking_path(booking_id: str, verb: str) -> str:
    from ito_assets.control.ids import ALPHABET

    if not (booking_id.startswith("bkg_") and len(booking_id) == 30 and set(booking_id[4:]) <= set(ALPHABET)):
        raise ItoError(ErrorCode.USAGE_ERROR, "a booking id has the form bkg_ followed by 26 characters")
    return f"/v1/desk/bookings/{booking_id}/{verb}"


def _transition(verb: str):
    def handler(args: argparse.Namespace) -> VerbResult:
        client = _client(args)
        return _done(client, client.post(_booking_path(args.booking_id, verb), {}))
    return handler


def _amend(args: argparse.Namespace) -> VerbResult:
    from ito_assets.control.bookings import AMENDABLE

    changes = {n: getattr(args, n) for n in AMENDABLE if getattr(args, n, None) is not None}
    if not changes:
        raise ItoError(ErrorCode.USAGE_ERROR, "an amendment changes at least one term")
    client = _client(args)
    return _done(client, client.post(_booking_path(args.booking_id, "amend"), changes))


def _show(args: argparse.Namespace) -> VerbResult:
    client = _client(args)
    data = client.post("/v1/desk/confirmations/show", {"confirmation_ref": args.ref})
    from ito_assets.api.commands.paging import readable_line

    text = [readable_line(k, v) for k, v in data.items() if k != "eligibility"]
    return _done(client, data, text)


def _approve(args: argparse.Namespace) -> VerbResult:
    client = _client(args)
    body = {"confirmation_ref": args.ref, "cost_cents": args.cost_cents, "manifest_digest": args.manifest_digest}
    return _done(client, client.post("/v1/desk/confirmations/approve", body))


def _proposals_path(run_id: str, proposal_id: str | None = None) -> str:
    import re

    from ito_assets.control.ids import is_run_id

    if not is_run_id(run_id):
        raise ItoError(ErrorCode.USAGE_ERROR, "a run id has the form run_ followed by 26 characters")
    if proposal_id is not None and not re.fullmatch(r"spk_[0-9a-f]{16}", proposal_id):
        raise ItoError(ErrorCode.USAGE_ERROR, "a proposal id has the form spk_ followed by 16 hex digits")
    return f"/v1/desk/runs/{run_id}/proposals" + (f"/{proposal_id}" if proposal_id else "")


def _list_proposals(args: argparse.Namespace) -> VerbResult:
    path = _proposals_path(args.run_id)
    client = _client(args)
    data = client.get(path)
    text = [f"{p['proposal_id']} [{p['stage']}] {p['state']}: {p['metric']} spike at step {p['spike_step']}; "
            f"restart from step {p['restart_from_step']}, skip batches [{p['skip_first']}, {p['skip_end']})"
            for p in data.get("proposals", [])]
    return _done(client, data, text or ["no proposals"])


def _decide_proposal(decision: str):
    def handler(args: argparse.Namespace) -> VerbResult:
        path = _proposals_path(args.run_id, args.proposal_id)
        client = _client(args)
        return _done(client, client.post(path, {"decision": decision}))
    return handler


def _bootstrap(args: argparse.Namespace) -> VerbResult:
    """Local: whoever can open the ledger administers it; the token goes to a new 0600 file."""
    from ito_assets.settings import load_settings

    settings = load_settings()
    fd = _reserve_token_file(args.token_out, "--token-out")
    try:
        issued = _bootstrap_token(settings, fd)
    except BaseException:
        _drop_token_file(args.token_out, fd)
        raise
    os.close(fd)
    return VerbResult(data={"token_id": issued.token_id, "role": "desk", "written_to_file": True},
                   live_api_contacted=False, text=[f"desk token {issued.token_id} written to --token-out"])


def _bootstrap_token(settings, fd: int):
    """Issue the desk token into the reserved file; one that cannot be written is revoked at once."""
    from ito_assets.api.server import ledger_variable, opened_ledger
    from ito_assets.control.identity import issue_token, revoke_token
    from ito_assets.control.states import Role

    # As `ito serve` opens it: a ledger that cannot be opened is a USAGE_ERROR naming its variable.
    ledger = opened_ledger(settings.ledger_url, schema=settings.ledger_schema, variable=ledger_variable(settings))
    try:
        issued = issue_token(ledger, Role.DESK, account_id=None, label="bootstrap", actor="bootstrap")
        try:
            _write_token(fd, issued.secret)
        except Exception as exc:
            raise _unwritten_here(ledger, issued.token_id, exc, revoke_token) from None
    finally:
        ledger.dispose()
    return issued
