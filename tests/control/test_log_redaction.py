"""A run's log lines as the ledger keeps them: every value assigned to a credential's name hidden,
in the shapes logs carry them (environment and configuration dumps, command flags, HTTP headers,
printed strings, sentences), its name kept; and the text a person debugging a run needs (tokenizer
settings, counts, paths, empty settings) left as it was. Redacting is done when a line is written
and again when it is read, so it must change nothing the second time."""

from __future__ import annotations

import string

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from helpers import examples
from ito_assets.control.telemetry import REDACTED, redact

R = REDACTED
LEAKS = {
    # line -> as the ledger keeps it
    "PGPASSWORD=hunter2": f"PGPASSWORD={R}",
    "env: HOME=/root DB_PASSWORD=hunter2 PATH=/bin": f"env: HOME=/root DB_PASSWORD={R} PATH=/bin",
    "HOME=/root\nPGPASSWORD=correct horse battery\nPATH=/bin": f"HOME=/root\nPGPASSWORD={R}\nPATH=/bin",
    "export DB_PASSWORD=two words here": f"export DB_PASSWORD={R}",
    "PGPASSWORD=Tr0ub4dor&3": f"PGPASSWORD={R}",  # to the end of its word: "&3" is the password's
    "PGPASSWORD=pa,ss;w0rd": f"PGPASSWORD={R}",
    "auth_token=abc==": f"auth_token={R}",
    "PGPASSWORD=Summer2024(!)": f"PGPASSWORD={R}",  # no call: a capital, a sign in its parentheses
    "DB_PASSWORD=$uperS3cret api_key=[abc123] password=<s3cr3t>": f"DB_PASSWORD={R} api_key={R} password={R}",
    "\x1b[33mHF_TOKEN\x1b[0m=abc123def": f"HF_TOKEN={R}",  # a terminal's colours are dropped
    "//registry.npmjs.org/:_authToken=abcdef123456": f"//registry.npmjs.org/:_authToken={R}",
    "_API_KEY = 'abc123def'": f"_API_KEY = {R}",
    "redis://:hunter2@redis:6379/0": R,  # a URL's password without a user
    # A password with a "/" (base64), as SQLAlchemy's connection error prints the URL.
    "could not connect to postgresql://ito:q8Rz/Tn4+Wm2Lk9Xv3Bd@db.internal:5432/ito": f"could not connect to {R}",
    "DB_PASS=hunter2 REDIS_AUTH=s3cr3tpw": f"DB_PASS={R} REDIS_AUTH={R}",
    "password: correct horse battery staple": f"password: {R}",  # alone on its line: to its end
    'HF_TOKEN="abc" python train.py --steps 10': f"HF_TOKEN={R} python train.py --steps 10",
    "password: 'hun'ter2' next": f"password: {R} next",  # a quote inside a word does not end it
    "hf_token=000000": f"hf_token={R}",
    "+ curl -sf -u admin:hunter2 https://x": f"+ curl -sf -u {R} https://x",  # curl's user:password
    "curl --user=admin:hunter2 https://x": f"curl --user={R} https://x",
    "password is: hunter2Xq9": f"password is: {R}",
    "password=my[hunter2Xq9] PGPASSWORD=p(ass)": f"password={R} PGPASSWORD={R}",  # NAME=value is never code
    "mysql --password=hunter2": f"mysql --password={R}",
    "python train.py --hf-token=abc123 --steps 10": f"python train.py --hf-token={R} --steps 10",
    "--db-password hunter2 --host db": f"--db-password {R} --host db",
    'cfg {"api_key": "abc 123", "n": 1}': f'cfg {{"api_key": {R}, "n": 1}}',
    '{"api_key": "abc 123"}; next': f'{{"api_key": {R}}}; next',  # the punctuation after a stand-in stays
    'password: "a\\"b\\"c" end': f"password: {R} end",  # escaped quotes stay inside the value
    "password: 'it is me'": f"password: {R}",
    'os.environ["PGPASSWORD"] = "hunter2"': f'os.environ["PGPASSWORD"] = {R}',
    '{"body": "{\\"password\\": \\"hunter2\\"}"}': f'{{"body": "{{\\"password\\": {R}}}"}}',
    "Authorization: Basic dXNlcjpwYXNz": f"Authorization: Basic {R}",
    "Authorization: Bearer abc": f"Authorization: Bearer {R}",
    "Authorization: token abc": f"Authorization: token {R}",
    "send: b'GET / HTTP/1.1\\r\\nauthorization: Basic dXNlcjpwYXNz\\r\\n'": f"send: b'GET / HTTP/1.1\\r\\nauthorization: Basic {R}",
    "Cookie: session=abc123; csrftoken=xyz789": f"Cookie: {R}",
    "Set-Cookie: sessionid=abc123def; Path=/": f"Set-Cookie: {R}",
    "API Key: abc123def": f"API Key: {R}",
    "the password is hunter2 ok": f"the password is {R} ok",
    "the password is: hunter2": f"the password is: {R}",
    "x=password=abc": f"x=password={R}",
    "password: [s3cret": f"password: {R}",  # a bracket that closes nothing is no stand-in
    "PGPASSWORD=/s3cr3t/x": f"PGPASSWORD={R}",  # a path is shown only for a name of credentials (a file)
    "token abcdefghijklmnop1234": f"token {R}",
    "CalledProcessError: Command '['psql', '--password', 'hunter2', '-h', 'db']' returned non-zero exit status 2.":
        f"CalledProcessError: Command '['psql', '--password', {R}, '-h', 'db']' returned non-zero exit status 2.",
    "<credentials><password>hunter2</password></credentials>": f"<credentials><password>{R}</password></credentials>",
    "+ mysqldump -h db -u root -phunter2 app > dump.sql": f"+ mysqldump -h db -u root -p{R} app > dump.sql",
    "sshpass -p 'hunter 2' scp a b": f"sshpass -p {R} scp a b",
    "redis-cli -h cache -a s3cret ping": f"redis-cli -h cache -a {R} ping",
    "  env:\n  - name: DB_PASSWORD\n    value: hunter2\n  - name: HOME\n    value: /root":
        f"  env:\n  - name: DB_PASSWORD\n    value: {R}\n  - name: HOME\n    value: /root",
    "machine pypi.example.com login ci password hunter2": f"machine pypi.example.com login ci password {R}",
    "callback ok: user=7 session=9f2c81ab0d token=hunter2xyz": f"callback ok: user=7 session={R} token={R}",
}
KEPT = [
    "step 10 loss 2.5 tokens/s 1234",
    "token_budget=512 num_tokens: 4096 tokenizer: gpt2 passwordless=1",
    "{'bos_token': '<s>', 'pad_token': '[PAD]', 'eos_token': '</s>'}",
    "tokenizer.pad_token = tokenizer.eos_token",
    "next_token=' the' last token: 1234 cost per token: 0.3",
    "api_key: None password: null secret: ${DB_SECRET} token: <unset> password: ****",
    "password_file=/run/secrets/db GOOGLE_APPLICATION_CREDENTIALS=/var/secrets/google/key.json",  # paths
    "password = getpass() secret = get_secret(name)",  # code in a traceback's source lines
    "session: 7 auth: ok",
    "the token is invalid or expired; the password is required",
    "TIKTOKEN_CACHE_DIR=/tmp/x",
    "docker exec -u root ito-worker",  # a user without a password
    "token: 50256 sampled token=50256 EOT token = 128009 completion token: 17",
    '{"token": " the", "logprob": -0.1}',
    'token = tokens[i] token = batch["input_ids"][0] password = os.environ.get("DB_PASSWORD")',
    "assert api_key == expected",
    "hub_token=<HUB_TOKEN>",
    "Token is valid",
    f"PGPASSWORD={R}",
    "['psql', '--password', '-h', 'db']",  # a flag that asks for the password
    "<eos_token>&lt;/s&gt;</eos_token>",
    "mysql -h db -u root -p app", "ssh -p2222 worker-1 nvidia-smi",
    "- name: TOKENIZER\n  value: gpt2\n- name: DB_PASSWORD\n  valueFrom: {secretKeyRef: {name: db}}",
    "password required for ci",
    "GET http://127.0.0.1:8765/v1/users/@me 200", "scp ito@node-1:/data/shards/a.parquet .",  # no password
]


@pytest.mark.parametrize("line", LEAKS)
def test_a_value_assigned_to_a_credential_name_is_hidden_its_name_kept(line):
    assert redact(line) == LEAKS[line]


@pytest.mark.parametrize("line", KEPT)
def test_what_names_no_credential_is_left_as_it_was(line):
    assert redact(line) == line


@pytest.mark.parametrize("line", [*LEAKS, *KEPT, "x " * 1980 + "password=ab cd password=ef", "password=a " * 400])
def test_redacting_again_changes_nothing(line):
    # The last two grow past the 4,000 characters a line keeps as their values are hidden.
    assert redact(redact(line)) == redact(line) and len(redact(line)) <= 4000


NAMES = ["PGPASSWORD", "DB_PASSWORD", "hf_token", "api_key", "apiKey", "client_secret", "AWS_SESSION_TOKEN", "passphrase",
         "DB_PASS", "_authToken"]
SHAPES = ["{name}={value}", "export {name}={value}", "--{name}={value}", '"{name}": "{value}"', "{name}: {value}",
          "'{name}' => '{value}'", "{name} := {value}"]


@settings(max_examples=examples(200, 5000), deadline=None)
@given(name=st.sampled_from(NAMES), shape=st.sampled_from(SHAPES),
       value=st.text(alphabet=string.ascii_letters + string.digits + "+/_-.@#%&!", min_size=6, max_size=40),
       before=st.sampled_from(["", "env: ", "run with ", "ERROR "]), after=st.sampled_from(["", " next", "\nHOME=/root"]))
def test_a_random_credential_never_reaches_the_ledger(name, shape, value, before, after):
    assume(value.lower().rstrip(",;.") not in ("none", "null", "true", "false", "unset", "empty"))  # settings, kept
    line = before + shape.format(name=name, value=value) + after
    kept = redact(line)
    assert value not in kept and name in kept and kept.count(REDACTED) >= 1
    assert redact(kept) == kept
