"""`ito`: the canonical client. Every verb prints one JSON envelope with --json, one shape for scripts.

Imports stay light: verbs import their heavy dependencies lazily, so client verbs start fast.
Exit status: 0 when ok, 1 on a reported error, 2 on a usage error, 141 (a shell's code for
SIGPIPE) when the reader of stdout went away, as in `ito logs RUN | head -1`.
`--timeout SECONDS` (before or after the verb) bounds everything a verb does with the API.
Readable (non --json) output goes through `terminal.escape`: no control character reaches the
terminal raw.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from typing import Sequence

from ito_assets.api import envelope
from ito_assets.api.commands.result import VerbResult
from ito_assets.api.terminal import escape
from ito_assets.errors import ErrorCode, ItoError

# The whole operation, all attempts and pauses included: a hung API costs at most this long.
# It equals what four 30 s requests (ITO_TIMEOUT_S) took before one deadline bounded them.
DEFAULT_TIMEOUT_S = 120.0
# An hour: as long as ITO_TIMEOUT_S may be for one request.
MAX_TIMEOUT_S = 3600.0
TIMEOUT_HELP = f"seconds the whole operation may take, retries included (default {DEFAULT_TIMEOUT_S:g})"
# The verbs that never contact the API accept --timeout (a script may pass it to every verb) and say so.
LOCAL_TIMEOUT_HELP = "accepted and ignored: this verb works on local files and does not contact the API"
EXIT_BROKEN_PIPE = 141
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs) -> None:
        # No abbreviations: `--js` was taken for `--json` by argparse, while the output mode is read
        # from the literal `--json` before parsing (a refusal must know it), so it printed text.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    # argparse's own messages quote the offending values, which may be secrets: never show them.
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ItoError(ErrorCode.USAGE_ERROR, f"invalid arguments for '{self.prog}'; see '{self.prog} --help'")


def timeout_seconds(value: str) -> float:
    """--timeout's value: a number of seconds in (0, MAX_TIMEOUT_S]; NaN and infinity are refused."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= MAX_TIMEOUT_S:
        raise ItoError(ErrorCode.USAGE_ERROR,
                       f"--timeout must be a number of seconds above 0 and at most {MAX_TIMEOUT_S:g}")
    return seconds


def _subparsers(parser: argparse.ArgumentParser):
    for action in parser._actions:  # noqa: SLF001 - argparse lists subcommands nowhere public
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for sub in dict.fromkeys(action.choices.values()):
                yield sub
                yield from _subparsers(sub)


def build_parser() -> argparse.ArgumentParser:
    from ito_assets.api.commands import (audit, confirm, data, desk, lifecycle, manifest, plan, readiness, serve,
                                         spend, train)

    parser = _Parser(prog="ito", description="The canonical ito-training client.")
    parser.add_argument("--timeout", type=timeout_seconds, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                        help=TIMEOUT_HELP)
    verbs = parser.add_subparsers(dest="verb", parser_class=_Parser, required=True)
    manifest.register(verbs)
    audit.register(verbs)  # lineage in the warehouse, read-only, no API contact
    data.register(verbs)  # a corpus of one's own through the data stage, in process; no API contact
    local = {id(sub) for sub in verbs.choices.values()}
    plan.register(verbs)  # the plan and its cost, computed locally; creates no workload
    # The gates and the run lifecycle. Each module imports its heavy dependencies lazily, so verbs start fast.
    for module in (confirm, train, lifecycle, spend, readiness, desk, serve):
        module.register(verbs)
    # `readiness` and `train` compare these verbs with the capabilities they need.
    parser.set_defaults(**{readiness.CLIENT_VERBS: frozenset(verbs.choices)})
    # Also accepted after the verb. SUPPRESS: a subcommand that was not given --timeout must not
    # overwrite the top-level value (argparse copies a subparser's defaults over its parent's).
    for verb in dict.fromkeys(verbs.choices.values()):
        help_text = LOCAL_TIMEOUT_HELP if id(verb) in local else TIMEOUT_HELP
        for sub in (verb, *_subparsers(verb)):
            sub.add_argument("--timeout", type=timeout_seconds, default=argparse.SUPPRESS, metavar="SECONDS",
                             help=help_text)
    return parser


def _print_text(outcome: VerbResult) -> None:
    from ito_assets.api.commands.paging import readable_line

    lines = outcome.text or [readable_line(k, v) for k, v in outcome.data.items()]
    for line in [*lines, *([f"notice: {outcome.notice}"] if outcome.notice else [])]:
        print(escape(str(line)))


def run(argv: Sequence[str]) -> tuple[dict, int]:
    """Parse and dispatch; returns the envelope and the exit status (also used by tests)."""
    try:
        args = _parsed(list(argv))
        if isinstance(args, str):  # --help asked for with --json: its text, inside the one document
            return envelope.success({"help": args}, live_api_contacted=False), 0
        outcome: VerbResult = args.handler(args)
    except ItoError as error:
        contacted = bool(getattr(error, "live_api_contacted", False))
        return envelope.failure(error, live_api_contacted=contacted), 2 if error.code is ErrorCode.USAGE_ERROR else 1
    except SystemExit as exit_:  # --help
        raise exit_
    except BrokenPipeError:  # a closed stdout is no internal error: main() ends quietly
        raise
    except Exception:  # noqa: BLE001 - the caller gets a safe code, never a traceback with values
        error = ItoError(ErrorCode.INTERNAL_ERROR, "an internal error occurred")
        return envelope.failure(error, live_api_contacted=False), 1
    document = envelope.success(outcome.data, live_api_contacted=outcome.live_api_contacted, notice=outcome.notice)
    document["_text"] = outcome.text
    return document, 0


def _asks_for_json(argv: list[str]) -> bool:
    """`--json` among the options: not after `--`, where it is an argument (a document's id)."""
    options = argv[: argv.index("--")] if "--" in argv else argv
    return "--json" in options


def _parsed(argv: list[str]) -> argparse.Namespace | str:
    """The parsed arguments; with --json, the help text where --help asked for it (argparse
    prints it and exits, which left --json's one document as plain text)."""
    if not _asks_for_json(argv):
        return build_parser().parse_args(argv)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            return build_parser().parse_args(argv)
    except SystemExit as exit_:
        if exit_.code in (0, None):
            return printed.getvalue()
        raise


def _main(argv: list[str]) -> int:
    as_json = _asks_for_json(argv)
    document, status = run(argv)
    text = document.pop("_text", None)
    if as_json:
        print(envelope.dumps(document))
    elif document["ok"]:
        # The notice (offline plan, an API that did not answer, a watch stopped early) is part of
        # the answer in both modes: the envelope's field, or the readable output's last line.
        _print_text(VerbResult(data=document["data"], text=text or [], notice=document.get("notice")))
    else:
        err = document["error"]
        print(f"error {err['code']}: {escape(str(err['message']))}", file=sys.stderr)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        try:
            return _main(argv)
        finally:
            sys.stdout.flush()  # here, not at exit, so a closed pipe is seen below (--help included)
    except BrokenPipeError:
        # The reader went away. As the signal module's docs advise ("Note on SIGPIPE"): point
        # stdout at devnull so the interpreter's last flush cannot fail again, and exit non-zero.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:  # Ctrl-C: one line, not a traceback
        print("ito: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
