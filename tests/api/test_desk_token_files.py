"""`ito desk tokens issue --out` and `ito desk bootstrap --token-out`: the token file is made
before the token. A path that cannot take it refuses the command with no token issued; a token
issued but not written is revoked, and only its id is reported."""

from __future__ import annotations

import errno
import os
import sqlite3

import pytest

from api_harness import environment
from ito_assets.api import cli
from ito_assets.api.client import ApiClient
from ito_assets.api.commands import desk
from ito_assets.errors import ErrorCode, ItoError


def live_tokens(api) -> set[str]:
    with sqlite3.connect(api.server.ledger_path) as db:
        return {row[0] for row in db.execute("SELECT token_id FROM identity_tokens WHERE revoked_at IS NULL")}


def issue(api, out: str) -> dict:
    return api.ito("desk", "tokens", "issue", "--account", api.accounts["account"], "--out", out, token="desk")


def refused_with_no_token(api, out: str) -> dict:
    before = live_tokens(api)
    document = issue(api, out)
    assert document["ok"] is False and document["error"]["code"] == "USAGE_ERROR", document
    assert live_tokens(api) == before
    return document["error"]


def test_an_existing_file_is_refused_before_a_token_is_issued(api) -> None:
    existing = api.root / api.unique("exists.token")
    existing.write_text("kept\n")
    error = refused_with_no_token(api, str(existing))
    assert error["message"] == "--out already exists; choose a new path"
    assert existing.read_text() == "kept\n"


def test_a_link_is_refused_and_never_followed(api) -> None:
    link, target = api.root / api.unique("link.token"), api.root / api.unique("target.token")
    link.symlink_to(target)  # dangling: following it would create the target
    refused_with_no_token(api, str(link))
    assert not target.exists() and link.is_symlink()


def test_a_relative_path_is_refused_before_a_token_is_issued(api) -> None:
    assert refused_with_no_token(api, "relative.token")["message"] == "--out must be an absolute path"


def test_a_missing_folder_is_refused_before_a_token_is_issued(api) -> None:
    out = api.root / api.unique("no-such-folder") / "issued.token"
    assert refused_with_no_token(api, str(out))["message"] == "--out cannot be created (ENOENT)"


def test_a_new_path_in_an_existing_folder_gets_the_one_token_issued(api) -> None:
    before = live_tokens(api)
    out = api.root / api.unique("new.token")
    document = issue(api, str(out))
    assert document["ok"] is True and live_tokens(api) == before | {document["data"]["token_id"]}
    assert out.stat().st_mode & 0o777 == 0o600 and out.read_text().startswith("ito_acct_")
    assert api.ok("readiness", token=str(out))["ready"]


def test_a_refused_issue_leaves_no_file(api) -> None:
    out = api.root / api.unique("refused.token")
    before = live_tokens(api)
    document = api.ito("desk", "tokens", "issue", "--account", "acc_" + "0" * 26, "--out", str(out), token="desk")
    assert document["ok"] is False and live_tokens(api) == before
    assert not os.path.lexists(out)


def _full_disk(_fd: int, _secret: str) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_token_that_cannot_be_written_is_revoked(api, monkeypatch) -> None:
    monkeypatch.setattr(desk, "_write_token", _full_disk)
    out = api.root / api.unique("full.token")
    error = refused_with_no_token(api, str(out))
    assert error["message"].startswith("the token could not be written to --out (ENOSPC); token tok_")
    assert error["message"].endswith(" was revoked") and "ito_acct_" not in error["message"]
    assert not os.path.lexists(out)


def test_a_token_neither_written_nor_revoked_is_reported_by_id(api, monkeypatch) -> None:
    monkeypatch.setattr(desk, "_write_token", _full_disk)
    real_post = ApiClient.post

    def revocation_fails(self, path: str, body: dict) -> dict:
        if path == "/v1/desk/tokens/revoke":
            raise ItoError(ErrorCode.API_UNREACHABLE, "unreachable")
        return real_post(self, path, body)
    monkeypatch.setattr(ApiClient, "post", revocation_fails)
    before = live_tokens(api)
    out = api.root / api.unique("orphan.token")
    document = issue(api, str(out))
    [token_id] = live_tokens(api) - before
    assert document["error"]["message"] == ("the token could not be written to --out (ENOSPC) and could not be "
                                            f"revoked; revoke it: ito desk tokens revoke {token_id}")
    assert not os.path.lexists(out)
    monkeypatch.undo()
    api.ok("desk", "tokens", "revoke", token_id, token="desk")  # the id in the message is enough
    assert token_id not in live_tokens(api)


def _bootstrap(api, out: str) -> dict:
    env = {"ITO_LEDGER_URL": api.server.env["ITO_LEDGER_URL"], "ITO_STATE_DIR": str(api.server.state_dir)}
    with environment(env):
        document, _status = cli.run(["desk", "bootstrap", "--token-out", out, "--json"])
    document.pop("_text", None)
    return document


@pytest.mark.parametrize("where", ["existing", "missing folder"])
def test_bootstrap_refuses_an_unusable_path_before_a_token_is_issued(api, where) -> None:
    out = api.root / api.unique("boot.token")
    if where == "existing":
        out.write_text("kept\n")
    else:
        out = out.parent / api.unique("no-such-folder") / "boot.token"
    before = live_tokens(api)
    document = _bootstrap(api, str(out))
    assert document["ok"] is False and document["error"]["code"] == "USAGE_ERROR"
    assert live_tokens(api) == before


def test_bootstrap_revokes_a_token_it_cannot_write(api, monkeypatch) -> None:
    monkeypatch.setattr(desk, "_write_token", _full_disk)
    before = live_tokens(api)
    out = api.root / api.unique("boot-full.token")
    document = _bootstrap(api, str(out))
    assert document["error"]["message"].startswith("the token could not be written to --token-out (ENOSPC)")
    assert live_tokens(api) == before and not os.path.lexists(out)


def test_bootstrap_names_the_token_it_could_neither_write_nor_revoke(api, monkeypatch) -> None:
    # A SQLite ledger on the same full disk: the revocation fails too. It was an INTERNAL_ERROR
    # with a live desk token nobody held.
    from ito_assets.control import identity

    monkeypatch.setattr(desk, "_write_token", _full_disk)

    def revocation_fails(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(identity, "revoke_token", revocation_fails)
    before = live_tokens(api)
    document = _bootstrap(api, str(api.root / api.unique("boot-orphan.token")))
    [token_id] = live_tokens(api) - before
    assert document["error"] == {**document["error"], "code": "USAGE_ERROR", "message": (
        "the token could not be written to --token-out (ENOSPC) and could not be revoked; revoke it: "
        f"ito desk tokens revoke {token_id}")}


def test_a_token_whose_write_fails_in_any_way_is_revoked(api, monkeypatch) -> None:
    def interrupted(_fd, _secret):
        raise UnicodeEncodeError("ascii", "x", 0, 1, "not ASCII")
    monkeypatch.setattr(desk, "_write_token", interrupted)
    before = live_tokens(api)
    out = api.root / api.unique("interrupted.token")
    document = issue(api, str(out))
    assert document["error"]["message"].endswith(" was revoked") and live_tokens(api) == before
    assert not os.path.lexists(out)


@pytest.mark.parametrize("ledger", ["not a database", "in memory", "down"])
def test_bootstrap_answers_a_ledger_it_cannot_open_as_ito_serve_does(api, tmp_path, ledger) -> None:
    # It was an INTERNAL_ERROR, or (in memory) a token issued into a database gone at exit.
    if ledger == "not a database":
        junk = tmp_path / "junk.sqlite"
        junk.write_bytes(b"no SQLite file" * 100)
        url = f"sqlite:///{junk}"
    else:
        url = "sqlite://" if ledger == "in memory" else "postgresql+psycopg://nobody:pw-canary-8812@127.0.0.1:1/x"
    out = tmp_path / "boot.token"
    with environment({"ITO_LEDGER_URL": url, "ITO_STATE_DIR": str(tmp_path / "state")}):
        document, _status = cli.run(["desk", "bootstrap", "--token-out", str(out), "--json"])
    error = document["error"]
    assert error["code"] == "USAGE_ERROR" and error["message"].startswith("the ledger ITO_LEDGER_URL names"), error
    assert "pw-canary-8812" not in str(document) and not os.path.lexists(out)
