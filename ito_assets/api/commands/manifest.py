"""`ito manifest verify PATH [--expect-digest sha256:HEX] [--json]`: local, no API contact."""

from __future__ import annotations

import argparse

from ito_assets.api.commands.result import VerbResult


def register(verbs: argparse._SubParsersAction) -> None:
    group = verbs.add_parser("manifest", help="inspect a reviewed manifest on this machine")
    actions = group.add_subparsers(dest="action", required=True, parser_class=type(group))
    verify = actions.add_parser("verify", help="securely read, scan and validate a manifest (training or data)")
    verify.add_argument("path", help="absolute, canonical path of the reviewed JSON file")
    verify.add_argument("--expect-digest", help="sha256:HEX the manifest must hash to")
    verify.add_argument("--json", action="store_true", help="print one JSON document")
    verify.set_defaults(handler=_verify)


def _verify(args: argparse.Namespace) -> VerbResult:
    from ito_assets.manifest import verify
    from ito_assets.settings import load_settings

    settings = load_settings()
    verified = verify.verify_data_manifest(args.path, max_bytes=settings.max_manifest_bytes)
    if args.expect_digest is not None:
        verify.check_expected_digest(verified.digest, args.expect_digest)
    verify.require_provenance(verified.manifest)
    summary = verify.summarize(verified)
    data = {"digest": verified.digest, "size_bytes": verified.raw.size, "summary": summary}
    text = [f"{summary['kind']} manifest ok: {summary['name']}", f"digest: {verified.digest}", f"size: {verified.raw.size} bytes"]
    if verified.is_training:
        model = summary["model"]
        text.append(f"model: {model['size']} ({verify.parameters_phrase(model)}), revision {model['revision']}")
    text += [f"data references: {summary['num_data_references']}",
             *[f"  - {r['uri']} [{r['license']}, {r['format']}]" for r in summary["data_references"]]]
    if verified.is_training:
        budget = summary["budget"]
        text.append(f"budget: cap {budget['cap_cents'] / 100:,.2f} USD, max incremental {budget['max_incremental_cents'] / 100:,.2f} USD")
    return VerbResult(data=data, live_api_contacted=False, text=text)
