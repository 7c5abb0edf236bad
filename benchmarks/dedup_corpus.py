"""Deterministic benchmark corpora with known near-duplicates. Standard library only.

- "long" (`build`): the fixture corpora plus synthetic documents of 4-16 sentences drawn from the
  fixtures' own sentences (real vocabulary, real sentence lengths); ~1 kB a document.
- "short" (`build_short`): documents of 100-600 bytes cut from the same sentences.
- "man" (`build_man`): real text where this machine has it: the installed manual pages
  (/usr/share/man, every language), roff markup stripped, paragraphs packed into documents of
  100-600 bytes. It depends on the packages installed, so its figures name the page count.

In every mode a share of the documents then gets near-copies with words replaced, dropped or
inserted, and a few exact copies, so that pairs span the whole Jaccard range around the 0.8
threshold (the manual pages also repeat boilerplate of their own).
"""

from __future__ import annotations

import gzip
import json
import random
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPORA = ROOT / "data" / "fixtures" / "corpora"
MAN = Path("/usr/share/man")
MODES = ("long", "short", "man")
SHORT_BYTES = (100, 600)
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def fixture_texts(exclude: tuple[str, ...] = ()) -> list[str]:
    texts = []
    for path in sorted(p for p in CORPORA.glob("*.jsonl") if p.name not in exclude):
        texts += [json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip()]
    return texts


def _edit(rng: random.Random, text: str, rate: float) -> str:
    words = text.split(" ")
    out = []
    for word in words:
        roll = rng.random()
        if roll < rate / 3:
            continue  # dropped
        if roll < 2 * rate / 3:
            out.append(rng.choice(words))  # replaced
            continue
        out.append(word)
        if roll > 1 - rate / 3:
            out.append(rng.choice(words))  # inserted
    return " ".join(out)


def _plant(rng: random.Random, docs: list[str], num_docs: int, favoured: int, max_rate: float) -> list[dict]:
    """docs topped up to num_docs with copies (5%) and near-copies (1% to max_rate of words
    edited), shuffled, as records."""
    while len(docs) < num_docs:
        original = rng.choice(docs[: favoured + 1000] if rng.random() < 0.2 else docs)
        docs.append(original if rng.random() < 0.05 else _edit(rng, original, rng.uniform(0.01, max_rate)))
    rng.shuffle(docs)
    return [{"id": f"bench/{i:07d}", "text": t} for i, t in enumerate(docs)]


def _sentences(base: list[str]) -> list[str]:
    return [s for t in base for s in _SENTENCE.split(t) if len(s.split()) >= 4]


def build(num_docs: int, seed: int = 0, near_share: float = 0.15, exclude: tuple[str, ...] = ()) -> list[dict]:
    rng = random.Random(seed)
    base = fixture_texts(exclude)
    sentences = _sentences(base)
    docs = list(base)
    while len(docs) < num_docs * (1 - near_share):
        docs.append(" ".join(rng.choice(sentences) for _ in range(rng.randint(4, 16))))
    return _plant(rng, docs, num_docs, len(base), 0.2)


def _clip(text: str, limit: int) -> str:
    """text cut at a word boundary to at most `limit` UTF-8 bytes."""
    if len(text.encode()) <= limit:
        return text
    return text.encode()[:limit].decode(errors="ignore").rsplit(" ", 1)[0]


def _packed(rng: random.Random, pieces: list[str], num_docs: int) -> list[str]:
    """Consecutive pieces joined into documents of SHORT_BYTES (a piece longer than the target is
    cut at a word boundary)."""
    low, high = SHORT_BYTES
    docs: list[str] = []
    current, target = "", rng.randint(low, high)
    for piece in pieces:
        current = f"{current} {piece}".strip()
        if len(current.encode()) >= target:
            docs.append(_clip(current, target))
            current, target = "", rng.randint(low, high)
            if len(docs) == num_docs:
                break
    return [d for d in docs if len(d.encode()) >= low]


def build_short(num_docs: int, seed: int = 0, near_share: float = 0.15) -> list[dict]:
    """Documents of 100-600 bytes from the fixtures' sentences; near-copies edit 1-10% of words
    (a 50-word document at 10% already falls to J ~ 0.5 on word 5-grams)."""
    rng = random.Random(seed)
    sentences = _sentences(fixture_texts())
    stream = (rng.choice(sentences) for _ in range(num_docs * 40))
    docs = _packed(rng, list(stream), int(num_docs * (1 - near_share)))
    return _plant(rng, docs, num_docs, len(docs), 0.1)


_ESCAPE = re.compile(r"\\(f(\[[^]]*\]|\(..|.)|\*(\[[^]]*\]|\(..|.)|\(..|\[[^]]*\]|[-e&| ^0~]|.)")
_ESCAPED = {"\\-": "-", "\\e": "\\", "\\ ": " ", "\\~": " ", "\\0": " "}
_TEXT_MACROS = {"B", "I", "BR", "BI", "IB", "IR", "RB", "RI", "SM", "SB"}


def _unroff(source: str) -> list[str]:
    """Paragraphs of a manual page's roff source: requests break paragraphs, font macros keep
    their words, escapes are replaced or dropped. Rough, but every word is real text."""
    paragraphs, lines = [], []
    for line in source.splitlines():
        if line.startswith((".\\\"", "'\\\"", '.\\"')):
            continue
        if line.startswith((".", "'")):
            macro, _, rest = line[1:].strip().partition(" ")
            if macro in _TEXT_MACROS:
                lines.append(rest.replace('"', ""))
                continue
            if lines:
                paragraphs.append(" ".join(lines))
                lines = []
            continue
        lines.append(line)
    if lines:
        paragraphs.append(" ".join(lines))
    out = []
    for paragraph in paragraphs:
        text = _ESCAPE.sub(lambda m: _ESCAPED.get(m.group(0), ""), paragraph)
        text = " ".join(text.split())
        if len(text.split()) >= 3:
            out.append(text)
    return out


def man_pages() -> list[Path]:
    return sorted(p for p in MAN.rglob("*.gz") if p.is_file() and not p.is_symlink())


def man_texts(num_docs: int, seed: int = 0) -> tuple[list[str], int]:
    """Documents of 100-600 bytes from the manual pages (all languages, in a seeded order), and
    how many pages they came from; ([], 0) where there are none."""
    rng = random.Random(seed)
    pages = man_pages()
    rng.shuffle(pages)
    docs: list[str] = []
    used = 0
    for page in pages:
        try:
            source = gzip.decompress(page.read_bytes()).decode("utf-8")
        except (OSError, UnicodeDecodeError, EOFError):
            continue  # not gzip or not UTF-8 (a few legacy encodings): skipped, not guessed
        if source.lstrip().startswith(".so "):
            continue  # a redirect to another page
        docs += _packed(rng, _unroff(source), num_docs - len(docs))
        used += 1
        if len(docs) >= num_docs:
            break
    return docs[:num_docs], used


def build_man(num_docs: int, seed: int = 0, near_share: float = 0.15) -> list[dict]:
    rng = random.Random(seed)
    docs, _ = man_texts(int(num_docs * (1 - near_share)), seed)
    if not docs:
        raise FileNotFoundError(f"no manual pages under {MAN}")
    return _plant(rng, docs, num_docs, len(docs), 0.1)


def write(path: Path, num_docs: int, seed: int = 0, exclude: tuple[str, ...] = (), mode: str = "long") -> Path:
    records = {"long": lambda: build(num_docs, seed, exclude=exclude), "short": lambda: build_short(num_docs, seed),
               "man": lambda: build_man(num_docs, seed)}[mode]()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
    return path


if __name__ == "__main__":
    import sys

    target = write(Path(sys.argv[1]), int(sys.argv[2]), mode=sys.argv[3] if len(sys.argv) > 3 else "long")
    print(f"wrote {target} ({target.stat().st_size / 1e6:.1f} MB)")
