"""`ito`: the canonical client. Every verb prints one JSON envelope with --json (DESIGN.md).

Imports stay light: verbs import their heavy dependencies lazily, so client verbs start fast.
Exit status: 0 when ok, 1 on a reported error, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ito_assets.api import envelope
from ito_assets.errors import ErrorCode, ItoError


@dataclass
class Outcome:
    """What a verb returns: the envelope's data, and whether any byte reached the API."""

    data: dict[str, Any]
    live_api_contacted: bool = False
    notice: str | None = None
    text: list[str] = field(default_factory=list)  # readable lines for the non-JSON mode


Handler = Callable[[argparse.Namespace], Outcome]


class _Parser(argparse.ArgumentParser):
    # argparse's own messages quote the offending values, which may be secrets: never show them.
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ItoError(ErrorCode.USAGE_ERROR, f"invalid arguments for '{self.prog}'; see '{self.prog} --help'")


def build_parser() -> argparse.ArgumentParser:
    from ito_assets.api.commands import audit, confirm, desk, lifecycle, manifest, plan, readiness, serve, train

    parser = _Parser(prog="ito", description="The canonical ito-training client.")
    verbs = parser.add_subparsers(dest="verb", parser_class=_Parser, required=True)
    manifest.register(verbs)
    audit.register(verbs)  # issue 4: lineage in the warehouse, read-only, no API contact
    plan.register(verbs)  # issue 5: the plan and its cost, computed locally; creates no workload
    # Issue 3: the gates and the run lifecycle. Each module imports its heavy dependencies lazily.
    for module in (confirm, train, lifecycle, readiness, desk, serve):
        module.register(verbs)
    return parser


def _print_text(outcome: Outcome) -> None:
    for line in outcome.text or [f"{k}: {v}" for k, v in outcome.data.items()]:
        print(line)


def run(argv: Sequence[str]) -> tuple[dict, int]:
    """Parse and dispatch; returns the envelope and the exit status (also used by tests)."""
    try:
        args = build_parser().parse_args(list(argv))
        outcome: Outcome = args.handler(args)
    except ItoError as error:
        contacted = bool(getattr(error, "live_api_contacted", False))
        return envelope.failure(error, live_api_contacted=contacted), 2 if error.code is ErrorCode.USAGE_ERROR else 1
    except SystemExit as exit_:  # --help
        raise exit_
    except Exception:  # noqa: BLE001 - the caller gets a safe code, never a traceback with values
        error = ItoError(ErrorCode.INTERNAL_ERROR, "an internal error occurred")
        return envelope.failure(error, live_api_contacted=False), 1
    document = envelope.success(outcome.data, live_api_contacted=outcome.live_api_contacted, notice=outcome.notice)
    document["_text"] = outcome.text
    return document, 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    as_json = "--json" in argv
    document, status = run(argv)
    text = document.pop("_text", None)
    if as_json:
        print(envelope.dumps(document))
    elif document["ok"]:
        _print_text(Outcome(data=document["data"], text=text or []))
    else:
        err = document["error"]
        print(f"error {err['code']}: {err['message']}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
