"""What the CLI prints for people: control characters from a run's log, an audit's corpus text or
the API's messages reach the terminal only as visible escapes; --json stays one line of ASCII; and
a reader that goes away early (`ito ... | head -1`) gets no traceback."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Iterator

import pytest

from helpers import loopback_server, valid_manifest, write_manifest
from ito_assets.api import cli, envelope
from ito_assets.api.client import ApiClient, Reply
from ito_assets.api.terminal import escape
from ito_assets.errors import ErrorCode, ItoError

RUN_ID = "run_" + "0" * 26
# A clear-screen, a carriage return that would overwrite the line, a Unicode line separator that
# some terminals and log viewers break on, a NUL, and a C1 CSI (U+009B, ESC [ in 8-bit form).
HOSTILE = "loss ok\x1b[2J\rFAKE: approved\u2028forged line\x00\x9b31m end"
RAW = ("\x1b", "\r", "\u2028", "\x00", "\x9b")
SHOWN = "loss ok\\x1b[2J\\x0dFAKE: approved\\u2028forged line\\x00\\x9b31m end"


# --- the escaping function at each edge of each range ------------------------------------------


@pytest.mark.parametrize("char,shown", [
    ("\x00", "\\x00"), ("\x1f", "\\x1f"), ("\n", "\\x0a"), ("\t", "\\x09"), ("\r", "\\x0d"), ("\x1b", "\\x1b"),
    ("\x7f", "\\x7f"), ("\x80", "\\x80"), ("\x9f", "\\x9f"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029"),
    ("\u202a", "\\u202a"), ("\u202e", "\\u202e"), ("\u2066", "\\u2066"), ("\u2069", "\\u2069"),
])
def test_each_control_character_becomes_a_visible_escape(char, shown):
    assert escape(f"a{char}b") == f"a{shown}b"


@pytest.mark.parametrize("char", [" ", "~", "\xa0", "\xff", "\u2027", "\u202f", "\u2065", "\u206a", "é", "名", "\\",
                                  "\U0001f600"])
def test_printable_neighbours_of_the_ranges_are_kept(char):
    assert escape(f"a{char}b") == f"a{char}b"


def test_every_code_point_of_the_ranges_and_nothing_else():
    escaped = {c for c in range(0x3000) if escape(chr(c)) != chr(c)}
    assert escaped == (set(range(0x20)) | set(range(0x7f, 0xa0)) | {0x2028, 0x2029} | set(range(0x202a, 0x202f))
                       | set(range(0x2066, 0x206a)))


def test_escaping_is_idempotent_and_leaves_no_raw_control():
    once = escape(HOSTILE)
    assert once == SHOWN and escape(once) == once
    assert not any(c in once for c in RAW)


# --- the CLI's readable output ------------------------------------------------------------------


class Scripted:
    """A transport answering every request with one envelope."""

    def __init__(self, document: dict, status: int = 200) -> None:
        self.document, self.status = document, status

    def request(self, method, path, body):
        return Reply(self.status, self.document)


@pytest.fixture
def api_answers(monkeypatch):
    def install(document: dict, status: int = 200) -> None:
        from ito_assets.api import client_config

        monkeypatch.setattr(client_config, "connect",
                            lambda **_kw: ApiClient(Scripted(document, status), sleep=lambda _s: None))
    return install


def printed(capsys, *argv: str) -> tuple[str, str, int]:
    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    return out, err, status


def assert_safe(text: str) -> None:
    for raw in RAW:
        assert raw not in text, repr(raw)


def test_a_run_log_line_is_printed_escaped(api_answers, capsys):
    logs = {"run_id": RUN_ID, "state": "running", "num_logs": 1,
            "logs": [{"seq": 1, "at": 0, "level": "info", "message": HOSTILE}]}
    api_answers(envelope.success(logs, live_api_contacted=True))
    out, err, status = printed(capsys, "logs", RUN_ID)
    assert status == 0 and err == ""
    assert_safe(out)
    assert f"message={SHOWN}" in out
    assert out.count("\n") == 2  # the header and one log line: no forged second line


def test_status_fields_from_the_api_are_printed_escaped(api_answers, capsys):
    run = {"run_id": RUN_ID, "state": "queued\x1b[2J", "booking_id": "bkg\r\u2029x", "manifest_sha256": "\x00",
           "idempotency_key": "k"}
    api_answers(envelope.success(run, live_api_contacted=True))
    out, _err, status = printed(capsys, "status", RUN_ID)
    assert status == 0
    assert_safe(out)
    assert "state: queued\\x1b[2J" in out and "booking: bkg\\x0d\\u2029x" in out


def test_an_error_message_from_the_api_is_printed_escaped(api_answers, capsys):
    api_answers(envelope.failure(ItoError(ErrorCode.RUN_NOT_FOUND, HOSTILE), live_api_contacted=True), status=404)
    out, err, status = printed(capsys, "status", RUN_ID)
    assert status == 1 and out == ""
    assert_safe(err)
    assert err == f"error RUN_NOT_FOUND: {SHOWN}\n"


def test_data_printed_without_text_lines_is_escaped_too(api_answers, capsys):
    api_answers(envelope.success({"name\x1b]0;title\x07": "v\u2028"}, live_api_contacted=True))
    out, _err, status = printed(capsys, "desk", "approve", "cfr_x", "--cost-cents", "0")
    assert status == 0 and out == "name\\x1b]0;title\\x07: v\\u2028\n"


def test_an_audit_of_corpus_text_is_printed_escaped(monkeypatch, capsys):
    from ito_assets.api.commands import audit

    hit = {"doc_id": "0123456789abcdef", "source_uri": "dataroot://c/a.jsonl", "row": 3, "view": "raw",
           "overlap_ratio": 0.5, "action": "drop", "char_start": 0, "char_end": 9, "matched_ngram": HOSTILE}

    candidate = {"doc_id": "0123456789abcdef", "source_record_id": HOSTILE, "similarity": 0.93, "char_start": 0, "char_end": 9, "excerpt": HOSTILE}

    class Lineage:
        @staticmethod
        def audit_eval_item(_con, _item_id):
            return [hit]

        @staticmethod
        def paraphrase_candidates(_con, _item_id):
            return [candidate]

        @staticmethod
        def manifests_not_looking_for(_con, _item_id):
            return []

    monkeypatch.setattr(audit, "_open", lambda: (Lineage, contextlib.nullcontext()))
    out, _err, status = printed(capsys, "audit", "eval-item", "py-trivia/007")
    assert status == 0
    assert_safe(out)
    assert SHOWN in out and "possible paraphrases" in out and out.count(SHOWN) == 3
    header, rule, row = out.splitlines()[1:4]
    # the columns are measured on the escaped text, so they line up as printed
    assert len(header.rstrip()) <= len(rule) == len(row.rstrip())


def test_json_output_is_one_ascii_line_that_round_trips(api_answers, capsys):
    logs = {"run_id": RUN_ID, "state": "running", "num_logs": 1,
            "logs": [{"seq": 1, "at": 0, "level": "info", "message": HOSTILE + "\u2029é"}]}
    api_answers(envelope.success(logs, live_api_contacted=True))
    out, _err, status = printed(capsys, "logs", RUN_ID, "--json")
    assert status == 0 and out.endswith("\n") and out.count("\n") == 1
    assert out.isascii()
    assert "\\u2028" in out and "\\u2029" in out and "\\u001b" in out and "\\u009b" in out
    assert json.loads(out)["data"]["logs"][0]["message"] == HOSTILE + "\u2029é"


def test_the_envelope_escapes_the_line_separators_itself():
    text = envelope.dumps({"m": "a\u2028b\u2029c\x85d\x00"})
    assert text == '{"m": "a\\u2028b\\u2029c\\u0085d\\u0000"}'


# --- a closed pipe ------------------------------------------------------------------------------


class _Logs(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):  # noqa: N802 - the name http.server calls
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *_args):
        pass


@contextlib.contextmanager
def logs_api(num_lines: int) -> Iterator[str]:
    """A loopback API whose every answer is one page of `num_lines` log lines (~200 bytes each)."""
    entries = [{"seq": i, "at": 0, "level": "info", "message": f"step {i} " + "x" * 180} for i in range(num_lines)]
    handler = type("Handler", (_Logs,), {"body": envelope.dumps(envelope.success(
        {"run_id": RUN_ID, "state": "running", "num_logs": num_lines, "logs": entries},
        live_api_contacted=True)).encode()})
    with loopback_server(handler) as url:
        yield url


# stdout into a pipe is block-buffered unless PYTHONUNBUFFERED is set: a closed pipe then shows up
# at the final flush, or at the first print. Both must be quiet.
BUFFERING = {"buffered": None, "unbuffered": "1"}


def with_buffering(env: dict[str, str], buffering: str) -> dict[str, str]:
    env = {k: v for k, v in env.items() if k != "PYTHONUNBUFFERED"}
    if BUFFERING[buffering]:
        env["PYTHONUNBUFFERED"] = BUFFERING[buffering]
    return env


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    token = Path(os.path.realpath(tmp_path)) / "token"
    token.write_text("ito_acct_" + "a" * 43 + "\n")
    token.chmod(0o600)
    return {**os.environ, "ITO_TOKEN_FILE": str(token)}


def assert_quiet(stderr: str) -> None:
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr and "Exception ignored" not in stderr
    assert stderr == ""


@pytest.mark.parametrize("buffering", sorted(BUFFERING))
@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["text", "json"])
def test_head_closing_the_pipe_early_is_quiet(env, tmp_path, json_flag, buffering):
    # 2,000 lines of ~200 bytes: far more than a pipe buffer holds, so `ito` is still writing
    # when head has printed its line and gone.
    with logs_api(2000) as url:
        script = (f'"{sys.executable}" -m ito_assets.api.cli logs {RUN_ID} --limit 500 {" ".join(json_flag)} '
                  f'2>"{tmp_path}/stderr" | head -c 40; s=${{PIPESTATUS[0]}}; echo; echo "status=$s"')
        done = subprocess.run(["bash", "-c", script], env=with_buffering({**env, "ITO_API_URL": url}, buffering),
                              capture_output=True, text=True, timeout=60)
    assert_quiet((tmp_path / "stderr").read_text())
    first, _, status = done.stdout.strip().partition("\n")
    assert first.startswith("logs of run_" if not json_flag else '{"data": {"logs": [')
    assert status == f"status={cli.EXIT_BROKEN_PIPE}"


@pytest.mark.parametrize("buffering", sorted(BUFFERING))
def test_a_reader_gone_before_the_first_byte_is_quiet(tmp_path, buffering):
    root = Path(os.path.realpath(tmp_path))
    manifest = write_manifest(root / "m.json", valid_manifest())
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody will ever read: the first write fails with EPIPE
    try:
        done = subprocess.run([sys.executable, "-m", "ito_assets.api.cli", "manifest", "verify", manifest],
                              env=with_buffering(dict(os.environ), buffering), stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)
    assert_quiet(done.stderr)
    assert done.returncode == cli.EXIT_BROKEN_PIPE


@pytest.mark.parametrize("buffering,status", [("buffered", cli.EXIT_BROKEN_PIPE), ("unbuffered", 0)])
def test_help_into_a_closed_pipe_is_quiet(buffering, status):
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([sys.executable, "-m", "ito_assets.api.cli", "--help"],
                              env=with_buffering(dict(os.environ), buffering), stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)
    assert_quiet(done.stderr)
    # Buffered, the help fails at the final flush (141); unbuffered, argparse itself swallows the
    # failed write of its help and exits 0.
    assert done.returncode == status


def test_an_open_pipe_still_gets_everything(env):
    with logs_api(2000) as url:
        done = subprocess.run([sys.executable, "-m", "ito_assets.api.cli", "logs", RUN_ID, "--limit", "500"],
                              env={**env, "ITO_API_URL": url}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == ""
    assert len(done.stdout.splitlines()) == 2001
