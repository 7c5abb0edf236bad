"""A deterministic benchmark corpus with known near-duplicates, built from the fixture texts.

Base documents are the fixture corpora plus synthetic documents of 4-16 sentences drawn from the
fixtures' own sentences (real vocabulary, real sentence lengths). A share of the documents then
gets 1-3 near-copies with words replaced, dropped or inserted at 1-20%, and a few exact copies,
so that pairs span the whole Jaccard range around the 0.8 threshold. Standard library only.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPORA = ROOT / "data" / "fixtures" / "corpora"
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


def build(num_docs: int, seed: int = 0, near_share: float = 0.15, exclude: tuple[str, ...] = ()) -> list[dict]:
    rng = random.Random(seed)
    base = fixture_texts(exclude)
    sentences = [s for t in base for s in _SENTENCE.split(t) if len(s.split()) >= 4]
    docs = list(base)
    while len(docs) < num_docs * (1 - near_share):
        docs.append(" ".join(rng.choice(sentences) for _ in range(rng.randint(4, 16))))
    while len(docs) < num_docs:
        original = rng.choice(docs[: len(base) + 1000] if rng.random() < 0.2 else docs)
        if rng.random() < 0.05:
            docs.append(original)
        else:
            docs.append(_edit(rng, original, rng.uniform(0.01, 0.2)))
    rng.shuffle(docs)
    return [{"id": f"bench/{i:07d}", "text": t} for i, t in enumerate(docs)]


def write(path: Path, num_docs: int, seed: int = 0, exclude: tuple[str, ...] = ()) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        for record in build(num_docs, seed, exclude=exclude):
            handle.write(json.dumps(record) + "\n")
    return path


if __name__ == "__main__":
    import sys

    target = write(Path(sys.argv[1]), int(sys.argv[2]))
    print(f"wrote {target} ({target.stat().st_size / 1e6:.1f} MB)")
