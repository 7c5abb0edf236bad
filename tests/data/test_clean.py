"""Cutting, clean rows and the conservation account (with a Hypothesis property)."""

from __future__ import annotations

import random

import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data_frames import edit_words, frame, random_text
from ito_assets.data.clean import account, cut_pieces
from ito_assets.data.config import DecontamConfig, DedupConfig
from ito_assets.data.eval_index import build_index
from ito_assets.evals.suite import EvalItem, EvalSuite
from reference_impl import prepare, scan

QUESTION = "Which built in exception is raised when you look up a key in a dictionary that does not contain that key at all"
SUITE = EvalSuite("unit", "sha256:" + "0" * 64, (EvalItem(id="t/1", benchmark="t", question=QUESTION, answer="KeyError"),))


def pipeline(docs: pl.DataFrame, decontam: DecontamConfig):
    return prepare(docs, build_index(SUITE, decontam), DedupConfig(), decontam)


def test_cut_pieces_follow_the_gpt3_rule() -> None:
    config = DecontamConfig(action="cut")
    text = "x" * 1000
    assert cut_pieces(text, [(500, 520)], config) == [(0, 300), (720, 1000)]
    assert cut_pieces(text, [(100, 120)], config) == [(320, 1000)]  # the 0-piece is under 200 chars
    many = [(i, i + 1) for i in range(0, 1000, 50)]
    assert cut_pieces(text * 20, [(s * 20, e * 20) for s, e in many], config) is None  # > 10 pieces


def test_cut_keeps_long_pieces_and_drop_removes_the_document() -> None:
    rng = random.Random(0)
    text = f"{random_text(rng, 120)} {QUESTION}? {random_text(rng, 120)}"
    docs = frame([text, random_text(rng, 50)])
    final, rows, hits = pipeline(docs, DecontamConfig(action="cut"))
    assert hits.height == 1
    cut = final.filter(pl.col("doc_id") == "d0000").row(0, named=True)
    assert cut["state"] == "contaminated" and cut["action"] == "cut" and cut["num_pieces"] == 2
    pieces = rows.filter(pl.col("doc_id") == "d0000")
    assert all(QUESTION.split()[5] not in t for t in pieces["text"].to_list())
    assert [text[s:e] for s, e in pieces.select("char_start", "char_end").iter_rows()] == pieces["text"].to_list()
    conservation = account(docs["doc_id"], final, rows)
    assert conservation.holds and conservation.num_contaminated_cut == 1 and conservation.num_pieces == 2
    final, rows, _ = pipeline(docs, DecontamConfig(action="drop"))
    assert rows["doc_id"].to_list() == ["d0001"]
    assert account(docs["doc_id"], final, rows).num_contaminated_dropped == 1


def test_account_detects_a_missing_document() -> None:
    rng = random.Random(1)
    docs = frame([random_text(rng, 40) for _ in range(3)])
    final, rows, _ = pipeline(docs, DecontamConfig())
    assert account(docs["doc_id"], final, rows).holds
    broken = account(docs["doc_id"], final, rows.head(2))
    assert not broken.holds and "kept" in broken.problems[0]


KIND = st.sampled_from(["fresh", "copy", "near", "plant"])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kinds=st.lists(KIND, min_size=1, max_size=25), seed=st.integers(0, 10_000), action=st.sampled_from(["drop", "cut"]))
def test_conservation_holds_for_any_mix(kinds: list[str], seed: int, action: str) -> None:
    rng = random.Random(seed)
    texts: list[str] = []
    for kind in kinds:
        if kind == "copy" and texts:
            texts.append(rng.choice(texts))
        elif kind == "near" and texts:
            base = rng.choice(texts)
            texts.append(edit_words(rng, base, 1) if len(base.split()) > 30 else random_text(rng, 60))
        elif kind == "plant":
            texts.append(f"{random_text(rng, rng.randint(0, 120))} {QUESTION} {random_text(rng, rng.randint(0, 120))}")
        else:
            texts.append(random_text(rng, rng.randint(1, 150)))
    docs = frame(texts)
    final, rows, hits = pipeline(docs, DecontamConfig(action=action))
    result = account(docs["doc_id"], final, rows)
    assert result.holds, result.problems
    assert result.num_kept + result.num_duplicate + result.num_contaminated == docs.height
    # Nothing the scan would flag remains in the clean rows.
    residual, _ = scan(rows.with_columns(pl.concat_str("doc_id", pl.col("piece").cast(pl.String).fill_null(""))), build_index(SUITE, DecontamConfig()), DecontamConfig())
    assert residual.height == 0
