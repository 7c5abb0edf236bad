"""Secret scan of every key and value of a parsed manifest: no raw API key, SSH key, node
password, bearer token or dataset credential may appear in one (it is reviewed, stored, shown).

Findings name the field location and the kind of secret, never the value.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator

# Token formats as published by their issuers (AWS IAM key ids, GitHub token prefixes,
# Hugging Face user tokens, Slack token prefixes, OpenAI, Stripe, Google and GitLab keys) plus
# generic credential carriers. The provider keys after ssh_private_key may follow "_" or "-"
# (ENV_NAME_sk-...), so they are anchored on "no letter or digit before", not on \b.
_NOT_AFTER_ALNUM = r"(?<![A-Za-z0-9])"


class _Jwt:
    """A JWT: header and payload `eyJ...` (base64url of a JSON object) and a signature, joined by
    dots. One regex for it restarts after every "-" of a long run and takes quadratic time; this
    reads each maximal run of base64url characters and dots once, as dot-separated segments."""

    _RUN = re.compile(r"[A-Za-z0-9_.-]+")
    _HEAD = re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\Z")
    _PAYLOAD = re.compile(r"eyJ[A-Za-z0-9_-]{5,}")

    def search(self, value: str) -> bool:
        for run in self._RUN.finditer(value):
            segments = run.group(0).split(".")
            for head, payload, signature in zip(segments, segments[1:], segments[2:]):
                if len(signature) >= 5 and self._PAYLOAD.fullmatch(payload) and self._HEAD.search(head):
                    return True
        return False


class _PortLikePassword:
    """A URL password that starts as a port would, digits then "/", "?" or "#"
    (`postgresql://app:80/Xq3...@db`: base64 passwords begin so about once in 400). On the web a
    port and a path holding "@" are common (`https://host:443/@user`) and the scheme tells them
    apart: a database's, a broker's or any other scheme's URL puts no "@" in its path after a port,
    so there these are passwords. The scheme is read back from the match, at most 32 characters:
    a pattern anchored on it would restart at every letter of a long word."""

    _AFTER_PORT = re.compile(r"://[^/\s:@\[\]]*:\d{1,5}[/?#][^\s@\"'<>,`]{0,256}@")
    _SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,31}\Z")
    _WEB = ("http", "https", "ws", "wss")

    def search(self, value: str) -> bool:
        for match in self._AFTER_PORT.finditer(value):
            scheme = self._SCHEME.search(value, max(0, match.start() - 32), match.start())
            if scheme is None or not scheme.group(0).lower().endswith(self._WEB):  # "see:https://" too
                return True
        return False


_PATTERNS: tuple[tuple[str, "re.Pattern[str] | _Jwt | _PortLikePassword"], ...] = (
    ("aws_access_key_id", re.compile(r"\b(?:AKIA|ASIA|ABIA|ACCA|AIDA|AROA)[0-9A-Z]{16}\b")),
    ("aws_secret_access_key", re.compile(r"(?i)aws.{0,20}?[=:]\s*['\"]?[A-Za-z0-9/+]{40}\b")),
    ("github_token", re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,255}\b")),
    ("github_fine_grained_token", re.compile(r"\bgithub_pat_[A-Za-z0-9_]{22,255}\b")),
    ("hugging_face_token", re.compile(r"\bhf_[A-Za-z0-9]{30,}\b")),
    ("private_key", re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----")),
    ("jwt", _Jwt()),
    ("bearer_token", re.compile(r"(?i)\b(?:bearer|token)\s+[A-Za-z0-9._~+/-]{16,}=*")),
    # Userinfo with a password, or a query parameter named like a credential (?token=, &sig=,
    # X-Amz-Signature=, ?api_key=). Anchored on "://" and on "?&;", never on the scheme: a scheme
    # pattern restarts at every letter of a long word and takes quadratic time.
    # The password may hold "/" (base64 ones often do, and SQLAlchemy and psycopg take it raw); a
    # port and the path after it (host:8080/a@b, host:80?to=a@b) is no password, nor an IPv6
    # literal's colons, nor a quote, bracket or comma (the end of one URL in JSON or a list, and
    # an address after it: "http://h:8000","a@b.org"). At most 256 characters: each "://" is read a
    # bounded length, so a run of them stays linear.
    ("url_credentials", re.compile(
        r"://[^/\s:@\[\]]*:(?!\d{1,5}[/?#])[^\s@\"'<>,`]{1,256}@"
        r"|(?i:[?&;](?:[a-z0-9_.-]*[_.-])?"
        r"(?:token|sig|signature|password|passwd|pwd|secret|credential|auth|api_?key|access_?key|secret_?key)"
        r"=[^&#\s]{4,})")),
    ("url_credentials", _PortLikePassword()),
    # Bot, user, legacy and refresh tokens (xoxb-, xoxp-, xoxe-...) and app-level tokens (xapp-).
    ("slack_token", re.compile(r"\b(?:xox[abposre]|xapp)-[A-Za-z0-9-]{10,}")),
    ("slack_webhook", re.compile(r"hooks\.slack\.com/services/T[A-Za-z0-9_]+/B[A-Za-z0-9_]+/[A-Za-z0-9_]+")),
    ("ssh_private_key", re.compile(r"-----BEGIN OPENSSH PRIVATE KEY-----")),
    # OpenAI: user keys "sk-" and 48 letters or digits; project, service-account and admin keys
    # "sk-proj-", "sk-svcacct-", "sk-admin-" and a longer URL-safe body (no fixed length is
    # published; 40 is well below every issued one).
    ("openai_api_key",
     re.compile(_NOT_AFTER_ALNUM + r"sk-(?:[A-Za-z0-9]{48}|(?:proj|svcacct|admin)-[A-Za-z0-9_-]{40,})")),
    # Stripe secret and restricted keys, live and test (publishable pk_ keys are public by design);
    # Stripe's security team gave secret scanners bodies of 10 to 128 letters and digits.
    ("stripe_api_key", re.compile(_NOT_AFTER_ALNUM + r"[sr]k_(?:live|test)_[A-Za-z0-9]{10,}")),
    # Google API keys: "AIza" and 35 URL-safe characters, 39 in all.
    ("google_api_key", re.compile(_NOT_AFTER_ALNUM + r"AIza[A-Za-z0-9_-]{35}")),
    # GitLab personal access tokens: "glpat-" and at least 20 URL-safe characters (newer,
    # routable tokens are longer and continue with ".01." and more).
    ("gitlab_token", re.compile(_NOT_AFTER_ALNUM + r"glpat-[A-Za-z0-9_-]{20,}")),
    # This API's own identity tokens (control/ids.TOKEN), wherever they stand: a key or a log line
    # that contains one holds it (k.ito_acct_...).
    # A name that merely holds the prefix (ito_acct_usage_by_region...) has no capital or digit in
    # its 43 characters, which a random token has but once in 10^16.
    ("ito_token", re.compile(_NOT_AFTER_ALNUM + r"ito_(?:desk|acct)_(?=[A-Za-z0-9_-]{0,42}[A-Z0-9])[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])")),
)

# Key names that carry credentials. Matched on whole words of the key (snake, kebab or camel
# case), so `num_tokens` or `tokenizer` are not flagged but `hf_token` and `apiKey` are.
_SECRET_WORDS = frozenset(
    {"password", "passwd", "pwd", "secret", "secrets", "credential", "credentials", "apikey",
     "token", "authorization", "auth", "privatekey", "passphrase", "cookie", "session"}
)
_SECRET_PAIRS = frozenset(
    {("api", "key"), ("access", "key"), ("secret", "key"), ("private", "key"), ("client", "secret"),
     ("auth", "token"), ("access", "token"), ("refresh", "token"), ("ssh", "key"), ("bearer", "token")}
)

# Generic high-entropy strings: long, mixed-class tokens. 4.2 bits/char sits above English
# words and lowercase hex (at most 4.0) and below random base64 (about 5-6 at these lengths).
_CANDIDATE = re.compile(r"[A-Za-z0-9+/_=-]{32,}")
_ENTROPY_BITS = 4.2
# A URI is judged per "/"-separated segment: mixed-case directory names with digits, joined into
# one run, reach a token's entropy although no segment is one (dataroot://Corpora/Stdlib2026/...).
# A bare base64 token keeps its "/" (it has no scheme), so it is still judged whole.
# Only the part from "://" on holds slashes; matching the scheme too would restart at every letter.
_URI = re.compile(r"://\S*")


@dataclass(frozen=True)
class SecretFinding:
    location: str  # e.g. "data[0].uri" or "model.<key>"; never the value
    kind: str


def _key_words(key: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", key)
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if w]


# Words that end an upper-case name glued together (PGPASSWORD; MYSQL_PWD is split by "_"
# already): no case change or separator splits it, so the word is found as its ending. Not
# "token": tiktoken, subtoken and detokenizer name no credential.
_GLUED_ENDINGS = ("password", "passwd", "passphrase", "secret", "apikey")


def _ends_a_credential_name(words: list[str], end: int, secret_words: frozenset[str] = _SECRET_WORDS) -> bool:
    """Whether `words[:end]` ends with the name of a credential."""
    last = words[end - 1]
    return (last in secret_words or last.endswith(_GLUED_ENDINGS)
            or (end > 1 and (words[end - 2], last) in _SECRET_PAIRS))


def key_looks_secret(key: str) -> bool:
    """A key of a structured document that names a credential anywhere in it (`hf_token`,
    `db_password_file`): refused there, where no field needs such a name."""
    words = _key_words(key)
    return any(_ends_a_credential_name(words, end) for end in range(1, len(words) + 1))


def is_credential_word(key: str) -> bool:
    """A key that is only a credential's common name, as it is spelled (`password`, `apiKey`,
    `API_KEY`, `access-token`): a word of the language, not the caller's text, which a message may
    show."""
    return key.lower() in _CREDENTIAL_SPELLINGS


_CREDENTIAL_SPELLINGS = frozenset(
    {*_SECRET_WORDS, *(f"{a}{joint}{b}" for a, b in _SECRET_PAIRS for joint in ("", "_", "-"))})

REDACTED = "[REDACTED]"  # what a hidden value reads as (the ledger's run logs)

# A credential handed over in text: an environment or configuration dump (PGPASSWORD=..., "api_key":
# "...", token: ...), a command's flag (--password=..., --hf-token ..., or '--password', '...' in
# a printed argument list, as a failed command's error shows it) or a sentence ("the password is
# ..."). The name is judged by its last words (`token_budget=512` names a budget, `password_file=`
# a path, `pad_token` a tokenizer's), the value is what is hidden, to the end of its word (or of its
# quotes; to the end of its line for a cookie header, or a name that starts its line). A name starts
# only where a run of name characters starts, and the regex never reads a value: after a name, the
# search goes on after its value, so each character is read a bounded number of times.
_NAMED = re.compile(
    r"(?m)(?<![A-Za-z0-9_.-])(?:--?(?P<option>_*[A-Za-z][A-Za-z0-9_.-]*)(?:=(?!=)|[ \t]+(?![-\s])|(?P<listed>[\"'],[ \t]*b?(?=[\"'](?!-))))"
    r"|(?P<line>^[ \t]*(?:export[ \t]+)?)?(?P<name>(?:[A-Za-z]+ )?_*[A-Za-z][A-Za-z0-9_.-]*)(?:\\?[\"'])?\]?"
    r"(?P<sep>[ \t]*(?::=|=>|:|=(?!=))[ \t]*|(?P<prose>[ \t]+is:?[ \t]+)))")
# In text these alone name a setting or a text's token as often as a credential (auth: ok,
# session: 7, token: 50256); an environment variable's name in capitals ending in "auth" or
# "pass" names one (REDIS_AUTH, DB_PASS).
_TEXT_SECRET_WORDS = _SECRET_WORDS - {"auth", "session", "token"}
_ENV_SECRET_WORDS = frozenset({"auth", "pass"})
# Before those two, these make the name a switch or a count: FIRST_PASS, TWO_PASS, SKIP_PASS.
_SWITCH_WORDS = frozenset({"first", "second", "third", "last", "next", "prev", "one", "two", "three", "single", "multi",
                           "double", "each", "every", "num", "per", "forward", "backward", "skip", "no", "use", "with",
                           "without", "enable", "disable", "allow", "require", "force"})
# Before "token", these name a tokenizer's, a sample's or a count's token (pad_token, next_token).
_VOCABULARY_TOKENS = frozenset({"bos", "eos", "eot", "pad", "unk", "sep", "cls", "mask", "lf", "special", "next", "last",
                                "first", "prev", "start", "end", "stop", "new", "max", "min", "num", "per", "the", "a",
                                "input", "output", "prompt", "completion", "generated", "sampled", "bpe", "eval"})
_SCHEME = re.compile(r"\[?(?i:basic|bearer|digest|token)[ \t]+")
# A quoted value; one opened by an escaped quote (a string printed inside a string) ends at the
# next escaped quote, so no value reads past it to a quote far away.
_QUOTED = re.compile(r"\\([\"'])(?:(?!\\\1)[^\n])*(?:\\\1)?|([\"'])(?:\\.|(?!\2)[^\\\n])*\2?")
_WORD_VALUE = re.compile(r"\S+")
_LINE_VALUE = re.compile(r"[^\r\n]+")
_BOUNDARY = " \t\r\n,;)}]"
# A value that is no credential: a stand-in for one (no digit in it: <pad>, [PAD], ${DB_SECRET}) or an
# empty setting; and where it is not literal (`NAME = value`, spaced, as source code reads), code
# that calls or indexes (tokens[i], getpass(), os.environ.get(name)); never a dotted name alone,
# which a password may be. Each part is a run without a choice of where to end, so a failed match
# is quick.
_STAND_IN = re.compile(
    r"(?:\[[A-Za-z_|-]*\]|</?[A-Za-z_|-]*>|\$\{\w+\}|\$[A-Z_][A-Z0-9_]*|\*+|(?i:none|null|nil|true|false|unset|empty))[,;]?")
_CODE = re.compile(r"_*[a-z][a-z0-9_]*(?:\._*[a-z][a-z0-9_]*)*(?:\[[^\]\s]*\]|\((?:[A-Za-z_\"'][^()\s]*)?\))+[,;]?")
# A path: what a name ending in "credentials" holds by convention (GOOGLE_APPLICATION_CREDENTIALS).
_PATH = re.compile(r"[.~]?/[\w.-]+/\S*")
# What a sentence says after a credential's name that is no credential (judged where a value is
# prose: after "is", and in a document's values): a plain word, a number with its unit, n/a.
_PROSE_VALUE = re.compile(r"[A-Za-z][a-z]*[.!?,;]?|[-+]?\d[\d,.]*[A-Za-z%]{0,3}[.,;]?|(?i:n/a)[.,;]?")


def _credential_name(name: str) -> bool:
    words = _key_words(name)
    if not words:
        return False
    if words[-1] in _ENV_SECRET_WORDS and name.lstrip("_").isupper():
        return len(words) == 1 or words[-2] not in _SWITCH_WORDS
    if not _ends_a_credential_name(words, len(words), _TEXT_SECRET_WORDS):
        return words[-1] == "token" and len(words) > 1 and words[-2] not in _VOCABULARY_TOKENS
    return True


def env_name_looks_secret(name: str) -> bool:
    """An environment variable's name that names a credential: by any of its words, as a document's
    key is judged (`HF_TOKEN`, `DB_PASSWORD_FILE`), or by its ending, as a name in text is (`DB_PASS`,
    `REDIS_AUTH`)."""
    return key_looks_secret(name) or _credential_name(name)


def _value_span(text: str, start: int, name: str, *, to_line_end: bool, prose: bool,
                literal: bool) -> tuple[int, int] | None:
    """Where the value assigned to `name` lies from `start` on, or None where it is no credential.
    `to_line_end`: the value runs to the end of its line (a cookie header's pairs, a name that
    starts its line, whose value may hold spaces); `prose`: a plain word or a number is prose;
    `literal`: a dump's or a command's value (`NAME=value`, a flag), never code."""
    if scheme := _SCHEME.match(text, start):
        start = scheme.end()
    if start >= len(text) or text[start] in "\r\n" or text.startswith(REDACTED, start):
        return None
    quoted = _QUOTED.match(text, start)
    word = _WORD_VALUE.match(text, start)
    if _key_words(name)[-1] == "cookie" or (to_line_end and not quoted):
        value = _LINE_VALUE.match(text, start)
    elif quoted and (quoted.end() >= len(text) or text[quoted.end()] in _BOUNDARY):
        value = quoted
    else:
        value = word  # a quote inside a word ('hun'ter2') does not end it
    inner = value.group(0).strip("\\\"'")
    if (not inner or _STAND_IN.fullmatch(inner) or (not literal and _CODE.fullmatch(inner))
            or (prose and _PROSE_VALUE.fullmatch(inner))
            or (_key_words(name)[-1].startswith("credential") and _PATH.fullmatch(inner))):
        return None
    return value.span()


def _credential_in(text: str, match: re.Match) -> str | None:
    """The credential's name a match of `_NAMED` holds, or None: the whole name (`API Key`), else
    its last word (`with DB_PASS`), else the name after an escape printed as two characters
    ("\\nauthorization: ...")."""
    if option := match.group("option"):
        # --no-password and its kind say a credential is not used: they take no value.
        return option if _credential_name(option) and not option.lower().startswith(("no-", "no_")) else None
    name, start = match.group("name"), match.start("name")
    first, _, last = name.partition(" ")
    candidates = [name, last or first] + ([first] if last == "is" else [])  # "password is: ..."
    if start > 0 and text[start - 1] == "\\" and name[0] in "nrt":
        candidates.append(name[1:])
    return next((candidate for candidate in candidates if _credential_name(candidate)), None)


_USER_OPTIONS = ("u", "user")

# Every name `_credential_name` accepts holds one of these (the glued endings and the pairs
# included), or it is curl's user option.
_CREDENTIAL_HINT = re.compile(r"(?i)pass|pwd|secret|credential|token|auth|key|cookie|session|(?<!\S)--?u(?:ser)?[ \t=]"
                              r"|mysql|mariadb|redis-cli")


# An XML element named like a credential (<password>...</password>, <wsse:Password Type="...">...,
# as a configuration file or a SOAP body shows it): a namespace prefix and attributes allowed, its
# text on one line; each part runs to the next "<" or ">", so each character is read a bounded
# number of times.
_ELEMENT = re.compile(r"<(?P<tag>(?:[A-Za-z_][\w.-]*:)?(?P<name>_*[A-Za-z][\w.-]*))(?:[ \t][^<>\n]*)?>"
                      r"(?P<value>[^<\n]+)</(?P=tag)>")


def _element_values(text: str, *, prose: bool) -> list[tuple[int, int]]:
    """The text of each element named like a credential; in a document's sentence (`prose`), not
    a plain word or number ("The <secret>ingredient</secret> is love")."""
    spans = []
    for match in _ELEMENT.finditer(text):
        value = match.group("value").strip()
        if (_credential_name(match.group("name")) and not _STAND_IN.fullmatch(value)
                and not (prose and _PROSE_VALUE.fullmatch(value))):
            spans.append(match.span("value"))
    return spans


# A password as a command's short option, where the command is known to take one there: mysql's
# and mariadb's tools glue it (-pPASS; a spaced -p asks for it and the next word is the database),
# sshpass takes -p PASS and redis-cli -a PASS, glued or spaced. The command runs to the end of its
# line, and the next search starts there, so each character is read a bounded number of times.
_PASSWORD_COMMAND = re.compile(r"(?<![\w.-])(?P<command>mysql(?:dump|admin|import|show|check|pump|sh)?"
                               r"|mariadb(?:-dump|-admin)?|sshpass|redis-cli)(?![\w.-])[^\n]*")
_PASSWORD_OPTION = {"sshpass": ("p", True), "redis-cli": ("a", True)}  # the rest: ("p", glued only)
_SHORT_OPTION = re.compile(r"(?<![^\s'\"\[,(])-(?P<letter>[a-z])(?P<glued>[^\s'\"]*)")
_NEXT_ARGUMENT = re.compile(r"[\"']?(?:,[ \t]*b?)?[ \t]*")


_ARGUMENT = re.compile(r"[^\s,]+")  # a word of a command line, or of a printed argument list


def _own_options_end(text: str, start: int, end: int) -> int:
    """Where sshpass's own options end: at the command it runs (its first word that is neither an
    option nor an option's value), whose options (ssh's -p PORT) are not sshpass's."""
    takes_value = False
    for argument in _ARGUMENT.finditer(text, start, end):
        word = argument.group().strip("[]'\"").removeprefix("b'")
        if not word:
            continue  # a quote that closes the command's own name in a printed list
        if takes_value:
            takes_value = False
        elif word in ("-p", "-f", "-d"):
            takes_value = True
        elif not word.startswith("-"):
            return argument.start()
    return end


def _option_passwords(text: str) -> list[tuple[int, int]]:
    spans = []
    for line in _PASSWORD_COMMAND.finditer(text):
        letter, spaced = _PASSWORD_OPTION.get(line.group("command"), ("p", False))
        position, end = line.end("command"), line.end()
        if line.group("command") == "sshpass":
            end = _own_options_end(text, position, end)
        while option := _SHORT_OPTION.search(text, position, end):
            position = option.end()  # past the option, and below past its value: each read once
            if option.group("letter") != letter:
                continue
            if option.group("glued"):
                if not text.startswith(REDACTED, option.start("glued")):
                    spans.append(option.span("glued"))
            elif spaced and (span := _value_span(text, _NEXT_ARGUMENT.match(text, option.end()).end(), "password",
                                                 to_line_end=False, prose=False, literal=True)):
                spans.append(span)
                position = max(position, span[1])
    return spans


# A container's environment as Kubernetes, ECS or docker list it: a name, then its value
# (`- name: DB_PASSWORD` and `value: ...` on the next line, or `{"name": "DB_PASSWORD", "value":
# "..."}`); a value taken from a secret (valueFrom) holds no credential itself.
_ENV_ENTRY = re.compile(r"(?P<q>[\"']?)\bname(?P=q)[ \t]*:[ \t]*(?P<nq>[\"']?)(?P<env>[A-Za-z_][\w.-]*)(?P=nq)"
                        r"[ \t]*(?:,[ \t]*)?(?:\r?\n[ \t]*)?(?P<vq>[\"']?)value(?P=vq)[ \t]*:[ \t]*")


def _env_entry_values(text: str) -> list[tuple[int, int]]:
    spans, position = [], 0
    while entry := _ENV_ENTRY.search(text, position):
        position = entry.end()
        if _credential_name(entry.group("env")) and (
                span := _value_span(text, entry.end(), entry.group("env"), to_line_end=False, prose=False,
                                    literal=True)):
            spans.append(span)
            position = span[1]  # the next entry starts past this value: each value read once
    return spans


# A .netrc: `machine HOST [login USER] [account A] password PASS` on one line, or `password PASS`
# as a line of its own under its machine (judged as prose there: "password required" is a sentence).
_NETRC_ENTRY = re.compile(r"(?m)(?:(?<![^\s])machine[ \t]+\S+|(?<![^\s])default)[ \t]+"
                          r"(?:(?:login|account)[ \t]+(?!(?:machine|default|login|account|password)(?!\S))\S+[ \t]+)*"
                          r"password[ \t]+(?=[^\s=:])"
                          r"|^[ \t]*password[ \t]+(?=[^\s=:]\S*[ \t]*\r?$)")


def _netrc_passwords(text: str) -> list[tuple[int, int]]:
    spans = []
    for entry in _NETRC_ENTRY.finditer(text):
        own_line = entry.group(0).lstrip().startswith("password")
        if span := _value_span(text, entry.end(), "password", to_line_end=False, prose=own_line, literal=not own_line):
            spans.append(span)
    return spans


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`spans` in order, overlapping ones joined (an element's text may hold an assignment)."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def assigned_credentials(text: str, *, prose: bool = False) -> list[tuple[int, int]]:
    """The (start, end) spans of the values that `text` assigns to a credential's name. `prose`:
    `text` is a document's value, where a plain word or a number after the name is the sentence's
    (`Secrets: 0 found`), not the credential a log or a dump would hold (`PGPASSWORD=hunter`)."""
    if not _CREDENTIAL_HINT.search(text):
        return []  # most text: no name of a credential, nothing to read pair by pair
    spans = []
    position = 0
    while match := _NAMED.search(text, position):
        if match.group("option") in _USER_OPTIONS:  # curl's -u and --user user:password
            value = _WORD_VALUE.match(text, match.end())
            if value is None or ":" not in value.group(0):
                position = value.end() if value else match.end()  # a user name alone: read once
                continue
            name = match.group("option")
        else:
            name = _credential_in(text, match)
        literal = match.group("option") is not None or match.group("sep") in ("=", ":=", "=>")
        named = match.group("option") or match.group("name")
        mixed_only = name is None and literal and _a_setting_or_a_credential(named)
        if mixed_only:
            name = named
        if name is None:
            position = match.end()
            continue
        # NAME=value (no space, or a flag) is a dump's or a command's: its value is literal. After
        # ": " or "is" in a document's sentence, a plain word or a number is the sentence's.
        on_its_line = (match.group("line") is not None and " " not in name and not prose
                       and not _ANOTHER_NAME.search(text, match.end(), _line_end(text, match.end())))
        span = _value_span(text, match.end(), name, to_line_end=on_its_line,
                           prose=(prose and not literal) or bool(match.group("prose")), literal=literal)
        if span and mixed_only and not _mixes_letters_and_digits(text[span[0]:span[1]]):
            span = None
        if span:
            spans.append(span)
        # Past the value, hidden or not: a value is read once (a stand-in's text may hold names).
        position = span[1] if span else max(match.end(), _skip_value(text, match.end()))
    return _merged(spans + _element_values(text, prose=prose) + _option_passwords(text)
                   + _env_entry_values(text) + _netrc_passwords(text))


def _a_setting_or_a_credential(name: str) -> bool:
    """"token", "auth" or "session" alone (token=50256, auth=ok, session=7 name a text's token or
    a setting): a credential only as NAME=value or a flag's value that mixes letters and digits
    (token=abc123, --token abc123, session=9f2c...); --no-token takes no value."""
    words = _key_words(name)
    return bool(words) and words[0] != "no" and words[-1] in _SECRET_WORDS - _TEXT_SECRET_WORDS and (
        len(words) == 1 or words[-2] not in _VOCABULARY_TOKENS)


def _mixes_letters_and_digits(value: str) -> bool:
    return re.search(r"[A-Za-z]", value) is not None and re.search(r"\d", value) is not None


# Another name assigned to later on the line: the value before it is one word (api_key: None password: ...).
_ANOTHER_NAME = re.compile(r"(?<![\w.-])[A-Za-z_][\w.-]*[ \t]*(?::|=(?!=))")  # from a word's start only


def _line_end(text: str, start: int) -> int:
    end = text.find("\n", start)
    return len(text) if end < 0 else end


def _skip_value(text: str, start: int) -> int:
    value = _WORD_VALUE.match(text, start)
    return value.end() if value else start


def _entropy(token: str) -> float:
    counts = Counter(token)
    return -sum(c / len(token) * math.log2(c / len(token)) for c in counts.values())


def _high_entropy(value: str) -> bool:
    value = _URI.sub(lambda uri: uri.group(0).replace("/", " "), value)
    for match in _CANDIDATE.finditer(value):
        token = match.group(0)
        mixed = any(c.islower() for c in token) and any(c.isupper() for c in token) and any(
            c.isdigit() for c in token
        )
        if mixed and _entropy(token) >= _ENTROPY_BITS:
            return True
    return False


def pattern_secret_kind(value: str) -> str | None:
    """The kind of the first known credential format found in `value` (no entropy rule): for
    values meant to be random, such as idempotency keys, where high entropy is no evidence."""
    for kind, pattern in _PATTERNS:
        if pattern.search(value):
            return kind
    return None


def value_secret_kind(value: str) -> str | None:
    kind = pattern_secret_kind(value)
    if kind is not None:
        return kind
    if assigned_credentials(value, prose=True):
        return "assigned_credential"
    return "high_entropy_string" if _high_entropy(value) else None


def _walk(value: Any, path: tuple) -> Iterator[tuple[tuple, Any]]:
    yield path, value
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _walk(child, path + (key,))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _walk(child, path + (index,))


# A key name shown in a message: printable ASCII without spaces and short. Anything else (a
# newline that forges a log line, a terminal escape, a bidi override, a 100 KB name) is `<key>`.
_SHOWABLE_KEY = re.compile(r"[\x21-\x7e]{1,64}")


def shown_key(key: str) -> str:
    """`key` as an error message may show it: itself, or `<key>` when it looks like a secret or
    could disguise or flood the message."""
    if not _SHOWABLE_KEY.fullmatch(key) or value_secret_kind(key):
        return "<key>"
    return key


def _location(path: tuple, shown: Callable[[str], str]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{shown(part)}"
    return out.lstrip(".") or "<root>"


def scan(document: Any, *, is_exempt: Callable[[tuple, str], bool] = lambda p, v: False,
         shown: Callable[[str], str] = shown_key) -> list[SecretFinding]:
    """Every secret-looking key or value in `document`; `is_exempt(path, value)` spares values the
    schema validates as digests; `shown(key)` is a key as a location shows it (a schema shows its
    own words only)."""
    findings: list[SecretFinding] = []
    for path, value in _walk(document, ()):
        if path and isinstance(path[-1], str):
            kind = value_secret_kind(path[-1]) or ("credential_key_name" if key_looks_secret(path[-1]) else None)
            if kind:
                findings.append(SecretFinding(_location(path, shown), kind))
        if isinstance(value, str) and not is_exempt(path, value):
            kind = value_secret_kind(value)
            if kind:
                findings.append(SecretFinding(_location(path, shown), kind))
    return findings
