"""`ito data prepare --corpus PATH_OR_GLOB [--corpus ...] --eval-suite PATH [--out DIR]
[--text-field F] [--id-field F] [--name NAME] [--license SPDX] [--json]`: clean a corpus of one's own
on this machine. No training manifest, ledger, model or API: the command hashes the files, writes
and verifies a data manifest, registers its partition in the Dagster instance ($DAGSTER_HOME, by
default .ito/dagster) and materialises `data_preparation_job` for it in this process
(deduplication, decontamination against the eval suite, clean shards, every check), then prints
where every document went. Dagster is imported only once the flags and files are judged good."""

from __future__ import annotations

import argparse
import os
import re
import shutil
from pathlib import Path

from ito_assets.api.commands.result import VerbResult
from ito_assets.errors import ErrorCode, ItoError

_MANIFEST_COPY = "data-manifest.json"


def register(verbs: argparse._SubParsersAction) -> None:
    group = verbs.add_parser("data", help="prepare a corpus of your own (no training manifest)")
    actions = group.add_subparsers(dest="action", required=True, parser_class=type(group))
    prepare = actions.add_parser(
        "prepare", help="deduplicate and decontaminate a corpus against an eval suite into clean Parquet shards")
    prepare.add_argument("--corpus", action="append", required=True, metavar="PATH_OR_GLOB",
                         help="a JSONL (plain, gzip or zstd) or Parquet file, or a glob ('**' for any depth); repeatable")
    prepare.add_argument("--eval-suite", required=True, metavar="PATH",
                         help="the eval suite (JSONL of id, benchmark, question, answer) to decontaminate against")
    prepare.add_argument("--out", metavar="DIR", help="a new or empty folder to copy the clean shards, the "
                         "decisions and the data manifest into")
    prepare.add_argument("--text-field", default="text", metavar="FIELD", help="the field (or column) holding the text")
    prepare.add_argument("--id-field", metavar="FIELD", help="the field holding each record's own id; named, every "
                         "record must have one (default: 'id' where a record has it)")
    prepare.add_argument("--name", help="the data manifest's name (default: the first file's name)")
    prepare.add_argument("--license", metavar="SPDX", help="the corpus's SPDX licence id (default NOASSERTION: none stated)")
    prepare.add_argument("--json", action="store_true", help="print one JSON document")
    prepare.set_defaults(handler=_prepare)


def _check_flags(args: argparse.Namespace) -> None:
    """Every flag's form before anything is read; messages name the flag, never its value."""
    from ito_assets.manifest.schema import FIELD_NAME_PATTERN, NAME_PATTERN

    for flag, value in (("--name", args.name), ("--license", args.license)):
        if value is not None and (len(value) > 128 or not re.fullmatch(NAME_PATTERN, value)):
            raise ItoError(ErrorCode.USAGE_ERROR, f"{flag} must be 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit")
    for flag, value in (("--text-field", args.text_field), ("--id-field", args.id_field)):
        if value is not None and not re.fullmatch(FIELD_NAME_PATTERN, value):
            raise ItoError(ErrorCode.USAGE_ERROR, f"{flag} must be 1-128 printable characters without spaces")
    if args.out is not None:
        _check_out(Path(args.out).expanduser().absolute())


def _check_out(out: Path) -> None:
    """`--out` judged before the job runs, not when its copies are made: a new or empty folder,
    or one that can be made where the nearest existing folder above it is writable."""
    try:
        str(out).encode("utf-8")
    except UnicodeEncodeError:  # bytes that are not UTF-8: no JSON answer could name the folder
        raise ItoError(ErrorCode.USAGE_ERROR, "--out must be a path of UTF-8 text") from None
    try:
        os.lstat(out)
    except (FileNotFoundError, NotADirectoryError):  # a missing or a file's folder: judged below
        pass
    except OSError as error:  # too long a name or path: os.path.exists answers False, mkdir fails after the job
        raise ItoError(ErrorCode.USAGE_ERROR, f"--out cannot be used: {error.strerror}") from None
    if os.path.exists(out):  # os.path's, which answers False where pathlib's raises (EACCES)
        if not out.is_dir():
            raise ItoError(ErrorCode.USAGE_ERROR, "--out must name a new or empty folder")
        if not os.access(out, os.R_OK | os.W_OK | os.X_OK):
            raise ItoError(ErrorCode.USAGE_ERROR, "--out names a folder this user cannot write to")
        if any(out.iterdir()):
            raise ItoError(ErrorCode.USAGE_ERROR, "--out must name a new or empty folder")
        return
    above = next(p for p in out.parents if os.path.lexists(p))  # "/" exists
    if not above.is_dir():
        raise ItoError(ErrorCode.USAGE_ERROR, "--out must name a new or empty folder; a file stands in its path")
    longest = os.pathconf(above, "PC_NAME_MAX")
    if any(len(os.fsencode(part)) > longest for part in out.relative_to(above).parts):
        raise ItoError(ErrorCode.USAGE_ERROR, f"--out has a name longer than the {longest} bytes its file system takes")
    if len(os.fsencode(out)) >= os.pathconf(above, "PC_PATH_MAX"):
        raise ItoError(ErrorCode.USAGE_ERROR, "--out is a longer path than its file system takes")
    if not os.access(above, os.W_OK | os.X_OK):
        raise ItoError(ErrorCode.USAGE_ERROR, "--out cannot be made: this user cannot write to the folder above it")


def _prepare(args: argparse.Namespace) -> VerbResult:
    from ito_assets.data import corpus
    from ito_assets.digests import Digest
    from ito_assets.evals.suite import load_suite
    from ito_assets.manifest import verify
    from ito_assets.settings import load_settings

    _check_flags(args)
    settings = load_settings()
    suite_path = Path(args.eval_suite).expanduser().resolve()
    suite = load_suite(suite_path)  # EVAL_SUITE_INVALID for a file it cannot read, with the reason
    files = corpus.describe(corpus.find_files(args.corpus))
    document = corpus.data_manifest(args.name or corpus.default_name(files), files, suite,
                                    args.license or corpus.UNSTATED_LICENSE, text_field=args.text_field,
                                    id_field=args.id_field)
    stored = corpus.store_manifest(settings.data_manifests_dir, document)
    try:
        # Read back the way every manifest is read: secure read, strict JSON, secret scan, schema.
        verified = verify.verify_data_manifest(str(stored), max_bytes=settings.max_manifest_bytes)
        verify.check_expected_digest(verified.digest, Digest.of_bytes(document))
        verify.require_provenance(verified.manifest)
    except ItoError:
        stored.unlink(missing_ok=True)  # refused: never kept (it may hold the secret the scan found)
        raise

    from ito_assets.defs.data import prepare as shell  # Dagster, from here on only

    home = Path(os.environ.get("DAGSTER_HOME") or settings.dagster_home).resolve()
    with shell.open_instance(settings, home) as instance:
        prepared = shell.prepare(settings, instance, verified.digest, suite_path, suite.digest)
    copied = _copy_out(Path(args.out).expanduser().resolve(), prepared.clean, stored) if args.out else None
    return _summary(verified, suite, files, prepared, copied, stored, home, _source_counts(settings.warehouse_path, verified.digest))


def _source_counts(path: Path, manifest_digest: str) -> list[dict]:
    """Per source, as its stage recorded them in the warehouse: the documents and the records
    skipped for an empty or whitespace-only text, which are no documents and so in no other count."""
    from ito_assets.data import lineage, warehouse

    with warehouse.connect(path, read_only=True) as con:
        return lineage.source_rows(con, manifest_digest)


def _copy_out(out: Path, clean, manifest: Path) -> dict:
    """The clean shards, the decisions and the data manifest copied into `out`, each copy hashed
    against the digest recorded when it was written (SHARD_CORRUPT otherwise): what lands there
    is what the checks passed. Copies, not links: editing them cannot touch the recorded shards."""
    from ito_assets.digests import file_sha256

    (out / "clean").mkdir(parents=True, exist_ok=True)
    targets = [(Path(s.path), out / "clean" / Path(s.path).name, s.sha256) for s in clean.shards.shards]
    targets.append((Path(clean.decisions.path), out / "decisions.parquet", clean.decisions.sha256))
    for source, target, sha256 in targets:
        shutil.copyfile(source, target)
        if file_sha256(target) != sha256:
            raise ItoError(ErrorCode.SHARD_CORRUPT, f"{source.name} does not hash to the digest recorded when it was written")
    _copy_private(manifest, out / _MANIFEST_COPY)
    return {"folder": str(out), "clean_shards": [str(t) for _, t, _ in targets[:-1]],
            "decisions": str(targets[-1][1]), "manifest": str(out / _MANIFEST_COPY)}


def _copy_private(source: Path, target: Path) -> None:
    """A copy that is 0600 from its creation, as the stored manifest is (shutil.copyfile would
    create it by the umask, 0644 as a rule)."""
    descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.fchmod(descriptor, 0o600)  # exactly 0600, whatever the umask took away
    with os.fdopen(descriptor, "wb") as sink, source.open("rb") as data:
        shutil.copyfileobj(data, sink)


def _shell_word(value: str) -> str:
    """`value` as one shell word that gives it back (shlex.split, or any POSIX shell)."""
    import shlex

    return shlex.quote(value)


def _printable_word(value: str) -> str:
    """`value` as one word to print. The terminal shows a control character (a tab, a newline)
    as a visible escape, which pasted inside POSIX quotes would be those backslashes; bash's and
    zsh's $'...' quoting reads such escapes back as the characters."""
    from ito_assets.api.terminal import escape

    if escape(value) == value:
        return _shell_word(value)

    def one(char: str) -> str:
        if char in "\\'":
            return "\\" + char
        if escape(char) == char:
            return char
        return f"\\x{ord(char):02x}" if ord(char) < 0x80 else f"\\u{ord(char):04x}"  # \u: UTF-8, as the id is

    return "$'" + "".join(one(c) for c in value) + "'"


def _names_one(frame, record_id: str | None) -> bool:
    """Whether `ito audit doc RECORD_ID` finds one document of the manifest (`frame`: its
    decisions, a row per document): an id no other record holds, that is no document's internal
    id, and that a shell can pass (no NUL, which no argument can hold)."""
    import polars as pl

    if not record_id or "\0" in record_id:
        return False
    return (frame.filter(pl.col("source_record_id") == record_id).height == 1
            and frame.filter(pl.col("doc_id") == record_id).is_empty())


def _examples(decisions_path: str) -> dict:
    """One document of each removed kind and one eval item that matched, for the audit commands:
    a document by the user's own id where that finds it alone (`_names_one`), by ours otherwise."""
    import polars as pl

    from ito_assets.data.clean import CONTAMINATED
    from ito_assets.data.dedup import DUPLICATE

    frame = pl.read_parquet(decisions_path, columns=["doc_id", "source_record_id", "state", "eval_item_ids"])
    duplicate = frame.filter(pl.col("state") == DUPLICATE).head(1)
    contaminated = frame.filter(pl.col("state") == CONTAMINATED).head(1)

    def name(row: pl.DataFrame) -> str | None:
        if not row.height:
            return None
        return row["source_record_id"][0] if _names_one(frame, row["source_record_id"][0]) else row["doc_id"][0]

    return {
        "duplicate_doc": name(duplicate),
        "contaminated_doc": name(contaminated),
        "eval_item": contaminated["eval_item_ids"][0][0] if contaminated.height and len(contaminated["eval_item_ids"][0]) else None,
    }


def _unprotected(suite, decontam) -> list[str]:
    """The suite's items the scan could not look for: no view of them (question with answer,
    question, long answer) has enough words to index, or only numbers. No document can match
    them, so a summary that counted them as checked would overstate the protection."""
    from ito_assets.data.eval_index import build_index

    if decontam is None:
        return []
    indexed = {view.item_id for view in build_index(suite, decontam.decontam_config()).views}
    return [item.id for item in suite.items if item.id not in indexed]


def _unprotected_line(ids: list[str], min_view_words: int, word) -> str:
    shown = ", ".join(word(i) for i in ids[:5]) + (f" and {len(ids) - 5:,} more" if len(ids) > 5 else "")
    return (f"  not looked for: {len(ids):,} item(s) under {min_view_words} words even with the answer (or only numbers), "
            f"so no document can match them: {shown}; lengthen them to protect them")


def _operand(value: str, word) -> str:
    """`value` as the command's last operand, one shell word made by `word`; after `--` where it
    starts with '-', which the parser would otherwise read as an option."""
    return ("-- " if value.startswith("-") else "") + word(value)


def _audit_commands(key: str, examples: dict, word) -> list[str]:
    """The audit commands to suggest, each id one shell word made by `word`."""
    commands = [f"ito audit manifest {key}"]
    commands += [f"ito audit doc {_operand(examples[k], word)}" for k in ("duplicate_doc", "contaminated_doc") if examples[k]]
    commands += [f"ito audit eval-item {_operand(examples['eval_item'], word)}"] if examples["eval_item"] else []
    return commands


def _summary(verified, suite, files, prepared, copied: dict | None, stored: Path, home: Path,
             sources: list[dict]) -> VerbResult:
    """`sources`: the sources stage's counts per source (`_source_counts`), in the files' order."""
    c, shards = prepared.clean.conservation, prepared.clean.shards
    key = verified.short_digest
    examples = _examples(prepared.clean.decisions.path)
    audit = _audit_commands(key, examples, _shell_word)
    empty = sum(s["num_empty_skipped"] for s in sources)
    unprotected = _unprotected(suite, prepared.decontam)
    read = c.num_input + empty  # the documents are the records read less the empty ones skipped
    data = {
        "name": verified.manifest.name,
        "manifest_digest": verified.digest,
        "manifest_key": key,
        "manifest_path": str(stored),
        "eval_suite": {"id": suite.suite_id, "digest": suite.digest, "num_items": len(suite.items),
                       "unprotected_items": unprotected},
        "sources": [{"uri": f.uri, "sha256": f.sha256, "format": f.format, "num_bytes": f.num_bytes,
                     "num_records": n["num_documents"] + n["num_empty_skipped"], "num_documents": n["num_documents"],
                     "num_empty_skipped": n["num_empty_skipped"]} for f, n in zip(files, sources, strict=True)],
        "records": {"read": read, "documents": c.num_input, "empty_skipped": empty},
        "documents": {"input": c.num_input, "kept": c.num_kept, "duplicate": c.num_duplicate,
                      "contaminated": c.num_contaminated, "contaminated_dropped": c.num_contaminated_dropped,
                      "contaminated_cut": c.num_contaminated_cut, "clean_rows": c.num_clean_rows,
                      "duplicate_contaminated": c.num_duplicate_contaminated},
        "conservation_holds": c.holds,
        "clean_shards": {"folder": shards.folder,
                         "files": [{"path": s.path, "sha256": s.sha256, "num_rows": s.num_rows} for s in shards.shards]},
        "decisions": prepared.clean.decisions.path,
        "out": copied,
        "dagster": {"run_id": prepared.run_id, "instance": str(home), "partition": key},
        "num_checks_passed": prepared.num_checks_passed,
        "warnings": list(prepared.warnings),
        "audit": audit,
    }
    text = [
        f"data manifest {verified.manifest.name}: {verified.digest} (partition {key})",
        f"  written to {stored}",
        f"eval suite {suite.suite_id}: {suite.digest}, {len(suite.items)} items",
        *([_unprotected_line(unprotected, prepared.decontam.decontam_config().min_view_words, _printable_word)] if unprotected else []),
        f"documents: {c.num_input:,} in, {c.num_kept:,} kept, {c.num_duplicate:,} duplicates, "
        f"{c.num_contaminated:,} contaminated ({c.num_contaminated_dropped:,} dropped, {c.num_contaminated_cut:,} cut)"
        # Counted once, as duplicates; `ito audit manifest`'s contamination table counts them too.
        + (f"; {c.num_duplicate_contaminated:,} of the duplicates matched eval items too" if c.num_duplicate_contaminated else ""),
        f"conservation: {c.num_kept:,} + {c.num_duplicate:,} + {c.num_contaminated:,} = {c.num_input:,} documents "
        f"+ {empty:,} empty skipped = {read:,} records read; "
        f"{prepared.num_checks_passed} checks passed" + (f", warnings: {', '.join(prepared.warnings)}" if prepared.warnings else ""),
        f"clean shards: {len(shards.shards)} file(s), {shards.num_rows:,} rows, in {shards.folder}",
        f"decisions (one row per input document): {prepared.clean.decisions.path}",
    ]
    if empty:
        text.append(f"empty records: {empty:,} with an empty or whitespace-only text, skipped: not documents, so in no "
                    "decision and not found by `ito audit doc` (`ito audit manifest` counts them per source)")
    if copied:
        text.append(f"copied to {copied['folder']}: clean/ ({len(copied['clean_shards'])} file(s)), decisions.parquet, {_MANIFEST_COPY}")
    text += [f"Dagster run {prepared.run_id} in {home} (see it with `make ui`)",
             "trace a document:", *(f"  {command}" for command in _audit_commands(key, examples, _printable_word))]
    return VerbResult(data=data, live_api_contacted=False, text=text)
