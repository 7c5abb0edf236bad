"""What the CLI says at a glance is true: a page says what is left and `--all` reads it; each log
entry has its own time, shown in ISO 8601 UTC; desk listings are tables; an unknown eval item is
not found; the connection errors say what to do; one parameter count; a checkpoint names its run
once. Each test pins the exit status, the readable line and the envelope's fields."""

from __future__ import annotations

import json
import urllib.parse

import pytest

from ito_assets.api import cli, envelope
from ito_assets.api.commands import paging
from ito_assets.api.client import ApiClient, Reply
from ito_assets.control import telemetry
from test_bodies import built_world

RUN_ID = "run_" + "0" * 26


def printed(capsys, *argv: str) -> tuple[str, str, int]:
    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    return out, err, status


class PagedMetrics:
    """A transport serving `num` metrics (seq 1..num) by ?after=&limit=, as the API pages them;
    `total` False answers as a server that sends no total."""

    def __init__(self, num: int, *, total: bool = True) -> None:
        self.items = [{"seq": i, "step": i, "name": "pretraining/loss", "value": 1.0, "at": 1_796_236_805}
                      for i in range(1, num + 1)]
        self.total, self.paths = total, []

    def request(self, method, path, body):
        self.paths.append(path)
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
        after, limit = int(query["after"][0]), int(query["limit"][0])
        page = [m for m in self.items if m["seq"] > after][:limit]
        more = bool(page) and page[-1]["seq"] < self.items[-1]["seq"]
        data = {"run_id": RUN_ID, "state": "running", "metrics": page, "num_metrics": len(page),
                "next_after": page[-1]["seq"] if more else None}
        if self.total:
            data["num_total"] = len(self.items)
        return Reply(200, envelope.success(data, live_api_contacted=True))


@pytest.fixture
def answering(monkeypatch):
    def install(transport) -> None:
        from ito_assets.api import client_config

        monkeypatch.setattr(client_config, "connect", lambda **_kw: ApiClient(transport, sleep=lambda _s: None))
    return install


# --- 1. paging -----------------------------------------------------------------------------------


def test_a_page_says_how_many_of_how_many_and_how_to_read_the_rest(answering, capsys):
    answering(PagedMetrics(463))
    out, err, status = printed(capsys, "metrics", RUN_ID)
    lines = out.splitlines()
    assert status == 0 and err == ""
    assert lines[0] == f"metrics of {RUN_ID} (running): 100 of 463 entries"
    assert lines[-1] == "100 of 463 shown: --after 100 for the next page, or --all"
    assert len(lines) == 102


def test_the_last_page_has_no_cursor_and_no_hint(answering, capsys):
    answering(PagedMetrics(463))
    out, _err, status = printed(capsys, "metrics", RUN_ID, "--after", "400")
    lines = out.splitlines()
    assert status == 0
    assert lines[0] == f"metrics of {RUN_ID} (running): 63 of 463 entries" and len(lines) == 64
    document = json.loads(printed(capsys, "metrics", RUN_ID, "--after", "400", "--json")[0])
    assert document["data"]["next_after"] is None and document["data"]["num_total"] == 463


def test_a_listing_that_fits_one_page_says_only_its_count(answering, capsys):
    answering(PagedMetrics(3))
    out, _err, status = printed(capsys, "metrics", RUN_ID)
    assert status == 0 and out.splitlines()[0] == f"metrics of {RUN_ID} (running): 3 entries"
    assert len(out.splitlines()) == 4


def test_without_a_total_the_page_names_its_cursor(answering, capsys):
    answering(PagedMetrics(463, total=False))
    out, _err, status = printed(capsys, "metrics", RUN_ID)
    assert status == 0
    assert out.splitlines()[0] == f"metrics of {RUN_ID} (running): 100 entries"
    assert out.splitlines()[-1] == "100 shown, more after 100: --after 100 or --all"


def test_all_follows_the_cursor_in_bounded_pages_into_one_envelope(answering, capsys):
    api = PagedMetrics(463)
    answering(api)
    out, _err, status = printed(capsys, "metrics", RUN_ID, "--all", "--limit", "100", "--json")
    data = json.loads(out)["data"]
    assert status == 0
    assert [m["seq"] for m in data["metrics"]] == list(range(1, 464))
    assert (data["num_metrics"], data["num_total"], data["next_after"]) == (463, 463, None)
    assert [urllib.parse.parse_qs(urllib.parse.urlsplit(p).query)["after"][0] for p in api.paths] == [
        "0", "100", "200", "300", "400"]
    assert all("limit=100" in p for p in api.paths)


def test_all_asks_for_the_largest_page_by_default_and_prints_every_entry(answering, capsys):
    api = PagedMetrics(463)
    answering(api)
    out, _err, status = printed(capsys, "metrics", RUN_ID, "--all")
    assert status == 0 and len(api.paths) == 1 and "limit=500" in api.paths[0]
    assert out.splitlines()[0] == f"metrics of {RUN_ID} (running): 463 entries" and len(out.splitlines()) == 464


def test_all_stops_on_a_cursor_that_comes_back():
    calls = []

    def get(after):
        calls.append(after)
        return {"logs": [{"seq": 5}], "next_after": 5}

    merged = paging.follow(get, 0, "logs")
    assert calls == [0, 5] and merged["num_logs"] == 2 and merged["next_after"] is None


@pytest.fixture(scope="module")
def world():
    with built_world("ito-truth-") as built:
        yield built


def test_the_logs_route_counts_the_run_and_ends_its_cursor(world):
    for i in range(7):
        telemetry.append_log(world.ledger, world.run_id, "info", f"line {i}")
    first = world.call("GET", f"/v1/runs/{world.run_id}/logs", token="account", query="limit=3").document["data"]
    assert (first["num_logs"], first["num_total"]) == (3, 7)
    assert first["next_after"] == first["logs"][-1]["seq"]
    rest = world.call("GET", f"/v1/runs/{world.run_id}/logs", token="account",
                      query=f"after={first['next_after']}&limit=4").document["data"]
    assert (rest["num_logs"], rest["num_total"], rest["next_after"]) == (4, 7, None)


def test_the_runs_route_counts_the_matching_runs_and_ends_its_cursor(world):
    full = world.call("GET", "/v1/runs", token="account", query="limit=1").document["data"]
    assert (full["num_runs"], full["num_total"], full["next_after"]) == (1, 1, None)


# --- 2. each log entry's own time ---------------------------------------------------------------


def test_each_copied_event_keeps_its_own_time(world):
    import types

    import dagster as dg

    from ito_assets.defs.workload.outcome import copy_event_log

    def entry(kind, at: float, step: str | None = "pretraining"):
        event = types.SimpleNamespace(event_type=kind, is_failure=kind is dg.DagsterEventType.STEP_FAILURE,
                                      step_key=step, message="m")
        return types.SimpleNamespace(dagster_event=event, timestamp=at)

    events = [entry(dg.DagsterEventType.STEP_START, 1_796_236_805.9),
              entry(dg.DagsterEventType.STEP_SUCCESS, 1_796_236_865.2),
              entry(dg.DagsterEventType.RUN_SUCCESS, 1_796_236_866.0, None)]
    instance = types.SimpleNamespace(all_logs=lambda _dagster_run_id: events)
    run_id = world.run_id
    before = telemetry.every_page(telemetry.logs, world.ledger, run_id)
    assert copy_event_log(world.ledger, instance, "dagster-run", run_id) == 3
    copied = telemetry.every_page(telemetry.logs, world.ledger, run_id)[len(before):]
    assert [line.at for line in copied] == [1_796_236_805, 1_796_236_865, 1_796_236_866]


def test_log_times_print_as_iso_utc_and_stay_numbers_in_json(answering, capsys):
    import calendar

    at = calendar.timegm((2026, 12, 2, 18, 40, 5))
    logs = {"run_id": RUN_ID, "state": "succeeded", "num_logs": 2, "num_total": 2, "next_after": None,
            "logs": [{"seq": 1, "at": at, "level": "info", "message": "STEP_START"},
                     {"seq": 2, "at": at + 60, "level": "info", "message": "STEP_SUCCESS"}]}

    class Answer:
        def request(self, method, path, body):
            return Reply(200, envelope.success(logs, live_api_contacted=True))

    answering(Answer())
    out, _err, status = printed(capsys, "logs", RUN_ID)
    assert status == 0 and out.splitlines() == [
        f"logs of {RUN_ID} (succeeded): 2 entries",
        "  seq=1  at=2026-12-02T18:40:05Z  level=info  message=STEP_START",
        "  seq=2  at=2026-12-02T18:41:05Z  level=info  message=STEP_SUCCESS"]
    document = json.loads(printed(capsys, "logs", RUN_ID, "--json")[0])
    assert [line["at"] for line in document["data"]["logs"]] == [at, at + 60]


# --- 3. desk listings as tables -----------------------------------------------------------------


class Answer:
    def __init__(self, data: dict) -> None:
        self.data = data

    def request(self, method, path, body):
        return Reply(200, envelope.success(self.data, live_api_contacted=True))


def test_desk_accounts_list_is_an_aligned_table(answering, capsys):
    import calendar

    at = calendar.timegm((2026, 12, 1, 8, 0, 0))
    accounts = {"accounts": [{"account_id": "acc_" + "A" * 26, "name": "lab", "created_at": at},
                             {"account_id": "acc_" + "B" * 26, "name": "second-lab\x1b[2J", "created_at": at + 5}]}
    answering(Answer(accounts))
    out, err, status = printed(capsys, "desk", "accounts", "list")
    assert status == 0 and err == ""
    assert out.splitlines() == [
        "accounts: 2",
        "  account_id                      name               created_at",
        "  ------------------------------  -----------------  --------------------",
        f"  acc_{'A' * 26}  lab                2026-12-01T08:00:00Z",
        f"  acc_{'B' * 26}  second-lab\\x1b[2J  2026-12-01T08:00:05Z"]
    assert json.loads(printed(capsys, "desk", "accounts", "list", "--json")[0])["data"] == accounts


def test_desk_accounts_list_without_accounts_says_none(answering, capsys):
    answering(Answer({"accounts": []}))
    out, _err, status = printed(capsys, "desk", "accounts", "list")
    assert status == 0 and out.splitlines() == ["accounts: 0", "  (none)"]


def test_desk_bookings_list_is_an_aligned_table(answering, capsys):
    booking = {"booking_id": "bkg_" + "C" * 26, "account_id": "acc_" + "A" * 26, "state": "completed",
               "gpu_type": "H100", "num_gpus": 8, "num_nodes": 1, "topology": "1x8-nvlink", "region": "eu-west",
               "network": "ib-400g", "starts_at": 1_796_112_000, "ends_at": 1_796_284_800,
               "price_per_gpu_hour_cents": 250, "revision": 0, "created_at": 1, "updated_at": 1, "duration_s": 172800}
    answering(Answer({"bookings": [booking]}))
    out, _err, status = printed(capsys, "desk", "bookings", "list")
    lines = out.splitlines()
    assert status == 0 and lines[0] == "bookings: 1" and len(lines) == 4
    assert lines[1].split() == ["booking_id", "account_id", "state", "gpu_type", "num_gpus", "num_nodes", "topology",
                                "region", "network", "starts_at", "ends_at", "price_per_gpu_hour_cents", "revision"]
    assert lines[3].split() == [booking["booking_id"], booking["account_id"], "completed", "H100", "8", "1",
                                "1x8-nvlink", "eu-west", "ib-400g", "2026-12-01T08:00:00Z", "2026-12-03T08:00:00Z",
                                "250", "0"]
    # every column lines up: each value starts where its column's name does
    starts = [lines[1].index(name) for name in lines[1].split()]
    assert [lines[3].index(value, start) for value, start in zip(lines[3].split(), starts)] == starts
    assert "{" not in out and "'" not in out


def test_a_desk_record_reads_as_json_spells_it_with_times_in_iso_utc(answering, capsys):
    """`ito desk show` and every verb without a layout of its own printed Python's spelling:
    `approved: False`, `run_id: None`, epoch seconds, a dict in single quotes."""
    record = {"confirmation_id": "cfm_" + "D" * 26, "approved": False, "run_id": None, "cost_cents": 96000,
              "created_at": 1_796_112_000, "expires_at": 1_796_112_900,
              "binding": {"booking_id": "bkg_" + "C" * 26, "issued_at": 1_796_112_000, "gpus": [8]},
              "eligibility": {"account_id": "acc_" + "A" * 26}}
    answering(Answer(record))
    out, _err, status = printed(capsys, "desk", "show", "cfr_" + "0" * 26)
    assert status == 0
    assert out.splitlines() == [
        f"confirmation_id: {record['confirmation_id']}", "approved: false", "run_id: null", "cost_cents: 96000",
        "created_at: 2026-12-01T08:00:00Z", "expires_at: 2026-12-01T08:15:00Z",
        f'binding: {{"booking_id": "bkg_{"C" * 26}", "issued_at": "2026-12-01T08:00:00Z", "gpus": [8]}}']
    document = json.loads(printed(capsys, "desk", "show", "cfr_" + "0" * 26, "--json")[0])
    assert document["data"]["created_at"] == 1_796_112_000 and document["data"]["approved"] is False


@pytest.mark.parametrize(("key", "value", "shown"), [
    ("at", 0, "1970-01-01T00:00:00Z"), ("finished_at", 1_796_112_000, "2026-12-01T08:00:00Z"),
    ("attempts", 3, 3), ("finished_at", True, True), ("finished_at", "2026-12-05T23:59:51", "2026-12-05T23:59:51"),
    ("finished_at", 10**30, 10**30),  # past any calendar: the number, not a crash
])
def test_every_key_ending_in_at_is_a_time_when_it_holds_whole_seconds(key, value, shown):
    assert paging.shown_value(key, value) == shown


# --- 4. an unknown eval item is not found -------------------------------------------------------


class Lineage:
    """The warehouse's answers for an item with no matching document; `known` says whether a
    suite the warehouse was decontaminated against holds it."""

    def __init__(self, known: bool) -> None:
        self.known = known

    def audit_eval_item(self, _con, _item_id):
        return []

    def paraphrase_candidates(self, _con, _item_id):
        return []

    def eval_item_known(self, _con, _item_id):
        return self.known

    def manifests_not_looking_for(self, _con, _item_id):
        return []


@pytest.fixture
def warehouse(monkeypatch, tmp_path):
    """A configured suite holding py-trivia/001 only, and a warehouse answering as `Lineage`."""
    import contextlib

    from ito_assets.api.commands import audit

    suite = tmp_path / "suite.jsonl"
    suite.write_text(json.dumps({"id": "py-trivia/001", "benchmark": "py-trivia", "question": "q", "answer": "a"}) + "\n")
    monkeypatch.setenv("ITO_EVAL_SUITE", str(suite))

    def install(known: bool) -> None:
        monkeypatch.setattr(audit, "_open", lambda: (Lineage(known), contextlib.nullcontext()))
    return install


def test_an_unknown_eval_item_is_not_found(warehouse, capsys):
    warehouse(known=False)
    out, err, status = printed(capsys, "audit", "eval-item", "nope/999")
    assert (status, out) == (1, "")
    assert err == ("error AUDIT_NOT_FOUND: no eval item with this id is in the eval suites the warehouse was "
                   "decontaminated against, nor in the configured eval suite (ITO_EVAL_SUITE)\n")
    document = json.loads(printed(capsys, "audit", "eval-item", "nope/999", "--json")[0])
    assert document["ok"] is False and document["live_api_contacted"] is False
    assert document["error"]["code"] == "AUDIT_NOT_FOUND" and document["error"]["retryable"] is False


def test_a_real_item_without_matches_is_zero_matches(warehouse, capsys):
    warehouse(known=True)
    out, err, status = printed(capsys, "audit", "eval-item", "custom/042")
    assert status == 0 and err == ""
    assert out.splitlines() == ["eval item custom/042: 0 matching document(s), duplicates included", "  (none)"]
    document = json.loads(printed(capsys, "audit", "eval-item", "custom/042", "--json")[0])
    assert document["ok"] is True and document["data"]["num_documents"] == 0 and document["data"]["hits"] == []


def test_an_item_of_the_configured_suite_is_known_to_an_older_warehouse(warehouse, capsys):
    warehouse(known=False)
    out, _err, status = printed(capsys, "audit", "eval-item", "py-trivia/001")
    assert status == 0 and out.startswith("eval item py-trivia/001: 0 matching document(s)")


def test_the_warehouse_knows_every_item_of_a_suite_it_was_decontaminated_against():
    import duckdb

    from ito_assets.data import lineage

    with duckdb.connect(":memory:") as con:
        assert lineage.eval_item_known(con, "py-trivia/001") is False  # a warehouse without the table
        lineage.ensure_schema(con)
        con.execute("INSERT INTO eval_items VALUES ('sha256:m', 'py-trivia/001', 'py-trivia', true)")
        con.execute("INSERT INTO contamination_hits (manifest_digest, doc_id, eval_item_id) VALUES ('sha256:m', 'd', 'x/2')")
        assert [lineage.eval_item_known(con, i) for i in ("py-trivia/001", "x/2", "nope/999")] == [True, True, False]


# --- 5. connection and identity errors say what to do -------------------------------------------

TOKEN = "ito_acct_" + "CanarySecretToken0123456789abcdefghijklmnopq"[:43]


def _token_file(folder, name: str = "lab.token"):
    import os

    path = folder / name
    path.write_text(TOKEN + "\n")
    os.chmod(path, 0o600)
    return path


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_names_the_url_and_the_command_that_starts_the_api(monkeypatch, tmp_path, capsys):
    port = _free_port()
    monkeypatch.setenv("ITO_API_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("ITO_TOKEN_FILE", str(_token_file(tmp_path)))
    out, err, status = printed(capsys, "status", RUN_ID, "--timeout", "5")
    assert (status, out) == (1, "")
    assert err == (f"error API_UNREACHABLE: no API answers at http://127.0.0.1:{port}: start it on this machine "
                   f"with `ito serve --port {port}`, or set ITO_API_URL to the API's address\n")
    document = json.loads(printed(capsys, "status", RUN_ID, "--timeout", "5", "--json")[0])
    assert document["error"]["code"] == "API_UNREACHABLE" and document["error"]["retryable"] is True
    assert document["live_api_contacted"] is False
    assert TOKEN not in out + err + json.dumps(document)


def test_the_unreachable_hint_follows_the_address():
    from ito_assets.api import server
    from ito_assets.api.client import Endpoint, unreachable_message

    default = Endpoint("http", server.DEFAULT_HOST, server.DEFAULT_PORT)
    assert unreachable_message(default) == ("no API answers at http://127.0.0.1:8765: start it on this machine "
                                            "with `ito serve`, or set ITO_API_URL to the API's address")
    assert "`ito serve --host ::1`" in unreachable_message(Endpoint("http", "::1", 8765))
    assert unreachable_message(Endpoint("https", "api.example.org", 443)) == (
        "no API answers at https://api.example.org:443: check that `ito serve` runs there, or set ITO_API_URL "
        "to the API's address")


def test_no_identity_names_the_variable_and_the_tokens_make_run_left(monkeypatch, tmp_path, capsys):
    state = tmp_path / ".ito"
    (state / "walkthrough").mkdir(parents=True)
    _token_file(state / "walkthrough", "desk-0a1b2c3d.token")
    monkeypatch.setenv("ITO_STATE_DIR", str(state))
    monkeypatch.delenv("ITO_TOKEN_FILE", raising=False)
    out, err, status = printed(capsys, "status", RUN_ID)
    assert (status, out) == (1, "")
    assert err == ("error AUTH_REQUIRED: no identity: set ITO_TOKEN_FILE to the absolute path of the 0600 token "
                   f"file the desk issued; `make run` left its tokens in {state / 'walkthrough'}/ (newest: "
                   "desk-0a1b2c3d.token)\n")
    document = json.loads(printed(capsys, "status", RUN_ID, "--json")[0])
    assert document["error"]["code"] == "AUTH_REQUIRED" and document["live_api_contacted"] is False
    assert TOKEN not in out + err + json.dumps(document)


def test_no_identity_without_make_run_says_how_to_get_a_first_token(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("ITO_STATE_DIR", str(tmp_path / "empty"))
    monkeypatch.delenv("ITO_TOKEN_FILE", raising=False)
    _out, err, status = printed(capsys, "status", RUN_ID)
    assert status == 1 and err == (
        "error AUTH_REQUIRED: no identity: set ITO_TOKEN_FILE to the absolute path of the 0600 token file the desk "
        "issued; on the server's machine `ito desk bootstrap --token-out PATH` writes a first desk token\n")


@pytest.mark.parametrize("value", ["CANARY", "/nonexistent/CANARY.token"])
def test_a_token_pasted_into_ito_token_file_is_never_echoed(monkeypatch, tmp_path, capsys, value):
    from helpers import CANARIES

    secret = value.replace("CANARY", CANARIES["github"])
    monkeypatch.setenv("ITO_STATE_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("ITO_TOKEN_FILE", secret)
    out, err, status = printed(capsys, "status", RUN_ID)
    document = json.loads(printed(capsys, "status", RUN_ID, "--json")[0])
    assert status == 1 and document["error"]["code"] == "AUTH_REQUIRED" and "ITO_TOKEN_FILE" in err
    assert CANARIES["github"] not in out + err + json.dumps(document)


# --- 6. one parameter count ---------------------------------------------------------------------

PLAN_HARDWARE = ["--gpu-type", "H100-SXM", "--nodes", "1", "--gpus-per-node", "8", "--network", "infiniband",
                 "--price-cents-per-gpu-hour", "250"]


@pytest.fixture
def small_manifest(tmp_path) -> str:
    from pathlib import Path

    from helpers import write_manifest

    fixture = Path(__file__).resolve().parents[2] / "data" / "fixtures" / "manifests" / "fixture-small.json"
    return write_manifest(tmp_path / "m.json", json.loads(fixture.read_text()))


def test_verify_and_plan_print_the_same_parameter_count(small_manifest, capsys):
    out, err, status = printed(capsys, "manifest", "verify", small_manifest)
    assert status == 0 and err == ""
    assert "model: tiny (1,115,264 parameters; the manifest declares 1,000,000), revision r1" in out.splitlines()
    assert "budget: cap 50,000.00 USD, max incremental 25,000.00 USD" in out.splitlines()
    planned, _err, status = printed(capsys, "plan", "--booking", "bkg_1", "--manifest", small_manifest, *PLAN_HARDWARE)
    assert status == 0 and "model: tiny (1,115,264 parameters)" in planned.splitlines()
    summary = json.loads(printed(capsys, "manifest", "verify", small_manifest, "--json")[0])["data"]["summary"]
    plan = json.loads(printed(capsys, "plan", "--booking", "bkg_1", "--manifest", small_manifest, *PLAN_HARDWARE,
                              "--json")[0])["data"]["plan"]
    assert summary["model"]["num_parameters"] == plan["model"]["num_parameters"] == 1_115_264
    assert summary["model"]["manifest_num_parameters"] == plan["model"]["manifest_num_parameters"] == 1_000_000


def test_the_parameter_phrase_for_an_exact_or_unknown_size():
    from ito_assets.manifest.verify import parameters_phrase

    assert parameters_phrase({"num_parameters": 43_168, "manifest_num_parameters": 43_168}) == "43,168 parameters"
    assert parameters_phrase({"num_parameters": None, "manifest_num_parameters": 7_000_000}) == (
        "a size the planner does not know; the manifest declares 7,000,000 parameters")


@pytest.mark.parametrize(("argv", "local"), [
    (["data", "prepare"], True), (["audit", "doc"], True), (["audit", "eval-item"], True), (["manifest", "verify"], True),
    (["status"], False), (["desk", "bookings", "list"], False), (["train"], False),
])
def test_the_timeout_help_says_whether_the_verb_contacts_the_api(argv, local, capsys):
    """Every verb accepts --timeout; one that reads local files only said it bounded "the whole
    operation", which it never read."""
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args([*argv, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert ("accepted and ignored" in out) is local and ("the whole operation may take" in out) is not local
    assert cli.build_parser().parse_args(["audit", "doc", "x", "--timeout", "5"]).timeout == 5.0


@pytest.mark.parametrize("flag", ["--js", "--jso", "--json"])
def test_only_the_whole_json_flag_asks_for_json(capsys, tmp_path, monkeypatch, flag):
    """argparse took `--js` for `--json`, while the output mode is read from the literal flag
    before parsing (a refusal must know it): the command ran and printed text. Abbreviations are
    refused now, so what is printed is what was asked."""
    monkeypatch.setenv("ITO_STATE_DIR", str(tmp_path))  # no warehouse: a refusal either way
    out, err, status = printed(capsys, "audit", "manifest", "abcdef123456", flag)
    if flag == "--json":
        document = json.loads(out)
        assert status == 1 and document["error"]["code"] == "WAREHOUSE_NOT_FOUND" and err == ""
    else:
        assert status == 2 and out == "" and "USAGE_ERROR" in err


@pytest.mark.parametrize("argv", [["--help"], ["audit", "manifest", "--help"], ["-h"]])
def test_help_with_json_is_one_document_holding_the_help(capsys, argv):
    """argparse prints --help's text and exits: with --json, stdout held plain text, no document."""
    out, err, status = printed(capsys, *argv, "--json")
    document = json.loads(out)
    assert status == 0 and document["ok"] and document["data"]["help"].startswith("usage: ito") and err == ""
    with pytest.raises(SystemExit) as exited:  # without --json, the help as argparse prints it
        cli.main(list(argv))
    assert exited.value.code == 0 and capsys.readouterr().out.startswith("usage: ito")
