"""Builders for the data-preparation tests (imported by name: pytest puts this folder on the path)."""

from __future__ import annotations

import random

import polars as pl

from ito_assets.data.sources import DOCUMENT_SCHEMA

WORDS = [f"w{i}" for i in range(5000)]


def frame(texts: list[str], *, source_index: int = 0, prefix: str = "d") -> pl.DataFrame:
    """A document frame in DOCUMENT_SCHEMA with ids d0000, d0001, ... (keep order = list order)."""
    n = len(texts)
    return pl.DataFrame(
        {
            "doc_id": [f"{prefix}{i:04d}" for i in range(n)],
            "source_index": [source_index] * n,
            "source_uri": ["dataroot://test.jsonl"] * n,
            "source_sha256": ["0" * 64] * n,
            "license": ["CC0-1.0"] * n,
            "row": list(range(n)),
            "source_record_id": [f"r{i}" for i in range(n)],
            "text": texts,
        },
        schema=DOCUMENT_SCHEMA,
    )


def random_text(rng: random.Random, num_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(num_words))


def edit_words(rng: random.Random, text: str, num_edits: int) -> str:
    """Replace `num_edits` distinct words with fresh ones."""
    words = text.split()
    for i in rng.sample(range(len(words)), num_edits):
        words[i] = f"edit{rng.randrange(10**6)}"
    return " ".join(words)
