"""`ito data prepare`: a corpus of one's own through the data stage with no training manifest,
ledger or model. End to end on small generated corpora (gzip and zstd JSONL in one run, Parquet
with its own column names in another), and the refusals with their codes."""

from __future__ import annotations

import gzip
import json
import os
import random
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import dagster as dg
import polars as pl
import pyarrow as pa
import pytest

from helpers import CANARIES
from ito_assets.api.cli import run
from ito_assets.digests import file_sha256
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.verify import verify_data_manifest, verify_manifest
from ito_assets.settings import PROJECT_ROOT

SUITE_ID = "my-evals-v1"
ITEMS = [
    {"id": "t/1", "benchmark": "trivia", "question": "Which built-in exception is raised when you look up a key in a "
     "dictionary that does not contain that key at all?", "answer": "KeyError"},
    {"id": "t/2", "benchmark": "trivia", "question": "What value does a Python function hand back to its caller when "
     "its body finishes without executing any return statement?", "answer": "None"},
]
WORDS = [f"w{i}" for i in range(400)]
NUM_DOCUMENTS = 300
# Steps whose code would need torch; the data job must contain none of their assets.
TRAINING_GROUPS = {"decision", "workload", "training", "posttraining"}


def corpus(seed: int) -> list[dict]:
    """Random-word documents (no two alike), then planted: an exact copy, a near copy (one word of
    80 changed: Jaccard ~0.9) and a document quoting an eval question verbatim."""
    rng = random.Random(seed)
    docs = [{"id": f"doc-{seed}-{i}", "text": " ".join(rng.choice(WORDS) for _ in range(80))} for i in range(NUM_DOCUMENTS)]
    docs[10]["text"] = docs[3]["text"]
    near = docs[4]["text"].split()
    near[40] = "changed"
    docs[11]["text"] = " ".join(near)
    item = ITEMS[seed % len(ITEMS)]  # another item per file: two quotes of one item would be near copies
    docs[12]["text"] = f"Quiz night, question three: {item['question']} We all said {item['answer']}."
    return docs


def jsonl(records: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def zstd(data: bytes) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, "zstd") as out:
        out.write(data)
    return sink.getvalue().to_pybytes()


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    """A corpus folder, an eval suite named by its first line (not by its file name), and the
    state and Dagster home the command writes to (the env vars a module fixture cannot monkeypatch)."""
    root = Path(os.path.realpath(tmp_path_factory.mktemp("prepare")))
    data = root / "corpus"
    data.mkdir()
    (data / "part-a.jsonl.gz").write_bytes(gzip.compress(jsonl(corpus(1))))
    (data / "part-b.jsonl").write_bytes(zstd(jsonl(corpus(2))))  # zstd, told by its bytes, not its name
    pl.DataFrame([{"uid": 1000 + i, "body": d["text"]} for i, d in enumerate(corpus(3))]).write_parquet(data / "records.parquet")
    suite = root / "suite.jsonl"
    suite.write_bytes(jsonl([{"suite_id": SUITE_ID}, *ITEMS]))
    env = {"ITO_STATE_DIR": str(root / "state"), "DAGSTER_HOME": str(root / "dagster")}
    return {"root": root, "data": data, "suite": suite, "env": env}


@pytest.fixture(autouse=True)
def _environment(world, monkeypatch) -> None:
    for name, value in world["env"].items():
        monkeypatch.setenv(name, value)


def ito(*argv: str) -> tuple[dict, int]:
    return run([*argv, "--json"])


def _code(document: dict) -> str:
    assert not document["ok"], document
    return document["error"]["code"]


# A subprocess, as a user runs it: stdout must be exactly one JSON document, and neither loading
# the command nor running the data job's steps may import torch.
_PROBE = """
import json, sys
from ito_assets.api import cli
status = cli.main(sys.argv[1:])
print(json.dumps({"status": status, "torch": "torch" in sys.modules}), file=sys.stderr)
"""


@pytest.fixture(scope="module")
def jsonl_run(world) -> dict:
    out = world["root"] / "out"
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, "data", "prepare", "--corpus", str(world["data"] / "*.jsonl*"),
         "--eval-suite", str(world["suite"]), "--out", str(out), "--license", "CC0-1.0", "--name", "my-corpus", "--json"],
        env={**os.environ, **world["env"]}, cwd=world["root"], capture_output=True, text=True, timeout=300,
    )
    probe = json.loads(done.stderr.strip().splitlines()[-1])
    return {"document": json.loads(done.stdout), "status": probe["status"], "torch": probe["torch"], "out": out,
            "stderr": done.stderr}


@pytest.mark.slow
def test_gzip_and_zstd_jsonl_end_to_end(jsonl_run, world) -> None:
    document = jsonl_run["document"]
    assert jsonl_run["status"] == 0 and document["ok"], document
    data = document["data"]
    counts = data["documents"]
    # 2 x 300 documents: per file one exact copy, one near copy and one quoting an eval item.
    assert counts["input"] == 2 * NUM_DOCUMENTS and counts["duplicate"] == 4 and counts["contaminated"] == 2
    assert counts["kept"] + counts["duplicate"] + counts["contaminated"] == counts["input"] and data["conservation_holds"]
    assert [s["format"] for s in data["sources"]] == ["jsonl", "jsonl"] and data["warnings"] == []
    # Hashed as stored: the digest is the compressed file's.
    assert data["sources"][0]["sha256"] == file_sha256(world["data"] / "part-a.jsonl.gz")
    assert data["eval_suite"]["id"] == SUITE_ID
    assert any(a.startswith("ito audit eval-item t/") for a in data["audit"])


@pytest.mark.slow
def test_the_steps_import_no_torch(jsonl_run) -> None:
    assert jsonl_run["status"] == 0 and jsonl_run["torch"] is False


@pytest.mark.slow
def test_stderr_holds_no_dagster_preview_warning(jsonl_run) -> None:
    assert "PreviewWarning" not in jsonl_run["stderr"] and "BetaWarning" not in jsonl_run["stderr"]


@pytest.mark.slow
def test_out_holds_what_the_checks_passed(jsonl_run) -> None:
    data, out = jsonl_run["document"]["data"], jsonl_run["out"]
    shards = data["clean_shards"]["files"]
    copies = sorted((out / "clean").iterdir())
    assert [c.name for c in copies] == sorted(Path(s["path"]).name for s in shards)
    assert {file_sha256(c) for c in copies} == {s["sha256"] for s in shards}
    assert pl.read_parquet(out / "clean").height == data["documents"]["clean_rows"]
    decisions = pl.read_parquet(out / "decisions.parquet")
    assert decisions.height == data["documents"]["input"] and decisions["doc_id"].n_unique() == decisions.height
    assert (out / "data-manifest.json").read_bytes() == Path(data["manifest_path"]).read_bytes()


@pytest.mark.slow
def test_the_manifest_is_a_verified_data_manifest_and_never_a_training_one(jsonl_run) -> None:
    data = jsonl_run["document"]["data"]
    verified = verify_data_manifest(data["manifest_path"])
    assert verified.digest == data["manifest_digest"] and not verified.is_training
    ref = verified.manifest.data[0]
    assert ref.license == "CC0-1.0" and ref.uri.startswith("file:///") and ref.decontamination.eval_suite_id == SUITE_ID
    assert _manifest_refused(data["manifest_path"]) is ErrorCode.MANIFEST_INVALID


def _manifest_refused(path: str) -> ErrorCode:
    from ito_assets.errors import ItoError

    try:
        verify_manifest(path)
    except ItoError as error:
        return error.code
    raise AssertionError("a data manifest verified as a training manifest")


@pytest.mark.slow
def test_the_run_is_in_the_instance_under_the_manifests_partition(jsonl_run, world) -> None:
    data = jsonl_run["document"]["data"]
    with dg.DagsterInstance.from_config(world["env"]["DAGSTER_HOME"]) as instance:
        assert data["manifest_key"] in instance.get_dynamic_partitions("manifests")
        run = instance.get_run_by_id(data["dagster"]["run_id"])
        assert run.job_name == "data_preparation_job" and run.is_success
        assert run.tags["dagster/partition"] == data["manifest_key"]
        # The suite came through the run config, not ITO_EVAL_SUITE (unset: the fixture suite).
        assert run.run_config["ops"]["eval_suite"]["config"]["path"] == str(world["suite"])


@pytest.mark.slow
def test_the_audit_commands_trace_a_document(jsonl_run, world) -> None:
    doc_command = next(a for a in jsonl_run["document"]["data"]["audit"] if a.startswith("ito audit doc"))
    document, status = ito(*shlex.split(doc_command)[1:])
    assert status == 0 and document["data"]["manifests"][0]["state"] in {"duplicate", "contaminated"}


# Ids the pipeline keeps as they are: a tab, a space, a quote, any script, any length.
ODD_RECORD_IDS = {10: "dup\tof three", 11: "ü near copy", 12: "quote " + "x" * 300}
ODD_ITEM_IDS = ["my item/1", "ü/2"]


@pytest.mark.slow
def test_blank_records_are_counted_and_odd_ids_round_trip(world, tmp_path) -> None:
    """Three records with an empty or whitespace-only text: no documents, but in the account of
    what was read; every suggested command is one shell word per id and runs as suggested; the
    manifest's copy in --out is 0600, as the stored one."""
    records = corpus(4)
    for index, record_id in ODD_RECORD_IDS.items():
        records[index]["id"] = record_id
    records[1:1] = [{"id": "w1", "text": ""}, {"id": "w2", "text": " \t "}, {"id": "w3", "text": "\u3000"}]
    (tmp_path / "blank.jsonl").write_bytes(jsonl(records))
    suite = tmp_path / "odd.jsonl"
    suite.write_bytes(jsonl([{"suite_id": "odd-v1"}, *({**item, "id": i} for item, i in zip(ITEMS, ODD_ITEM_IDS))]))
    out = tmp_path / "out"
    document, status = ito("data", "prepare", "--corpus", str(tmp_path / "blank.jsonl"), "--eval-suite", str(suite), "--out", str(out))
    assert status == 0, document
    data = document["data"]
    assert data["records"] == {"read": NUM_DOCUMENTS + 3, "documents": NUM_DOCUMENTS, "empty_skipped": 3}
    assert data["documents"]["input"] == NUM_DOCUMENTS
    assert [(s["num_records"], s["num_documents"], s["num_empty_skipped"]) for s in data["sources"]] == [(NUM_DOCUMENTS + 3, NUM_DOCUMENTS, 3)]
    text, _ = run(["audit", "manifest", data["manifest_key"]])
    assert f"records read: {NUM_DOCUMENTS + 3} = {NUM_DOCUMENTS} documents + 3 skipped" in "\n".join(text["_text"])
    traced = {}
    for command in data["audit"][1:]:
        argv = shlex.split(command)
        assert len(argv) == 4, command
        traced[argv[-1]], status = ito(*argv[1:])
        assert status == 0, traced[argv[-1]]
    assert set(traced) & set(ODD_RECORD_IDS.values()) and set(traced) & set(ODD_ITEM_IDS)
    assert stat.S_IMODE((out / "data-manifest.json").stat().st_mode) == 0o600
    assert stat.S_IMODE(Path(data["manifest_path"]).stat().st_mode) == 0o600
    missing, status = ito("audit", "doc", "w2")
    assert status == 1 and f"ito audit manifest {data['manifest_key']}" in missing["error"]["message"]


@pytest.mark.parametrize("record_id", [
    "with space", "a\tb", "ü/1", "x" * 300, "O'Brien \"q\" \\ $HOME `x`", "line\nbreak",
    "esc\x1b[31m", "c1\x85", "ls\u2028", "bidi\u202e", "quote'\\\ttab",
])
def test_a_suggested_command_gives_back_its_id(record_id: str) -> None:
    """As JSON, POSIX quoting (shlex.split); as printed, where the terminal shows a control
    character as an escape, bash's $'...' reads that escape back."""
    from ito_assets.api.commands.data import _audit_commands, _printable_word, _shell_word
    from ito_assets.api.terminal import escape

    examples = {"duplicate_doc": record_id, "contaminated_doc": record_id, "eval_item": record_id}
    for command in _audit_commands("0123456789ab", examples, _shell_word)[1:]:
        assert shlex.split(command)[3:] == [record_id]
    printed = _audit_commands("0123456789ab", examples, _printable_word)
    assert all(escape(line) == line for line in printed)  # printed as built
    words = [line.split(" ", 3)[3] for line in printed[1:]]
    shown = subprocess.run(["bash", "-c", "printf '%s\\0' " + " ".join(words)], capture_output=True, check=True,
                           env={"LC_ALL": "C.UTF-8", "PATH": os.environ["PATH"]}).stdout
    assert shown.decode().split("\0")[:-1] == [record_id] * 3


def _decisions(path: Path, rows: list[tuple[str, str | None, str]]) -> str:
    """A decisions file of (doc_id, source_record_id, state) rows, each contaminated one by t/1."""
    pl.DataFrame(
        [(d, r, s, ["t/1"] if s == "contaminated" else None) for d, r, s in rows],
        schema={"doc_id": pl.String, "source_record_id": pl.String, "state": pl.String, "eval_item_ids": pl.List(pl.String)},
        orient="row",
    ).write_parquet(path)
    return str(path)


@pytest.mark.parametrize(("duplicate_id", "contaminated_id", "others"), [
    ("same", "other", [("c" * 16, "same", "kept")]),  # the user's id is another record's too
    ("a" * 16, "ok", [("d" * 16, "x", "kept")]),  # ... the internal id of another document
    ("nul\0byte", "ok", []),  # no argument can hold it
    ("", "ok", []),
    (None, "ok", []),
])
def test_a_suggested_document_is_one_the_command_finds_alone(tmp_path, duplicate_id, contaminated_id, others) -> None:
    """`ito audit doc ID` answers every document whose record id or internal id is ID: the
    suggestion is the user's own id only where that names the one document; else ours."""
    from ito_assets.api.commands.data import _examples

    rows = [("a" * 16, "mine-1", "kept"), ("b" * 16, duplicate_id, "duplicate"), ("e" * 16, contaminated_id, "contaminated"), *others]
    examples = _examples(_decisions(tmp_path / "decisions.parquet", rows))
    assert examples == {"duplicate_doc": "b" * 16, "contaminated_doc": contaminated_id, "eval_item": "t/1"}


@pytest.mark.parametrize("value", ["-x", "--json", "-", "--", "-tab\there"])
def test_a_suggested_id_that_starts_with_a_dash_is_no_option(value: str) -> None:
    from ito_assets.api.cli import build_parser
    from ito_assets.api.commands.data import _audit_commands, _shell_word

    examples = {"duplicate_doc": value, "contaminated_doc": value, "eval_item": value}
    for command in _audit_commands("0123456789ab", examples, _shell_word)[1:]:
        args = build_parser().parse_args(shlex.split(command)[1:])  # it was an unknown option: USAGE_ERROR
        assert (args.doc_id if args.action == "doc" else args.item_id) == value


@pytest.mark.parametrize(("argv", "as_json"), [
    (["audit", "doc", "--", "--json"], False),  # the suggested command for a document whose id is --json
    (["audit", "doc", "--json", "--", "--json"], True), (["--json", "audit", "doc", "x"], True),
    (["audit", "doc", "x"], False),
])
def test_json_after_the_double_dash_is_an_argument_not_the_output_mode(tmp_path, monkeypatch, capsys, argv, as_json) -> None:
    from ito_assets.api import cli

    monkeypatch.setenv("ITO_STATE_DIR", str(tmp_path / "state"))  # no warehouse: a refusal, in the mode asked for
    assert cli.main(argv) != 0
    printed = capsys.readouterr()
    if as_json:
        assert json.loads(printed.out)["ok"] is False and printed.err == ""
    else:
        assert printed.out == "" and printed.err.startswith("error ")


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077, 0o277])
def test_the_manifest_copy_is_0600_whatever_the_umask(tmp_path, umask: int) -> None:
    from ito_assets.api.commands.data import _copy_private

    source = tmp_path / "m.json"
    source.write_bytes(b"{}\n")
    source.chmod(0o600)
    old = os.umask(umask)
    try:
        _copy_private(source, tmp_path / "copy.json")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "copy.json").stat().st_mode) == 0o600 and (tmp_path / "copy.json").read_bytes() == b"{}\n"


@pytest.mark.slow
def test_parquet_with_its_own_column_names(world) -> None:
    document, status = ito("data", "prepare", "--corpus", str(world["data"] / "records.parquet"),
                           "--eval-suite", str(world["suite"]), "--text-field", "body", "--id-field", "uid")
    assert status == 0, document
    data = document["data"]
    assert data["sources"][0]["format"] == "parquet" and data["name"] == "records"
    counts = data["documents"]
    assert (counts["input"], counts["duplicate"], counts["contaminated"]) == (NUM_DOCUMENTS, 2, 1)
    contaminated = next(a.split()[-1] for a in data["audit"][1:] if a.startswith("ito audit doc"))
    traced, _ = ito("audit", "doc", contaminated)
    sources = {m["source_record_id"] for m in traced["data"]["manifests"]}
    assert sources <= {str(1000 + i) for i in range(NUM_DOCUMENTS)} and sources  # the uid column, as text
    # The command names the document by the user's own id, which the audit takes.
    assert {m["matched_by"] for m in traced["data"]["manifests"]} == {"source_record_id"}


@pytest.mark.slow
def test_a_wrong_field_name_is_source_invalid(world) -> None:
    document, status = ito("data", "prepare", "--corpus", str(world["data"] / "records.parquet"),
                           "--eval-suite", str(world["suite"]), "--text-field", "content")
    assert status == 1 and _code(document) == "SOURCE_INVALID"
    assert "'content'" in document["error"]["message"]


def test_a_glob_matching_nothing_is_source_not_found(world) -> None:
    document, status = ito("data", "prepare", "--corpus", str(world["data"] / "*.jsonl*"),
                           "--corpus", str(world["data"] / f"{CANARIES['github']}*.csv"), "--eval-suite", str(world["suite"]))
    assert status == 1 and _code(document) == "SOURCE_NOT_FOUND" and "#2" in document["error"]["message"]
    assert CANARIES["github"] not in json.dumps(document)


@pytest.mark.parametrize("flags", [
    ["--name", f"has space {CANARIES['aws']}"],
    ["--license", "MIT OR Apache-2.0"],  # an SPDX expression: one licence id is asked for
    ["--text-field", "has space"],
    ["--out", str(PROJECT_ROOT)],  # not empty
    # A name longer than the file system takes: os.path.exists says False, and the job ran whole
    # before the copy's mkdir failed, an INTERNAL_ERROR. Beside it, one not UTF-8, which no JSON
    # answer could name.
    ["--out", f"/tmp/{CANARIES['aws']}/" + "n" * 256],
    ["--out", f"/tmp/{'n' * 256}/{CANARIES['aws']}"],
    ["--out", f"/tmp/{CANARIES['aws']}-\udcff"],
])
def test_bad_flags_are_usage_errors_that_echo_nothing(world, flags) -> None:
    document, status = ito("data", "prepare", "--corpus", str(world["data"] / "*.jsonl*"),
                           "--eval-suite", str(world["suite"]), *flags)
    assert status == 2 and _code(document) == "USAGE_ERROR"
    assert flags[1] not in json.dumps(document)


def test_a_secret_in_a_flag_is_caught_by_the_manifests_secret_scan(world) -> None:
    document, status = ito("data", "prepare", "--corpus", str(world["data"] / "*.jsonl*"),
                           "--eval-suite", str(world["suite"]), "--license", CANARIES["slack"])
    assert status == 1 and _code(document) == "MANIFEST_CONTAINS_SECRET"
    assert CANARIES["slack"] not in json.dumps(document)
    # The refused manifest is not kept where manifests are stored: it holds the secret.
    stored = Path(world["env"]["ITO_STATE_DIR"]) / "data-manifests"
    assert not [f for f in stored.rglob("*") if f.is_file() and CANARIES["slack"].encode() in f.read_bytes()]


def test_an_unreadable_eval_suite_is_refused_before_anything_runs(world, tmp_path) -> None:
    missing = tmp_path / "missing.jsonl"
    document, _ = ito("data", "prepare", "--corpus", str(world["data"] / "*.jsonl*"), "--eval-suite", str(missing))
    assert _code(document) == "EVAL_SUITE_INVALID"
    unnamed = tmp_path / "my evals.jsonl"  # no header, and a stem no manifest can name it by
    unnamed.write_bytes(jsonl(ITEMS))
    document, _ = ito("data", "prepare", "--corpus", str(world["data"] / "*.jsonl*"), "--eval-suite", str(unnamed))
    assert _code(document) == "EVAL_SUITE_INVALID" and "suite_id" in document["error"]["message"]


def test_the_data_job_holds_no_training_asset() -> None:
    from definitions import build_definitions
    from ito_assets.defs.jobs import DATA_PREPARATION_ASSETS
    from ito_assets.settings import load_settings

    defs = build_definitions(load_settings())
    job = defs.resolve_job_def("data_preparation_job")
    graph = defs.resolve_asset_graph()
    keys = job.asset_layer.selected_asset_keys
    assert {key.to_user_string() for key in keys} == set(DATA_PREPARATION_ASSETS)
    assert not {graph.get(key).group_name for key in keys} & TRAINING_GROUPS
    assert job.executor_def is dg.in_process_executor


def test_the_decision_refuses_a_data_manifest(tmp_path) -> None:
    from ito_assets.defs.failures import training_manifest_or_fail
    from ito_assets.manifest import discovery

    path = tmp_path.resolve() / "d.json"
    path.write_bytes(json.dumps({"schema_version": 1, "kind": "data", "name": "n", "data": [
        {"uri": "file:///x.jsonl", "sha256": "0" * 64, "license": "MIT", "format": "jsonl"}]}).encode())
    key = file_sha256(path)[:12]
    verdict = discovery.judge(str(path), key, max_bytes=256 * 1024)
    assert verdict.ok
    with pytest.raises(dg.Failure) as info:
        training_manifest_or_fail(verdict, "the decision")
    assert info.value.metadata["error_code"].value == "MANIFEST_INVALID"


@pytest.mark.parametrize("length, accepted", [(255, True), (256, False)])
def test_an_out_folder_name_is_judged_at_the_file_systems_limit(tmp_path, length, accepted) -> None:
    from ito_assets.api.commands.data import _check_out

    out = tmp_path / "new" / ("n" * length)
    if accepted:
        _check_out(out)
    else:
        with pytest.raises(ItoError, match="longer than the 255 bytes"):
            _check_out(out)
