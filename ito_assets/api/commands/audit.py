"""`ito audit doc ID`, `ito audit eval-item ID`, `ito audit manifest DIGEST` [--json]: local reads
of the DuckDB warehouse (read-only), no API contact. They answer "why is document X not in the
training data" (X the internal id or the user's own record id) and "which documents matched eval
item Y" (every document, duplicates included) with one command each."""

from __future__ import annotations

import argparse
import os
import re
from datetime import datetime
from pathlib import Path

from ito_assets.api.commands.result import VerbResult
from ito_assets.api.terminal import table
from ito_assets.errors import ErrorCode, ItoError

_DIGEST = re.compile(r"^(sha256:)?[0-9a-fA-F]{6,64}$")


def _is_text(value: str) -> bool:
    """Whether an argument is text: bytes that are not UTF-8 reach Python as lone surrogates
    (surrogateescape), which no id in the warehouse (UTF-8, as DuckDB and Arrow keep text) holds."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _doc_id_problem(doc_id: str) -> str | None:
    """The ids the pipeline gives a document: its internal id (16 hex digits) or the record's own,
    whatever text the source holds (`sources.record_id`: any string, or an integer's decimal form;
    spaces, tabs, any script and any length included)."""
    return None if _is_text(doc_id) else "a document id is its internal id or your record id, as UTF-8 text; this argument is not UTF-8"


def _item_id_problem(item_id: str) -> str | None:
    """The ids an eval suite can hold (`EvalItem.id`): 1-256 characters of any kind."""
    from ito_assets.evals.suite import MAX_ITEM_ID_CHARS

    if not 1 <= len(item_id) <= MAX_ITEM_ID_CHARS or not _is_text(item_id):
        return f"an eval item id is 1-{MAX_ITEM_ID_CHARS} characters of UTF-8 text, as an eval suite holds them"
    return None


# An argument holds no NUL and, on Linux, at most 131,071 bytes (MAX_ARG_STRLEN less its NUL);
# a record id can be longer or hold one.
_ID_FILE_HELP = "read the id from this file instead, its bytes exactly (UTF-8): for an id no argument can hold"


def _wanted(args: argparse.Namespace, given: str | None) -> str:
    """The id to audit: the argument, or the exact text of --id-file (one of the two)."""
    if (given is None) == (args.id_file is None):
        raise ItoError(ErrorCode.USAGE_ERROR, "give the id as an argument or in --id-file PATH, one of the two")
    if given is not None:
        return given
    try:
        data = Path(args.id_file).read_bytes()
    except OSError:
        raise ItoError(ErrorCode.USAGE_ERROR, "--id-file cannot be read") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ItoError(ErrorCode.USAGE_ERROR, "--id-file is not UTF-8 text") from None


def register(verbs: argparse._SubParsersAction) -> None:
    group = verbs.add_parser("audit", help="trace documents and eval items through data preparation")
    actions = group.add_subparsers(dest="action", required=True, parser_class=type(group))
    for name, arg, helptext, handler in (
        ("doc", "doc_id", "a document: its id (16 hex digits) or your record id (the id field of your input)", _doc),
        ("eval-item", "item_id", "an eval item id, e.g. py-trivia/007 (AUDIT_NOT_FOUND, exit 1, when no suite the "
                                 "warehouse was decontaminated against holds it)", _eval_item),
        ("manifest", "digest", "a manifest digest: sha256:HEX, HEX, or its 12-digit key", _manifest),
    ):
        parser = actions.add_parser(name, help=f"audit {helptext}")
        if name == "manifest":
            parser.add_argument(arg, help=helptext)
        else:
            parser.add_argument(arg, nargs="?", help=helptext)
            parser.add_argument("--id-file", metavar="PATH", help=_ID_FILE_HELP)
        parser.add_argument("--json", action="store_true", help="print one JSON document")
        parser.set_defaults(handler=handler)


def _open():
    """The warehouse, read-only: an audit never writes, so a warehouse that is missing or corrupt
    is not rebuilt here (a rebuild sets aside the journal records whose files do not verify at
    that moment; the data step that rebuilds it says which). `warehouse.connect` and the lineage
    queries refuse a corrupt one over a read-only connection."""
    from ito_assets.data import lineage, warehouse
    from ito_assets.settings import load_settings

    path = load_settings().warehouse_path
    if not path.is_file():
        raise _missing(path, warehouse.has_journal(path))
    if not os.access(path, os.R_OK):  # DuckDB says IOException, as for a file a writer holds: never busy
        raise ItoError(ErrorCode.PERMISSION_DENIED, f"this user cannot read the warehouse {path.name}")
    import duckdb

    try:
        return lineage, warehouse.connect(path, read_only=True)
    except duckdb.Error as error:
        if not path.is_file():  # deleted between the look and the open
            raise _missing(path, warehouse.has_journal(path)) from None
        # DuckDB lets no reader in while a writing step holds the file (WAREHOUSE_BUSY: try again
        # when it is done); anything else is not a wait.
        raise warehouse.refused(error, path) from None


def _missing(path: Path, journalled: bool) -> ItoError:
    if not journalled:
        return ItoError(ErrorCode.WAREHOUSE_NOT_FOUND, "no warehouse yet: materialize the data stage first (make run)")
    return ItoError(ErrorCode.WAREHOUSE_NOT_FOUND,
                    f"the warehouse {path.name} is missing and `ito audit` only reads; its lineage journal "
                    f"({path.with_suffix('.lineage').name}/) is there to rebuild it from: the next data step does "
                    "(materialize source_documents for any manifest partition, or make run), then audit again")


def _plain(value):
    """JSON-safe values: the warehouse's timestamps (UTC, without a zone) as ISO 8601 UTC text to
    the second, as every other verb prints its times."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%dT%H:%M:%SZ")
    return value


def _why(entry: dict) -> str:
    state = entry.get("state")
    if state == "kept":
        return "kept: in the clean shards"
    if state == "duplicate":
        why = f"removed as {entry['method']} duplicate of {entry['duplicate_of']} (your id {_your_id(entry.get('duplicate_of_record_id'))}; cluster {entry['cluster_id']}, Jaccard {entry['similarity']:.3f})"
        if entry.get("exact_copy_of"):  # the removal was judged on the copy it repeats, the same text
            why += f"; its text is an exact copy of {entry['exact_copy_of']}, whose removal it shares"
        if entry.get("eval_item_ids"):
            why += f"; it also matched {', '.join(entry['eval_item_ids'])} (decontamination would {entry['action']} it)"
        return why
    if state == "contaminated":
        return f"contaminated by {', '.join(entry['eval_item_ids'] or [])}: action {entry['action']} ({entry['num_pieces']} pieces kept)"
    return "no decision recorded yet (the clean_shards asset has not run for this manifest)"


def _your_id(record_id: str | None) -> str:
    """The user's id as the text shows it: `(none)` where the record had none, so that it never
    reads as an id "None"."""
    return "(none)" if record_id is None else record_id


def _doc(args: argparse.Namespace) -> VerbResult:
    doc_id = _wanted(args, args.doc_id)
    if problem := _doc_id_problem(doc_id):
        raise ItoError(ErrorCode.USAGE_ERROR, problem)
    lineage, con = _open()
    with con:
        found = _plain(lineage.audit_document(con, doc_id))
        skipped = lineage.empty_records_skipped(con) if not found else {}
    if not found:
        raise ItoError(ErrorCode.AUDIT_NOT_FOUND, "no document with this id or record id is in the warehouse" + _skipped_hint(skipped))
    text = []
    for entry in found:
        text += [
            f"document {entry['doc_id']} (your id {_your_id(entry['source_record_id'])}) in manifest {entry['manifest_digest']}",
            f"  from: {entry['source_uri']} row {entry['row']} (id {_your_id(entry['source_record_id'])}, licence {entry['license']}, source sha256 {entry['source_sha256']})",
            f"  what happened: {_why(entry)}",
            *([f"  warning: {entry['stale_reason']}"] if entry.get("stale") else []),
            f"  family {entry.get('family_id')}: documents linked to it by verified near-duplicate pairs:",
            *table(entry["family"], ["doc_id", "source_record_id", "state", "method", "duplicate_of"]),
            "  contamination hits:",
            *table(entry["contamination_hits"], ["eval_item_id", "benchmark", "view", "char_start", "char_end", "overlap_ratio", "matched_ngram"]),
            "  clean shards:",
            *table(entry["clean_pieces"], ["piece", "char_start", "char_end", "shard_sha256", "shard_path"]),
            "  consumed by runs:",
            *table(entry["consumed_by"], ["run_id", "stage", "consumed_at"]),
        ]
    data = {"doc_id": doc_id, "manifests": found, "stale": any(entry.get("stale") for entry in found)}
    return VerbResult(data=data, live_api_contacted=False, text=text)


def _key(manifest_digest: str) -> str:
    """A manifest as its partition is named: the digest's first 12 hex digits."""
    return manifest_digest.removeprefix("sha256:")[:12]


def _skipped_hint(skipped: dict[str, int]) -> str:
    """Records with an empty or whitespace-only text are not documents and their ids are not kept:
    when a manifest skipped some, the id may be one of them."""
    if not skipped:
        return ""
    keys = {_key(digest): n for digest, n in skipped.items()}
    where = ", ".join(f"{n:,} by manifest {key}" for key, n in keys.items())
    return (f"; it may be a record skipped for an empty or whitespace-only text ({where}), which is no document "
            f"and whose id is not kept: `ito audit manifest {next(iter(keys))}` counts them per source")


def _eval_item(args: argparse.Namespace) -> VerbResult:
    item_id = _wanted(args, args.item_id)
    if problem := _item_id_problem(item_id):
        raise ItoError(ErrorCode.USAGE_ERROR, problem)
    lineage, con = _open()
    with con:
        hits = _plain(lineage.audit_eval_item(con, item_id))
        paraphrases = _plain(lineage.paraphrase_candidates(con, item_id))
        known = bool(hits or paraphrases) or lineage.eval_item_known(con, item_id)
        unchecked = lineage.manifests_not_looking_for(con, item_id)
    if not (known or _in_configured_suite(item_id)):
        raise ItoError(ErrorCode.AUDIT_NOT_FOUND, "no eval item with this id is in the eval suites the warehouse "
                       "was decontaminated against, nor in the configured eval suite (ITO_EVAL_SUITE)")
    stale = sorted({h["manifest_digest"] for h in hits if h.get("stale")})
    text = [
        f"eval item {item_id}: {len({h['doc_id'] for h in hits})} matching document(s), duplicates included",
        # One row a manifest the document is in: the manifest's key tells them apart.
        *table([{"manifest": _key(h.get("manifest_digest", "")), **h} for h in hits],
               ["manifest", "doc_id", "source_record_id", "source_uri", "row", "state", "view", "overlap_ratio",
                "action", "char_start", "char_end", "stale", "matched_ngram"]),
        *(_stale_line(digest) for digest in stale),
        *(_not_looked_for_line(entry) for entry in unchecked),
    ]
    if paraphrases:
        text += ["possible paraphrases (by embedding similarity; for review, not removed):",
                 *table([{"manifest": _key(p.get("manifest_digest", "")), **p} for p in paraphrases],
                        ["manifest", "doc_id", "source_record_id", "similarity", "char_start", "char_end", "excerpt"])]
    data = {"eval_item_id": item_id, "num_documents": len({h["doc_id"] for h in hits}), "hits": hits,
            "paraphrase_candidates": paraphrases, "stale": bool(stale),
            "not_looked_for_in": [e["manifest_digest"] for e in unchecked if e["reason"] == "too_short"],
            # Its suite lacks the item, or no suite's items are recorded for it: the text says which.
            "not_in_suite_of": [e["manifest_digest"] for e in unchecked if e["reason"] != "too_short"]}
    return VerbResult(data=data, live_api_contacted=False, text=text)


def _not_looked_for_line(entry: dict) -> str:
    """A manifest where "0 matching documents" says nothing: its decontamination never looked."""
    key = _key(entry["manifest_digest"])
    if entry["reason"] == "too_short":
        return (f"warning: in manifest {key}, this item was not looked for: no view of it (question with answer, "
                "question, long answer) has enough words to index, so no document could match it; lengthen it to protect it")
    if entry["reason"] == "not_in_suite":
        return (f"warning: in manifest {key}, this item was not looked for: it is not in the eval suite the manifest was "
                f"decontaminated against ({entry['eval_suite_id']}); to protect it, decontaminate against a suite that "
                f"holds it (materialize contamination_report and clean_shards again for partition {key})")
    return (f"warning: in manifest {key}, this item was not looked for as far as the warehouse knows: no eval suite's "
            "items are recorded for it (never decontaminated, or written before the items were kept); materialize "
            f"contamination_report again for partition {key}")


def _stale_line(manifest_digest: str) -> str:
    """Rows marked stale: the decision and the hits on record disagree (a decontamination ran again
    after the clean shards were written); the decision is what the clean shards follow."""
    key = _key(manifest_digest)
    return (f"warning: in manifest {key}, the rows marked stale disagree with the decisions the clean shards follow "
            f"(another decontamination replaced the hits): materialize clean_shards again for partition {key}")


def _manifest_stale_line(manifest_digest: str, stale: dict[str, int]) -> str:
    """The manifest's decisions (what the clean shards follow) disagree with the rows on record
    for some documents: the counts above mix the two runs."""
    key = _key(manifest_digest)
    steps = ", ".join(f"{n:,} by its {step}" for step, n in stale.items() if n)
    return (f"warning: the decisions the clean shards follow disagree with the rows on record for documents ({steps}: "
            f"a step ran again since), so the counts above mix two runs: materialize clean_shards again for partition {key}")


def _in_configured_suite(item_id: str) -> bool:
    """A warehouse written before it listed each suite's items knows only the matched ones: the
    configured suite (the one `make run` decontaminates against) still names the rest."""
    from ito_assets.evals.suite import load_suite
    from ito_assets.settings import load_settings

    try:
        suite = load_suite(load_settings().eval_suite_path)
    except ItoError:
        return False
    return any(item.id == item_id for item in suite.items)


def _manifest(args: argparse.Namespace) -> VerbResult:
    if not _DIGEST.fullmatch(args.digest):
        raise ItoError(ErrorCode.USAGE_ERROR, "a manifest digest is sha256: and hex digits, or at least 6 hex digits")
    lineage, con = _open()
    with con:
        matches = lineage.resolve_manifest(con, args.digest)
        if len(matches) != 1:
            code = ErrorCode.AUDIT_NOT_FOUND if not matches else ErrorCode.USAGE_ERROR
            raise ItoError(code, "no manifest with this digest is in the warehouse" if not matches else "the digest prefix is ambiguous")
        report = _plain(lineage.audit_manifest(con, matches[0]))
    head = report["manifest"] or {}
    records = _records(report["sources"])
    text = [
        f"manifest {matches[0]} ({head.get('name')}), eval suite {head.get('eval_suite_id')} {head.get('eval_suite_digest')}",
        "sources:", *table(report["sources"], ["source_index", "uri", "license", "num_documents", "num_empty_skipped", "sha256"]),
        _records_line(records),
        "what happened to the documents:", *table(report["states"], ["state", "detail", "num_documents"]),
        "duplicates removed (the count the deduplicated_documents asset shows): "
        + ", ".join(f"{n} {method}" for method, n in report["removed_by_method"].items()),
        "contamination by benchmark:", *table(report["contamination_by_benchmark"], ["benchmark", "num_documents", "num_eval_items"]),
        "clean shards:", *table(report["clean_shards"], ["shard_sha256", "num_rows", "shard_path"]),
        "consumed by runs:", *table(report["consumed_by"], ["run_id", "stage", "consumed_at"]),
        *([_manifest_stale_line(matches[0], report["stale_documents"])] if report["stale"] else []),
    ]
    return VerbResult(data={"manifest_digest": matches[0], **report, "records": records}, live_api_contacted=False, text=text)


def _records(sources: list[dict]) -> dict:
    """Records read = documents + records skipped for an empty text, over the sources; `read` and
    `empty_skipped` are None where the warehouse predates recording the skipped ones."""
    documents = sum(s["num_documents"] or 0 for s in sources)
    if any(s.get("num_empty_skipped") is None for s in sources):
        return {"read": None, "documents": documents, "empty_skipped": None}
    empty = sum(s["num_empty_skipped"] for s in sources)
    return {"read": documents + empty, "documents": documents, "empty_skipped": empty}


def _records_line(records: dict) -> str:
    if records["read"] is None:
        return (f"records read: {records['documents']:,} documents; the records skipped for an empty text were not "
                "recorded by the version that wrote this manifest's sources (materialize source_documents again)")
    return (f"records read: {records['read']:,} = {records['documents']:,} documents + {records['empty_skipped']:,} "
            "skipped for an empty or whitespace-only text (not documents: no decision, no `ito audit doc`)")
