#!/usr/bin/env python3
"""Regenerate every file under data/fixtures/ except README.md (see that README for provenance) and
the post-training pairs (scripts/make_posttraining_fixtures.py writes those; the manifests here
bind their sha256, so run that script first).

Stdlib only, seeded, no network: `python3 scripts/make_fixtures.py`. Two corpora are cut from the
running interpreter's own docstrings and pydoc topics, so the bytes depend on the Python version;
the committed files (and the sha256 in the manifests) are the reference, not a fresh run elsewhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
import io
import json
import random
import re
import sys
import warnings
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "data" / "fixtures"
SEED = 20240613
NGRAM = 13  # the manifests' decontamination n-gram size; the self-check below uses the same
SUITE_ID = "ito-fixture-evals-v1"

# A fixed list (not sys.stdlib_module_names) so that the walk does not change with what happens
# to be installed. Left out on purpose: this/antigravity (print or open a browser on import),
# idlelib/tkinter/turtle* (GUI), *.__main__ (runs things), deprecated modules (warn, then vanish).
STDLIB_MODULES = sorted(set("""
_collections_abc _markupbase _pydecimal _pyio _strptime _threading_local abc argparse array ast asyncio
asyncio.base_events asyncio.unix_events atexit base64 bdb binascii bisect builtins bz2
cProfile calendar cmath cmd code codecs codeop collections collections.abc colorsys compileall
concurrent.futures concurrent.futures._base concurrent.futures.process concurrent.futures.thread
configparser contextlib contextvars copy copyreg csv ctypes curses.ascii dataclasses datetime dbm
decimal difflib dis doctest email._header_value_parser email._parseaddr email._policybase
email.base64mime email.charset
email.contentmanager email.encoders email.feedparser email.generator email.header
email.headerregistry email.iterators email.message email.mime.base email.mime.multipart
email.mime.text email.parser email.policy email.quoprimime email.utils encodings.cp1252 encodings.idna
encodings.latin_1 encodings.punycode encodings.utf_8 enum errno faulthandler fcntl filecmp fileinput
fnmatch fractions ftplib functools gc genericpath getopt getpass gettext glob graphlib grp gzip
hashlib heapq hmac html html.entities html.parser http.client http.cookiejar http.cookies
http.server imaplib importlib importlib._bootstrap_external importlib.abc importlib.machinery importlib.metadata
importlib.resources importlib.util inspect io ipaddress itertools json json.decoder json.encoder
keyword linecache locale logging logging.config logging.handlers lzma mailbox marshal math
mimetypes mmap multiprocessing multiprocessing.connection multiprocessing.managers
multiprocessing.pool multiprocessing.queues multiprocessing.shared_memory
multiprocessing.synchronize netrc ntpath numbers operator optparse os pathlib pdb pickle
pickletools pkgutil platform plistlib poplib posixpath pprint profile pstats pty pwd
py_compile pyclbr pydoc queue quopri random re reprlib resource runpy sched secrets selectors
shelve shlex shutil signal smtplib socket socketserver sqlite3 ssl stat statistics string
stringprep struct subprocess symtable sys sysconfig tabnanny tarfile tempfile termios textwrap
threading time timeit token tokenize tomllib tomllib._parser trace traceback tracemalloc tty types typing
unicodedata unittest unittest.mock urllib.error urllib.parse urllib.request urllib.response
urllib.robotparser uuid warnings wave weakref wsgiref.handlers wsgiref.headers wsgiref.simple_server
wsgiref.util wsgiref.validate xml.dom.expatbuilder xml.dom.minidom xml.dom.pulldom xml.etree.ElementInclude xml.etree.ElementTree xml.parsers.expat
xml.sax xml.sax.handler xml.sax.saxutils xml.sax.xmlreader xmlrpc.client xmlrpc.server zipapp
zipfile zipimport zlib zoneinfo
""".split()))


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def sha256_hex(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def unique_id(seen: dict[str, int], base: str) -> str:
    seen[base] = seen.get(base, 0) + 1
    return base if seen[base] == 1 else f"{base}#{seen[base]}"


# --- corpus 1: stdlib docstrings ------------------------------------------------------------

def _documented(mod_name: str, mod) -> list[tuple[str, object]]:
    """Module, its public classes/functions, and their own methods, in sorted-name order.

    A member counts if the module defines it or lists it in __all__ (posixpath re-exports
    genericpath, asyncio its submodules): those re-exports are the natural exact duplicates we
    want. Incidental imports (doctest's copy of namedtuple) are skipped. inspect.getdoc falls
    back to the inherited docstring, which yields the natural near/exact copies between classes.
    """
    out: list[tuple[str, object]] = [("__doc__", mod)]
    public = set(getattr(mod, "__all__", ()))
    for name, obj in sorted(vars(mod).items()):
        if name.startswith("_") or (name not in public and getattr(obj, "__module__", None) != mod_name):
            continue
        if inspect.isclass(obj):
            out.append((name, obj))
            for attr, member in sorted(vars(obj).items()):
                if not attr.startswith("_") and (inspect.isroutine(member) or
                                                 isinstance(member, (property, classmethod, staticmethod))):
                    out.append((f"{name}.{attr}", member))
        elif inspect.isroutine(obj):
            out.append((name, obj))
    return out


def stdlib_docstrings() -> list[dict]:
    rows, seen = [], {}
    for mod_name in STDLIB_MODULES:
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                mod = importlib.import_module(mod_name)
        except Exception:  # platform-specific modules (fcntl, termios, pwd, ...) may be absent
            continue
        for qual, obj in _documented(mod_name, mod):
            try:
                doc = (inspect.getdoc(obj) or "").strip()
            except Exception:
                continue
            if len(doc) >= 200:
                rows.append({"id": unique_id(seen, f"{mod_name}.{qual}"), "text": doc})
    return rows


# --- corpus 2: pydoc topics (the language reference) ------------------------------------------

def _split_long(para: str, limit: int) -> list[str]:
    """Cut an over-long paragraph at line boundaries so no document exceeds `limit` chars."""
    pieces, cur = [], ""
    for line in para.split("\n"):
        if cur and len(cur) + 1 + len(line) > limit:
            pieces.append(cur)
            cur = ""
        cur = f"{cur}\n{line}" if cur else line
    return pieces + [cur] if cur else pieces


def pydoc_topics(target: int = 600, limit: int = 3000, floor: int = 300) -> list[dict]:
    from pydoc_data.topics import topics
    rows = []
    for topic in sorted(topics):
        paras = [p.strip("\n") for p in re.split(r"\n\s*\n", topics[topic]) if p.strip()]
        chunks, cur = [], ""
        for para in (piece for p in paras for piece in _split_long(p, limit)):
            if cur and len(cur) + 2 + len(para) > limit:
                chunks.append(cur)
                cur = ""
            cur = f"{cur}\n\n{para}" if cur else para
            if len(cur) >= target:
                chunks.append(cur)
                cur = ""
        if cur:  # a short tail joins the previous chunk when it fits, so few docs fall under `floor`
            if chunks and (len(cur) < floor) and len(chunks[-1]) + 2 + len(cur) <= limit:
                chunks[-1] += "\n\n" + cur
            else:
                chunks.append(cur)
        rows += [{"id": f"pydoc/{topic}/{n}", "text": c} for n, c in enumerate(chunks)]
    return rows


# --- the eval suite (written here, CC0-1.0) ---------------------------------------------------

PY_TRIVIA = [
    ("In CPython, what value does a function hand back to its caller when its body finishes without executing any return statement?", "None"),
    ("Which built-in exception is raised when you look up a key in a dictionary that does not contain that key?", "KeyError"),
    ("When a default argument value is a mutable list, how many times is that list object created across repeated calls of the function?", "Once, when the def statement runs; every call that relies on the default shares the same list."),
    ("What is the type of the result when you divide two integers with a single slash operator in Python three?", "float, because / always performs true division"),
    ("Which keyword lets a nested function rebind a variable that belongs to the enclosing function instead of creating a new local name?", "nonlocal"),
    ("If a class defines __eq__ but not __hash__, what happens when you try to add one of its instances to a set?", "A TypeError, because defining __eq__ alone sets __hash__ to None and makes instances unhashable."),
    ("In which order does Python search scopes when a function body refers to a variable name it never assigned itself?", "Local, then enclosing functions, then the module globals, then builtins (the LEGB rule)."),
    ("What does an else clause attached to a for loop do, and in which situation is that clause skipped?", "It runs when the loop finishes normally and is skipped when the loop is left through break."),
    ("Why does comparing the sum of the floats 0.1 and 0.2 against 0.3 with double equals give False in Python?", "Binary floating point cannot represent those decimals exactly, so the sum is off by a tiny rounding error."),
    ("Which special method does Python call to obtain an iterator when an object is used as the iterable of a for statement?", "__iter__"),
    ("What happens to the name bound by an except clause, as in except ValueError as err, once that block has finished?", "It is deleted at the end of the block, to avoid a reference cycle through the traceback."),
    ("How does the is operator differ from the double equals operator when you compare two objects in Python code?", "is tests object identity, while == tests equality through __eq__."),
    ("What does slicing a list with a step of minus one, written as items[::-1], give back to the caller?", "A new list holding the same elements in reverse order."),
    ("Which built-in function produces pairs made of a running index and the current element while you iterate over a sequence?", "enumerate"),
    ("When a generator function is called, what does that call return before any line of the function body has run?", "A generator object; the body starts running at the first next() call."),
    ("Which standard library module provides the decorator that memoizes the results of a function keyed by its arguments?", "functools, through lru_cache or cache"),
    ("What is the difference between a shallow copy and a deep copy of a list whose elements are themselves lists?", "A shallow copy shares the inner lists; a deep copy recursively copies them as well."),
    ("What does the walrus operator, written as a colon followed by an equals sign, do when it appears inside an expression?", "It assigns the value to a name and also yields that value as the result of the expression."),
    ("In a try statement that has both except and finally clauses, under what circumstances does the finally block run?", "Always, on the way out of the try statement, whether or not an exception was raised."),
    ("Which built-in type is the base class of bool, which is why True and False can take part in ordinary arithmetic?", "int"),
    ("What does the global interpreter lock in CPython stop several threads of the same process from doing at the same time?", "Executing Python bytecode in parallel."),
    ("Which marker in a function signature forces every parameter that follows it to be passed by keyword rather than by position?", "A bare asterisk (*) in the parameter list."),
    ("Which marker, added in Python 3.8, makes all the parameters written before it positional-only in a function definition?", "A slash (/) in the parameter list."),
    ("What exception does the built-in next raise when it is called on an exhausted iterator and no default value is supplied?", "StopIteration"),
    ("In Python 3.7 and every later version of the language, in what order does iterating over a dict produce its keys?", "In insertion order."),
    ("Why is it usually recommended to test whether a value is None with the is operator rather than with double equals?", "None is a singleton, and is cannot be fooled by a class that overrides __eq__."),
    ("What does the with statement guarantee about the __exit__ method of its context manager when the block raises an exception?", "__exit__ is still called, with the exception details, before the exception propagates (unless __exit__ suppresses it)."),
    ("Which built-in decorator turns a method into a read-only attribute whose value is computed every time it is accessed?", "property"),
    ("What is the main purpose of declaring __slots__ in a class body, and what does an instance lose as a result?", "It fixes the allowed attribute names and saves memory; instances no longer get a per-instance __dict__."),
    ("What happens when you append to a list that is stored inside a tuple, for example with t[0].append(1)?", "It works: the tuple keeps referring to the same list, which is mutated in place."),
    ("How many arguments does the built-in range accept at most, and what does the third of those arguments control?", "Three; the third is the step between successive values."),
    ("What does a single star placed in front of a list do when it appears in a function call such as f(*args)?", "It unpacks the list into separate positional arguments."),
    ("What does the get method of a dictionary return when the requested key is missing and no default value has been provided?", "None"),
    ("Which special method must a class define so that its instances can be called like a function, as in obj()?", "__call__"),
    ("What does the guard if __name__ == '__main__' at the bottom of a module prevent from happening on import?", "It keeps the guarded code from running when the module is imported instead of executed as a script."),
    ("Which built-in function tells you whether an object is an instance of a given class or of any of its subclasses?", "isinstance"),
    ("What kind of object does a lambda expression produce, and what is its body restricted to compared with a def statement?", "A function object; its body must be a single expression, so no statements such as assignments."),
    ("How does Python treat an empty list, an empty string and the number zero when each is used as the condition of an if statement?", "All three are false; empty containers and zero are falsy."),
    ("Which string method splits the string on runs of whitespace and drops empty pieces when it is called without arguments?", "str.split"),
    ("What does the join method of a string expect as its argument, and what does it put between the joined items?", "An iterable of strings; it inserts the string it was called on between consecutive items."),
    ("Why can a list not serve as a dictionary key while a tuple made only of integers can be used as one?", "Lists are mutable and therefore unhashable; a tuple of hashable items is hashable."),
    ("What does the built-in zip do when the iterables handed to it have different lengths and strict is not requested?", "It stops as soon as the shortest iterable is exhausted."),
    ("What is the effect of a yield from expression inside a generator that delegates part of its work to another iterable?", "It yields every value of the sub-iterator in turn and evaluates to the sub-generator's return value."),
    ("Which exception is raised when an integer is divided by zero with the floor division operator written as two slashes?", "ZeroDivisionError"),
    ("In what order are decorators applied when several of them are stacked on top of a single function definition?", "Bottom to top: the decorator nearest the def is applied first."),
    ("What does calling super with no arguments inside an ordinary method return in Python three, and how is it used?", "A proxy object that forwards method lookups to the next class in the method resolution order."),
    ("Which algorithm does Python use to compute the method resolution order of a class that has multiple base classes?", "C3 linearization"),
    ("What is the value of the special variable __name__ inside a module that has been imported by some other module?", "The module's own import name, such as its dotted path."),
    ("What does a double asterisk do when it is written in front of a dictionary in the argument list of a call?", "It unpacks the dictionary into keyword arguments."),
    ("Which built-in function accepts any iterable and returns a new sorted list while leaving the original object unchanged?", "sorted"),
    ("Is the sort performed by list.sort stable, meaning that elements comparing equal keep their original relative order?", "Yes; Python's sort is guaranteed to be stable."),
    ("What does the built-in function id return for an object, and what does that number happen to be in CPython?", "An integer unique to the object during its lifetime; in CPython it is the object's memory address."),
    ("When an f-string contains an expression followed by an equals sign inside the braces, what does the result show?", "The expression's source text, an equals sign, and the repr of its value."),
    ("What do you get when you add two lists together using the plus operator, and are the original lists changed?", "A new list with the elements of the first followed by those of the second; the originals are unchanged."),
    ("Which exception is raised when a function reads a local variable before any value has been assigned to that variable?", "UnboundLocalError"),
    ("What does the pass statement do at run time, and where is it typically written in a Python program?", "Nothing; it is a placeholder where the syntax requires a statement, such as an empty class or function body."),
    ("What pair of keywords begins the definition of a coroutine function that is allowed to use await inside its body?", "async def"),
    ("What does an await expression suspend, and what kind of object is allowed to appear right after the await keyword?", "It suspends the current coroutine until an awaitable, such as a coroutine, Task or Future, completes."),
    ("Which string method removes whitespace from both the beginning and the end of a string and returns the trimmed copy?", "strip"),
    ("What happens to assert statements when the Python interpreter is started with the -O optimization command line flag?", "They are removed at compile time and never executed."),
    ("What does a parameter written as **kwargs in a function definition collect when that function is eventually called?", "Any keyword arguments not matched by another parameter, gathered into a dict."),
    ("What does a bare raise statement do when it is written inside an except block that is currently handling an exception?", "It re-raises the exception currently being handled, keeping its traceback."),
]

CODE_EXPRESSIONS = [
    "sorted('banana')", "'-'.join(['a', 'b', 'c'])", "len({1, 1, 2, 3})", "7 // 2", "-7 // 2",
    "7 % -3", "2 ** 3 ** 2", "[1, 2, 3][::-1]", "'abc' * 2", "bool([])", "list(range(2, 10, 3))",
    "divmod(17, 5)", "round(2.5)", "round(3.5)", "int('1f', 16)", "'Hello'.lower().count('l')",
    "[x * x for x in range(5) if x % 2]", "{k: v for k, v in zip('ab', (1, 2))}",
    "max('apple', 'fig', 'pear', key=len)", "tuple(enumerate('xy'))", "'a,b,,c'.split(',')",
    "sum([[1], [2, 3]], [])", "any([0, '', None])", "all([])", "1 < 2 < 3 > 2", "'%s-%d' % ('x', 5)",
    "f'{255:x}'", "abs(-3) + min(4, 2)", "list(map(str.upper, 'hi'))", "'python'[1:4]",
    "[1, 2, 3, 4][-2:]", "(lambda x, y=2: x * y)(5)", "dict.fromkeys('ab', 0)", "'{:>5}'.format('ab')",
    "3 * '7'", "chr(ord('a') + 2)", "'abc'.find('z')", "list(zip([1, 2, 3], 'ab'))", "True + True",
    "bin(10)", "(1, 2) + (3,)", "list(range(10))[2:8:3]", "'Mississippi'.replace('ss', 'S', 1)",
]
CODE_TEMPLATES = [
    "In Python 3, what does the expression `{e}` evaluate to when you type it at the interactive prompt?",
    "Without running it, what value would a Python 3 interpreter print for the expression `{e}` entered at the REPL?",
    "Reading carefully, what is the result of evaluating the Python expression `{e}` in a fresh interpreter session?",
]

NAMES = ["Ana", "Bilal", "Chen", "Dara", "Emeka", "Freya", "Goran", "Hana", "Ines", "Jonas", "Kofi",
         "Lena", "Mateo", "Nadia", "Oskar", "Priya", "Quinn", "Rosa", "Sami", "Tove"]
ITEMS = ["marbles", "stickers", "pencils", "apples", "postcards", "buttons", "seashells", "cookies"]
ARITH_TEMPLATES = [  # (question, answer function); numbers sit between words so items rarely share 13-grams
    ("{n1} buys {a} bags of {it} with {b} {it} in each bag, then gives {c} {it} to {n2}. How many {it} does {n1} keep?",
     lambda a, b, c: a * b - c),
    ("A shelf holds {a} rows of {it}. Each row has {b} of them. {n1} removes {c} and {n2} adds {a} more. How many {it} are on the shelf now?",
     lambda a, b, c: a * b - c + a),
    ("{n1} saves {a} coins every week for {b} weeks and then spends {c} coins on {it}. How many coins does {n1} still have?",
     lambda a, b, c: a * b - c),
    ("A bus leaves with {a} passengers. At the first stop {b} people get off and {c} get on; {n1} counts them again. How many passengers are aboard?",
     lambda a, b, c: a - b + c),
    ("{n1} has {a} {it} and {n2} has {b} times as many. Together they share out {c} of them to classmates. How many {it} do the two of them have left?",
     lambda a, b, c: a + a * b - c),
    ("A garden has {a} beds with {b} tulips in each bed. {n1} picks {c} tulips for {n2}. How many tulips remain in the garden?",
     lambda a, b, c: a * b - c),
    ("{n1} reads {a} pages on Monday, {b} pages on Tuesday and twice the Tuesday amount on Wednesday, while {n2} reads {c}. How many pages did {n1} read?",
     lambda a, b, c: a + 3 * b),
    ("A box of {it} is shared equally by {n1} and {b} friends. The box held {t} {it} before {c} were lost. How many {it} does each of the {b} friends and {n1} get, ignoring leftovers?",
     lambda a, b, c: (a * b - c) // (b + 1)),
]


def arith_items(rng: random.Random, count: int = 100) -> list[dict]:
    items = []
    for i in range(count):
        template, answer = ARITH_TEMPLATES[i % len(ARITH_TEMPLATES)]
        a, b = rng.randint(12, 60), rng.randint(2, 9)
        c = rng.randint(2, a // 3)  # >= 2 keeps "gives 1 pencils" out; <= a/3 keeps every answer positive
        n1, n2 = rng.sample(NAMES, 2)
        question = template.format(a=a, b=b, c=c, t=a * b, n1=n1, n2=n2, it=rng.choice(ITEMS))
        items.append({"id": f"arith-words/{i:03d}", "benchmark": "arith-words", "question": question,
                      "answer": str(answer(a, b, c))})
    return items


def eval_suite(rng: random.Random) -> list[dict]:
    suite = [{"id": f"py-trivia/{i:03d}", "benchmark": "py-trivia", "question": q, "answer": a}
             for i, (q, a) in enumerate(PY_TRIVIA)]
    suite += arith_items(rng)
    for i, expr in enumerate(CODE_EXPRESSIONS):  # answers come from eval(), so they cannot be wrong
        suite.append({"id": f"code-reading/{i:03d}", "benchmark": "code-reading",
                      "question": CODE_TEMPLATES[i % len(CODE_TEMPLATES)].format(e=expr),
                      "answer": repr(eval(expr))})
    return suite


# --- corpus 3: synthetic forum posts, with planted contamination (written here, CC0-1.0) -----

POOLS = {
    "lib": ["requests", "pandas", "numpy", "flask", "django", "sqlalchemy", "pytest", "click", "pydantic",
            "fastapi", "celery", "boto3", "matplotlib", "scrapy", "aiohttp", "polars"],
    "tool": ["pip", "poetry", "conda", "pipenv", "uv", "tox", "nox", "hatch", "pyenv", "Docker"],
    "os": ["Ubuntu 22.04", "Debian 12", "macOS Sonoma", "Windows 11", "Fedora 39", "Alpine", "WSL2", "Arch"],
    "ver": ["3.8", "3.9", "3.10", "3.11", "3.12"],
    "err": ["ModuleNotFoundError", "an ImportError about a missing shared library", "a segfault",
            "PermissionError", "a RecursionError", "UnicodeDecodeError", "a TimeoutError",
            "a certificate verification failure", "a MemoryError", "an OSError about too many open files"],
    "thing": ["nightly export job", "test suite", "CLI tool", "web scraper", "data loader", "report generator",
              "chat bot", "invoice parser", "backup script", "image resizer", "ETL pipeline", "Slack webhook"],
    "func": ["json.loads", "re.compile", "copy.deepcopy", "the ORM session flush", "socket.recv", "os.walk",
             "str.format", "sorted", "the logging handler", "pickle.dumps", "subprocess.run", "zipfile.extractall"],
    "fmt": ["CSV", "Parquet", "JSON lines", "an Excel sheet", "SQLite", "YAML", "gzipped XML"],
    "source": ["a Postgres table", "an S3 bucket", "a REST API", "a shared network drive", "an FTP server",
               "a Kafka topic", "a Redis queue", "a Google Sheet"],
    "cause": ["the locale on the build machine is not UTF-8", "two copies of the package end up on sys.path",
              "the connection pool runs dry under load", "a C extension was built against an older ABI",
              "the cache directory is not writable", "a stale .pyc file shadows the new module",
              "the container has no timezone configured", "the garbage collector kicks in at the worst moment",
              "a thread never releases a lock", "the antivirus scanner locks the temp files"],
    "envvar": ["PYTHONPATH", "PYTHONUTF8", "PYTHONHASHSEED", "LANG", "OMP_NUM_THREADS", "PIP_NO_CACHE_DIR"],
    "container": ["Docker container", "Lambda function", "Kubernetes pod", "GitHub Actions runner",
                  "Raspberry Pi", "Jupyter notebook", "cheap VPS"],
    "period": ["month", "quarter", "spring", "sprint", "year", "winter"],
    "lang": ["Rust", "Go", "C++", "Cython", "Julia", "Zig"],
    "name": NAMES,
}
SENTENCES = [
    "I am trying to get {lib} working on {os} with Python {ver}, but the import fails with {err}.",
    "After upgrading {tool} my {thing} started taking {k} seconds instead of {k2}.",
    "Has anyone managed to run {lib} inside a {container} without running out of memory?",
    "The traceback points at line {n} of {file}, which is only a call to {func}.",
    "I already tried deleting the virtual environment and reinstalling with {tool}, no luck.",
    "My {thing} pulls roughly {n} thousand rows from {source} and writes them out as {fmt}.",
    "Pinning {lib} to an older release silences the warning on {os}, but that feels like a hack.",
    "Is there a cleaner approach than wrapping the {thing} in a try block and retrying {k} times?",
    "It runs fine on my laptop yet breaks on {os} in CI, with {err}.",
    "Profiling with cProfile shows most of the time going into {func}.",
    "The {lib} docs describe this option, but I found no example combining it with {lib2}.",
    "We moved from {tool} to {tool2} last {period} and builds got noticeably quicker.",
    "My current theory is that {cause}.",
    "Setting {envvar} to {val} before launching the {thing} changed nothing.",
    "For what it is worth, Python {ver} on {os2} shows exactly the same symptom.",
    "A colleague wants to rewrite the {thing} in {lang}, which sounds excessive to me.",
    "The weird part is that it only happens on every {nth}th run or so.",
    "I can reproduce it with a {k}-line script that does nothing except import {lib} and call {func}.",
    "Logging at DEBUG level produces about {n} MB of output before the {thing} dies.",
    "Does {lib} release the GIL during {func}, or am I misreading the flame graph?",
    "Our {thing} keeps {fmt} snapshots in {source}, and reading them back is the slow part.",
    "Switching the {thing} to asyncio with {lib2} cut memory use by about {pct} percent.",
    "Running mypy flags {k} errors in code that clearly works, mostly around {lib}.",
    "I wrote a small wrapper around {func} so the {thing} can be tested without {source}.",
    "The newest {lib} dropped support for Python {ver}, so we are stuck on the old one for now.",
    "Adding an index on the timestamp column took the {thing} from {k} minutes to under one.",
    "The {container} has {gb} GB of RAM, which should be plenty for a job this size.",
    "Could it be that {cause}?",
    "Our review bot flagged the {thing} because {func} is called inside a tight loop.",
    "I bisected it down to commit {sha}, which only bumped {lib} from one patch release to the next.",
]
OPENERS = ["Hi all,", "Quick question about {lib}.", "Long-time lurker, first post.", "Hey everyone,",
           "Not sure this is the right board, but here goes.", "Morning folks.",
           "Following up on my thread from last {period}.", "Posting this on behalf of {name} from my team."]
CLOSERS = ["Thanks in advance!", "Any pointers appreciated.", "Cheers, {name}.", "Happy to share more logs if that helps.",
           "I will report back if I find the cause.", "Solved it myself in the end, see my reply below.",
           "Thanks for reading this far.", "Edit: fixed the code formatting."]


class _Slots(dict):
    """format_map() mapping that invents a fresh random value for every replacement field it is asked for."""

    def __init__(self, rng: random.Random):
        super().__init__()
        self.rng = rng

    def __missing__(self, key: str) -> str:
        r, base = self.rng, key.rstrip("2")
        numbers = {"k": (2, 90), "n": (3, 950), "nth": (4, 20), "pct": (15, 70), "gb": (2, 64), "val": (0, 8)}
        if base in numbers:
            return str(r.randint(*numbers[base]))
        if key == "sha":
            return "%07x" % r.getrandbits(28)
        if key == "file":
            return r.choice(["app", "models", "utils", "tasks", "io_helpers", "cli"]) + ".py"
        return r.choice(POOLS[base])


def clean_post(rng: random.Random) -> str:
    # At least two body sentences: one-sentence posts from the same template came out as accidental
    # near-duplicates (word-3-gram Jaccard ~0.8), and the only near-duplicates should be the reposts.
    body = rng.sample(SENTENCES, rng.choice([2, 2, 3, 3, 3, 4, 4, 5]))
    parts = ([rng.choice(OPENERS)] if rng.random() < 0.5 else []) + body
    if rng.random() < 0.5 and len(parts) < 6:
        parts.append(rng.choice(CLOSERS))
    return " ".join(p.format_map(_Slots(rng)) for p in parts)


def repost(rng: random.Random, text: str) -> tuple[str, str]:
    """A near-duplicate repost: the same post with a short bump line added or one sentence dropped."""
    sentences = re.split(r"(?<=[.!?])\s+", text)
    if len(sentences) >= 5 and rng.random() < 0.5:
        del sentences[rng.randrange(1, len(sentences))]
        return " ".join(sentences), "dropped_sentence"
    bump = rng.choice(["Reposting since the first thread got no replies.", "Bump, still stuck on this.",
                       "(Cross-posted from the beginners board.)"])
    return (f"{bump} {text}" if rng.random() < 0.5 else f"{text} {bump}"), "added_bump"


EDIT_WORDS = ["really", "basically", "actually", "exactly", "some", "the", "any", "just"]
LEAD_INS = ["Saw this in the quiz channel and it stumped half the room:", "My study group argued about this one:",
            "Interview prep question I keep seeing:", "Copying this from the practice sheet our mentor shared:",
            "Random thing that came up at lunch today:"]
WRAP_UPS = ["Does that match what everyone else would say?", "Took me a while to see why.",
            "Posting it here so I can find it again later.", "Feel free to argue in the replies."]


def edit_question(rng: random.Random, question: str) -> str:
    """Drop or substitute ~6% of the words (at least one), as a lightly paraphrased copy would."""
    words = question.split()
    for pos in sorted(rng.sample(range(len(words)), max(1, round(0.06 * len(words)))), reverse=True):
        if rng.random() < 0.5:
            del words[pos]
        else:
            words[pos] = rng.choice([w for w in EDIT_WORDS if w != words[pos].lower()])
    return " ".join(words)


def case_punct(rng: random.Random, text: str) -> str:
    """Same words, different case and sentence punctuation (only punctuation before a space or the end)."""
    text = re.sub(r"[,.?!;:]+(?=\s|$)", "", text)
    return rng.choice([str.upper, str.lower, str.title])(text) + rng.choice([" ??", "!!", " ...", ""])


def planted_post(rng: random.Random, item: dict, style: str) -> str:
    q, a = item["question"], item["answer"]
    payload = {"verbatim_qa": f"{q} {rng.choice(['Answer:', 'The key says', 'Spoiler:'])} {a}",
               "question_only": q,
               "edited_question": edit_question(rng, q),
               "case_punct": case_punct(rng, f"{q} {a}")}[style]
    return f"{rng.choice(LEAD_INS)} {payload}\n{rng.choice(WRAP_UPS)}"  # newline: answers lack a full stop


def hard_negatives() -> list[tuple[str, str]]:
    """Clean posts full of degenerate n-grams (zeros, digit tables, boilerplate) that match no eval item."""
    header = ("# Copyright (c) the Example Widgets authors. All rights reserved. Use of this source file is "
              "governed by the license found in the LICENSE file at the root of this repository.")
    table = "\n".join(" ".join(str(r * c) for c in range(1, 11)) for r in range(1, 11))
    return [
        ("zero_run", "My tensor comes back as all zeros after the first epoch, here is the dump: " + " ".join(["0"] * 64)),
        ("digit_table", "Printing a 10 by 10 multiplication table to test my formatter, output below.\n" + table),
        ("license_header", "Every file in the vendored folder starts with the same header, which trips our linter:\n"
         + "\n".join([header] * 4)),
        ("hex_padding", "Hex dump of the corrupted upload, it is padding all the way down:\n"
         + "\n".join(["00 00 00 00 ff ff ff ff"] * 12)),
        ("repeated_log_line", "The retry loop just spams this until the job is killed:\n"
         + "\n".join(f"WARNING attempt {i} of 20 failed, sleeping 5 seconds" for i in range(1, 21))),
    ]


def ngrams(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    """Lower-cased word n-grams: a deliberately plain tokenizer, so the truth files stay honest."""
    tokens = re.findall(r"\w+", text.lower())
    return {tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)}


def eval_index(suite: list[dict]) -> dict[tuple[str, ...], set[str]]:
    index: dict[tuple[str, ...], set[str]] = {}
    for item in suite:
        for gram in ngrams(item["question"]) | ngrams(f"{item['question']} {item['answer']}"):
            index.setdefault(gram, set()).add(item["id"])
    return index


def forum_posts(rng: random.Random, suite: list[dict], index: dict, n_clean: int = 380,
                n_reposts: int = 20, per_style: int = 15) -> tuple[list[dict], dict[str, list[dict]]]:
    # Each entry is (sort key, text, tag); sorting by key interleaves plants among clean posts and
    # keeps every repost after its original, as on a real board.
    entries = [(float(i), clean_post(rng), ("clean", i)) for i in range(n_clean)]
    for i in sorted(rng.sample(range(n_clean), n_reposts)):
        text, edit = repost(rng, entries[i][1])
        entries.append((i + rng.uniform(1, 40), text, ("repost", i, edit)))
    # Plant only items with >= 13 words whose 13-grams are theirs alone, so each plant has one true source.
    plantable = [it for it in suite if len(it["question"].split()) >= NGRAM and ngrams(it["question"])
                 and all(index[g] == {it["id"]} for g in ngrams(it["question"]))]
    styles = ("verbatim_qa", "question_only", "edited_question", "case_punct")
    benchmarks = sorted({it["benchmark"] for it in suite})  # equal share per benchmark, styles mixed
    picks = [it for b in benchmarks
             for it in rng.sample([it for it in plantable if it["benchmark"] == b], per_style * len(styles) // len(benchmarks))]
    rng.shuffle(picks)
    for k, item in enumerate(picks):
        style = styles[k // per_style]
        entries.append((rng.uniform(0, n_clean), planted_post(rng, item, style), ("planted", item["id"], style)))
    for reason, text in hard_negatives():
        entries.append((rng.uniform(0, n_clean), text, ("negative", reason)))
    entries.sort(key=lambda e: e[0])

    docs, truth = [], {"planted": [], "negatives": [], "reposts": []}
    original_ids = {tag[1]: f"forum/{pos:04d}" for pos, (_, _, tag) in enumerate(entries) if tag[0] == "clean"}
    for pos, (_, text, tag) in enumerate(entries):
        doc_id, src = f"forum/{pos:04d}", "forum_posts.jsonl"
        docs.append({"id": doc_id, "text": text})
        if tag[0] == "planted":
            truth["planted"].append({"source": src, "id": doc_id, "eval_item_id": tag[1], "style": tag[2]})
        elif tag[0] == "negative":
            truth["negatives"].append({"source": src, "id": doc_id, "reason": tag[1]})
        elif tag[0] == "repost":
            truth["reposts"].append({"source": src, "id": doc_id, "original_id": original_ids[tag[1]], "edit": tag[2]})
    return docs, truth


def check_contamination(corpora: dict[str, list[dict]], planted: list[dict], index: dict) -> int:
    """Refuse to write fixtures whose truth is wrong: no unplanted document may share a 13-gram with
    the suite, and every plant except edited_question must hit exactly its own item. Returns how many
    edited plants still keep a 13-gram of their item (the rest are misses by design)."""
    by_id = {p["id"]: p for p in planted}
    edited_hits = 0
    for source, docs in corpora.items():
        for doc in docs:
            hits = set().union(*(index.get(g, set()) for g in ngrams(doc["text"])))
            plant = by_id.get(doc["id"]) if source == "forum_posts.jsonl" else None
            if plant is None:
                assert not hits, f"{source}:{doc['id']} accidentally contains eval items {sorted(hits)}"
            elif plant["style"] == "edited_question":
                assert hits <= {plant["eval_item_id"]}, doc["id"]
                edited_hits += bool(hits)
            else:
                assert hits == {plant["eval_item_id"]}, f"{doc['id']}: {sorted(hits)}"
    return edited_hits


# --- manifests ----------------------------------------------------------------------------------

# Written out in full so the reviewed file says what will run. The learning rates are the tiny CPU
# model's, not the schema defaults (which suit billion-parameter models): measured on the fixture
# recipe from the tiny model after a fixture-sized pretraining (260 steps of 8 x 128 tokens) with
# the run's BPE, these pass every gate on 3 of 3 seeds (held-out reward after SFT 0.14-0.24, after
# DPO 0.20-0.38, after RLVR 0.32-0.63). DPO adds the chosen answers' log-likelihood (rpo_alpha 1):
# plain DPO, from an SFT policy at 0.358, learnt to withhold the end of sequence after an answer
# and fell to 0.19 on 3 of 3 seeds; with the term it rose to 0.52 (+0.164 to +0.168; 2026-12-03).
POST_TRAINING = [
    {"kind": "sft", "num_epochs": 1, "learning_rate": 3e-3},
    {"kind": "dpo", "beta": 0.1, "label_smoothing": 0.0, "rpo_alpha": 1.0, "learning_rate": 1e-4},
    {"kind": "rlvr", "group_size": 8, "clip_eps_low": 0.2, "clip_eps_high": 0.28, "max_staleness": 1,
     "learning_rate": 1e-3},
]
# The pair file each SFT / DPO step trains on, bound by sha256 so the stage refuses changed bytes.
# Written by scripts/make_posttraining_fixtures.py (run it first); generated here, hence CC0.
PAIR_FILES = {"sft": "sft_pairs.jsonl", "dpo": "dpo_pairs.jsonl"}


def bound_post_training(steps: list[dict]) -> list[dict]:
    def reference(file: str) -> dict:
        return {"uri": f"dataroot://fixtures/posttraining/{file}", "format": "jsonl", "license": "CC0-1.0",
                "sha256": sha256_hex(FIXTURES / "posttraining" / file)}

    return [{**s, "data": reference(PAIR_FILES[s["kind"]])} if s["kind"] in PAIR_FILES else s for s in steps]
# The docs-only mixture is kept for its licence (PSF only); its benefit over the baseline is within
# the seed noise of the tiny decision run, and its reviewers say so in writing.
DOCS_ONLY_ACCEPTANCE = {"accepted_verdicts": ["WITHIN_NOISE"], "reviewed_by": "fixture-review",
                        "reason": "PSF-only mixture chosen for its licence; a within-noise benefit is accepted."}


# The main fixture's benefit over the baseline is about one interval half-width at the tiny decision
# run's three seeds (2026-12-02: on the raw sources, benchmarks/decision_run.py, +0.164 bits/byte,
# 95% interval +-0.199, WITHIN_NOISE; on the clean shards, `make run`, GO with the interval at
# [+0.088, +0.339]): a GO on one machine can be WITHIN_NOISE on another, so its reviewers accept
# within-noise in writing and `make run` trains on every machine.
SMALL_ACCEPTANCE = {"accepted_verdicts": ["WITHIN_NOISE"], "reviewed_by": "fixture-review",
                    "reason": "fixture corpora too small for a tiny 3-seed decision to show their gain; "
                              "a within-noise benefit is accepted."}


# The fixture's later stages are a handful of steps (at the plan's batch of 128 sequences: 4 for
# mid_training, 1 for long_context), and the tiny model's noise bands were measured on 3 seeds, an
# estimate that can be off by a factor of 2 either way (chi-square, 2 degrees of freedom). Its
# reviewers therefore allow a later stage to fall back by up to 4 bands; the first stage must still
# beat the untrained model by 2. Measured: long_context's answer loss moved by +0.034 nats (2.0
# bands) after its single step, on `make run` (2026-11-30).
FIXTURE_EVAL_GATE = {"min_improvement_bands": 2.0, "max_regression_bands": 4.0}


BASELINE = "pydoc_topics.jsonl"  # the embedded default's baseline (ito_assets/training/mixtures.py)


def manifest(name: str, corpora: list[tuple[str, str]], suite_sha: str, stages: list[tuple[str, int, int]],
             post_training: list[dict], cap_cents: int, max_incremental_cents: int,
             data_decision: dict | None = None, eval_gate: dict | None = None) -> dict:
    decontamination = {"eval_suite_id": SUITE_ID, "eval_suite_sha256": f"sha256:{suite_sha}",
                       "method": "ngram", "ngram_size": NGRAM}
    return {
        "schema_version": 1,
        "name": name,
        "model": {"size": "tiny", "num_parameters": 1_000_000, "revision": "r1"},
        "data": [{"uri": f"dataroot://fixtures/corpora/{file}", "sha256": sha256_hex(FIXTURES / "corpora" / file),
                  "license": licence, "format": "jsonl", "decontamination": decontamination}
                 for file, licence in corpora],
        "training_target": {"num_tokens": sum(s[1] for s in stages),
                            "stages": [{"name": n, "num_tokens": t, "sequence_length": L} for n, t, L in stages],
                            **({"eval_gate": eval_gate} if eval_gate else {})},
        "post_training": bound_post_training(post_training),
        "budget": {"cap_cents": cap_cents, "max_incremental_cents": max_incremental_cents},
        "checkpoint_policy": {"interval_steps": 50, "keep_last": 3, "storage_uri": f"tenant://checkpoints/{name}"},
        **({"data_decision": data_decision} if data_decision else {}),
        # The reference mixture the data decision measures the candidate against, reviewed with the rest.
        "decision_baseline": [{"uri": f"dataroot://fixtures/corpora/{BASELINE}",
                               "sha256": sha256_hex(FIXTURES / "corpora" / BASELINE)}],
    }


def write_json(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8", newline="\n")


def main() -> None:
    # One generator per output, seeded by name, so editing one part does not reshuffle the others.
    suite = eval_suite(random.Random(f"{SEED}/evals"))
    index = eval_index(suite)
    forum, truth = forum_posts(random.Random(f"{SEED}/forum"), suite, index)
    corpora = {"stdlib_docstrings.jsonl": stdlib_docstrings(), "pydoc_topics.jsonl": pydoc_topics(),
               "forum_posts.jsonl": forum}
    edited_hits = check_contamination(corpora, truth["planted"], index)

    for file, rows in corpora.items():
        write_jsonl(FIXTURES / "corpora" / file, rows)
    write_jsonl(FIXTURES / "evals" / f"{SUITE_ID}.jsonl", suite)
    write_jsonl(FIXTURES / "truth" / "planted_contamination.jsonl", truth["planted"])
    write_jsonl(FIXTURES / "truth" / "clean_hard_negatives.jsonl", truth["negatives"])
    write_jsonl(FIXTURES / "truth" / "forum_reposts.jsonl", truth["reposts"])

    suite_sha = sha256_hex(FIXTURES / "evals" / f"{SUITE_ID}.jsonl")
    write_json(FIXTURES / "manifests" / "fixture-small.json", manifest(
        "fixture-small", [("stdlib_docstrings.jsonl", "PSF-2.0"), ("pydoc_topics.jsonl", "PSF-2.0"),
                          ("forum_posts.jsonl", "CC0-1.0")], suite_sha,
        [("pretraining", 200_000, 128), ("mid_training", 50_000, 128), ("long_context", 20_000, 256)],
        POST_TRAINING, 5_000_000, 2_500_000, SMALL_ACCEPTANCE, eval_gate=FIXTURE_EVAL_GATE))
    write_json(FIXTURES / "manifests" / "fixture-docs-only.json", manifest(
        "fixture-docs-only", [("stdlib_docstrings.jsonl", "PSF-2.0"), ("pydoc_topics.jsonl", "PSF-2.0")],
        suite_sha, [("pretraining", 100_000, 128), ("mid_training", 20_000, 128)],
        POST_TRAINING[:1], 1_000_000, 500_000, DOCS_ONLY_ACCEPTANCE))

    # The README's table is kept by hand; print what it needs.
    print(f"Python {sys.version.split()[0]}; edited_question plants still holding a {NGRAM}-gram: "
          f"{edited_hits}/{sum(p['style'] == 'edited_question' for p in truth['planted'])}")
    for path in sorted(p for p in FIXTURES.rglob("*") if p.is_file() and p.name != "README.md"):
        lines = path.read_bytes().count(b"\n") if path.suffix == ".jsonl" else "-"
        print(f"| `{path.relative_to(FIXTURES)}` | {lines} | {path.stat().st_size} | `{sha256_hex(path)}` |")


if __name__ == "__main__":
    main()
