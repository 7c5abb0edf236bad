"""The conservation account, check by check, and the clean-row builders it audits.

Each test starts from one valid account (`VALID`) and breaks it in one way only, so that the
account must name exactly the check that fails: a check that is silently weakened (a join, a
comparison or a NULL rule changed) leaves its test with no problem, or the wrong one.
"""

from __future__ import annotations

import polars as pl
import pytest

from data_frames import frame
from ito_assets.data.clean import (
    ACTION_SCHEMA,
    FINAL_SCHEMA,
    account,
    apply_actions,
    clean_batches,
    clean_documents,
    cut_pieces,
    decisions,
    final_batches,
)
from ito_assets.data.config import DecontamConfig
from ito_assets.data.decontam import HIT_SCHEMA

MORE_THAN_ONE = "a document has more than one decision"
DIFFER = "the decisions and the input documents differ"
ADD_UP = "the states do not add up to the input"
WHOLE = "the whole documents in the clean shards are not exactly the kept ones"
PIECES = "the pieces in the clean shards do not match the cut documents"
NO_ITEM = "a contaminated document has no eval item"
NO_TARGET = "a duplicate has no kept document or cluster"
NOT_KEPT = "a duplicate is recorded against a document that was not kept by deduplication"
NO_ACTION = "a contaminated document has no action"
WORSE = "a document was removed as a duplicate of one that decontamination treats worse"


def decision(doc_id: str, state: str, **fields) -> dict:
    row = dict.fromkeys(FINAL_SCHEMA)
    row.update(doc_id=doc_id, state=state, num_pieces=0)
    row.update(fields)
    return row


def duplicate(doc_id: str, of: str) -> dict:
    return decision(doc_id, "duplicate", method="near", duplicate_of=of, cluster_id=of, similarity=0.9)


def contaminated(doc_id: str, action: str, num_pieces: int = 0) -> dict:
    return decision(doc_id, "contaminated", eval_item_ids=["t/1"], action=action, num_pieces=num_pieces)


# Distinct counts for every state, so that a swapped counter cannot pass:
# 4 kept, 3 duplicates, 1 dropped, 2 cut (into 2 and 3 pieces).
KEPT_IDS = ["k1", "k2", "k3", "k4"]
VALID_DECISIONS = [
    *(decision(d, "kept") for d in KEPT_IDS),
    duplicate("u1", "k1"),
    duplicate("u2", "k1"),
    duplicate("u3", "k2"),
    contaminated("c1", "drop"),
    contaminated("c2", "cut", 2),
    contaminated("c3", "cut", 3),
]
VALID_CLEAN = [*((d, None) for d in KEPT_IDS), ("c2", 0), ("c2", 1), ("c3", 0), ("c3", 1), ("c3", 2)]
INPUT_IDS = [row["doc_id"] for row in VALID_DECISIONS]


def final_of(rows: list[dict]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=FINAL_SCHEMA)


def clean_of(rows: list[tuple[str, int | None]]) -> pl.DataFrame:
    return pl.DataFrame({"doc_id": [d for d, _ in rows], "piece": [p for _, p in rows]}, schema={"doc_id": pl.String, "piece": pl.Int32})


def audit(*, inputs: list[str] = INPUT_IDS, final: list[dict] = VALID_DECISIONS, clean: list[tuple[str, int | None]] = VALID_CLEAN):
    return account(pl.Series(inputs, dtype=pl.String), final_of(final), clean_of(clean))


def replaced(doc_id: str, row: dict) -> list[dict]:
    return [row if r["doc_id"] == doc_id else r for r in VALID_DECISIONS]


def test_the_valid_account_holds_with_exact_counts() -> None:
    result = audit()
    assert result.problems == () and result.holds
    assert (result.num_input, result.num_kept, result.num_duplicate) == (10, 4, 3)
    assert (result.num_contaminated_dropped, result.num_contaminated_cut, result.num_contaminated) == (1, 2, 3)
    assert (result.num_clean_rows, result.num_pieces) == (9, 5)


def test_a_broken_account_does_not_hold() -> None:
    result = audit(clean=VALID_CLEAN[1:])
    assert not result.holds and result.problems == (WHOLE,)
    assert (result.num_clean_rows, result.num_pieces) == (8, 5)


def test_a_document_decided_twice() -> None:
    # The input lists k1 twice as well, so the totals still add up: only this check can see it.
    assert audit(inputs=[*INPUT_IDS, "k1"], final=[*VALID_DECISIONS, decision("k1", "kept")]).problems == (MORE_THAN_ONE,)
    # Decided twice in different states: the totals are off too.
    assert audit(final=[*VALID_DECISIONS, duplicate("k1", "k2")]).problems == (MORE_THAN_ONE, ADD_UP)


def test_decisions_and_inputs_differ_in_either_direction() -> None:
    # A decided document missing from the input (the count is kept equal by listing k2 twice).
    assert audit(inputs=["k2" if d == "k1" else d for d in INPUT_IDS]).problems == (DIFFER,)
    # An input document without a decision.
    assert audit(inputs=[*INPUT_IDS, "x1"]).problems == (DIFFER, ADD_UP)


def test_states_that_do_not_add_up() -> None:
    # A decision in no known state: every document is decided, but the states sum to 9 of 10.
    limbo = audit(final=replaced("k4", decision("k4", "limbo")), clean=[c for c in VALID_CLEAN if c[0] != "k4"])
    assert limbo.problems == (ADD_UP,) and limbo.num_kept == 3
    # The input counts a document twice (same set of ids, one more row).
    assert audit(inputs=[*INPUT_IDS, "u1"]).problems == (ADD_UP,)


@pytest.mark.parametrize(
    "clean",
    [
        [c for c in VALID_CLEAN if c[0] != "k2"],  # a kept document is missing
        [*VALID_CLEAN, ("k2", None)],  # a kept document is there twice
        [*VALID_CLEAN, ("u1", None)],  # a duplicate is there whole
        [*VALID_CLEAN, ("c1", None)],  # a dropped document is there whole
    ],
    ids=["missing", "twice", "duplicate-whole", "dropped-whole"],
)
def test_whole_rows_must_be_exactly_the_kept_documents(clean) -> None:
    assert audit(clean=clean).problems == (WHOLE,)


@pytest.mark.parametrize(
    "clean",
    [
        [c for c in VALID_CLEAN if c[0] != "c2"],  # every piece of a cut document lost: found is NULL
        [c for c in VALID_CLEAN if c != ("c3", 2)],  # one piece lost
        [*VALID_CLEAN, ("c3", 3)],  # an extra piece
        [*VALID_CLEAN, ("k1", 0)],  # a piece of a document that was not cut: num_pieces is NULL
        [*VALID_CLEAN, ("c1", 0)],  # a piece of a dropped document
    ],
    ids=["all-lost", "one-lost", "extra", "not-cut", "dropped"],
)
def test_pieces_must_match_the_cut_documents(clean) -> None:
    assert audit(clean=clean).problems == (PIECES,)


def test_a_cut_document_recorded_with_the_wrong_number_of_pieces() -> None:
    assert audit(final=replaced("c2", contaminated("c2", "cut", 3))).problems == (PIECES,)


@pytest.mark.parametrize("items", [None, []], ids=["null", "empty"])
def test_a_contaminated_document_without_an_eval_item(items) -> None:
    row = contaminated("c1", "drop") | {"eval_item_ids": items}
    assert audit(final=replaced("c1", row)).problems == (NO_ITEM,)


def test_a_duplicate_without_a_cluster_or_a_kept_document() -> None:
    assert audit(final=replaced("u1", duplicate("u1", "k1") | {"cluster_id": None})).problems == (NO_TARGET,)
    # Without duplicate_of it is also recorded against no surviving document (NULL never joins).
    assert audit(final=replaced("u1", duplicate("u1", "k1") | {"duplicate_of": None})).problems == (NO_TARGET, NOT_KEPT)


def test_a_duplicate_recorded_against_a_document_that_did_not_survive_deduplication() -> None:
    assert audit(final=replaced("u2", duplicate("u2", "u1"))).problems == (NOT_KEPT,)
    assert audit(final=replaced("u2", duplicate("u2", "ghost"))).problems == (NOT_KEPT,)
    # A contaminated document did survive deduplication: a duplicate of it that decontamination
    # would drop too is justified.
    assert audit(final=replaced("u2", duplicate("u2", "c1") | {"eval_item_ids": ["t/1"], "action": "drop"})).problems == ()


# The tiers: clean < cut < drop. A duplicate's kept document is never in a worse tier than itself.
@pytest.mark.parametrize(
    ("own", "target", "problems"),
    [
        (None, "k1", ()),
        (None, "c2", (WORSE,)),
        (None, "c1", (WORSE,)),
        ("cut", "k1", ()),
        ("cut", "c2", ()),
        ("cut", "c1", (WORSE,)),
        ("drop", "k1", ()),
        ("drop", "c2", ()),
        ("drop", "c1", ()),
    ],
)
def test_a_duplicate_is_never_kept_in_favour_of_a_worse_document(own: str | None, target: str, problems: tuple) -> None:
    row = duplicate("u2", target) | ({"eval_item_ids": ["t/1"], "action": own} if own else {})
    assert audit(final=replaced("u2", row)).problems == problems


def test_a_contaminated_document_without_an_action() -> None:
    assert audit(final=replaced("c1", contaminated("c1", "drop") | {"action": None})).problems == (NO_ACTION,)


def test_a_duplicate_with_an_action_but_no_eval_item() -> None:
    assert audit(final=replaced("u2", duplicate("u2", "c1") | {"action": "drop"})).problems == (NO_ITEM,)


def test_every_check_at_once_is_reported_in_order() -> None:
    final = [
        *VALID_DECISIONS[:-1],
        decision("k1", "kept"),
        contaminated("c3", "cut", 3) | {"eval_item_ids": None},
        duplicate("u9", "u1") | {"cluster_id": None},
    ]
    result = audit(inputs=[*INPUT_IDS, "x1"], final=final, clean=[*VALID_CLEAN, ("k1", None), ("k2", 0)])
    assert result.problems == (MORE_THAN_ONE, DIFFER, ADD_UP, WHOLE, PIECES, NO_ITEM, NO_TARGET, NOT_KEPT)


# --- the builders of the clean rows and of the final decisions ---


def test_cut_pieces_at_the_window_and_piece_size_boundaries() -> None:
    config = DecontamConfig(action="cut", cut_window_chars=10, min_piece_chars=5, max_pieces=2)
    text = "x" * 100
    # The hit widened by 10 either side: [40, 70) removed.
    assert cut_pieces(text, [(50, 60)], config) == [(0, 40), (70, 100)]
    # A leading piece of exactly min_piece_chars stays, one char less goes.
    assert cut_pieces(text, [(15, 20)], config) == [(0, 5), (30, 100)]
    assert cut_pieces(text, [(14, 20)], config) == [(30, 100)]
    # The window is clipped at both ends of the text.
    assert cut_pieces(text, [(2, 3), (97, 98)], config) == [(13, 87)]
    # Regions whose windows touch merge (start == previous end) into one removal.
    assert cut_pieces(text, [(30, 40), (60, 70)], config) == [(0, 20), (80, 100)]
    # ... and one nested inside another does not shorten it.
    assert cut_pieces(text, [(30, 70), (40, 50)], config) == [(0, 20), (80, 100)]
    # Unsorted regions are sorted first.
    assert cut_pieces(text, [(80, 85), (5, 25)], config) == [(35, 70), (95, 100)]
    # A region that removes everything leaves no piece (and is not "too many pieces").
    assert cut_pieces(text, [(0, 100)], config) == []
    # A trailing piece one char under min_piece_chars goes too.
    assert cut_pieces(text, [(80, 86)], config) == [(0, 70)]


def test_a_cut_up_to_the_end_leaves_no_empty_trailing_piece() -> None:
    # With min_piece_chars 0 an empty piece at the end would be kept, and count against max_pieces.
    config = DecontamConfig(action="cut", cut_window_chars=0, min_piece_chars=0, max_pieces=1)
    assert cut_pieces("x" * 100, [(50, 100)], config) == [(0, 50)]
    assert cut_pieces("x" * 100, [(0, 50)], config) == [(50, 100)]


def test_cut_pieces_counts_short_pieces_against_max_pieces() -> None:
    config = DecontamConfig(action="cut", cut_window_chars=0, min_piece_chars=5, max_pieces=2)
    text = "x" * 100
    assert cut_pieces(text, [(50, 51)], config) == [(0, 50), (51, 100)]  # exactly max_pieces
    assert cut_pieces(text, [(30, 31), (60, 61)], config) is None  # three pieces: dropped
    # Three spans of which one is too short still count as three.
    assert cut_pieces(text, [(2, 3), (60, 61)], config) is None


def hits_of(rows: list[tuple[str, str, int, int]]) -> pl.DataFrame:
    return pl.DataFrame(
        [{"doc_id": d, "eval_item_id": i, "char_start": s, "char_end": e} for d, i, s, e in rows],
        schema={k: HIT_SCHEMA[k] for k in ("doc_id", "eval_item_id", "char_start", "char_end")},
    )


def docs4() -> pl.DataFrame:
    return frame(["a" * 100, "b" * 100, "c" * 100, "d" * 100])

CUT_CONFIG = DecontamConfig(action="cut", cut_window_chars=10, min_piece_chars=5, max_pieces=2)


def test_apply_actions_cuts_drops_and_leaves_the_rest() -> None:
    hits = hits_of([("d0002", "t/2", 50, 60), ("d0000", "t/1", 0, 100), ("d0001", "t/1", 20, 21), ("d0001", "t/1", 50, 51), ("d0001", "t/1", 80, 81)])
    actions, pieces = apply_actions(docs4(), hits, CUT_CONFIG)
    # d0000: nothing left -> drop; d0001: three pieces > max_pieces -> drop; d0002: cut in two.
    assert actions.to_dicts() == [
        {"doc_id": "d0000", "action": "drop", "num_pieces": 0},
        {"doc_id": "d0001", "action": "drop", "num_pieces": 0},
        {"doc_id": "d0002", "action": "cut", "num_pieces": 2},
    ]
    assert pieces.to_dicts() == [
        {"doc_id": "d0002", "piece": 0, "char_start": 0, "char_end": 40, "text": "c" * 40},
        {"doc_id": "d0002", "piece": 1, "char_start": 70, "char_end": 100, "text": "c" * 30},
    ]
    assert actions.schema == pl.Schema(ACTION_SCHEMA)


def test_apply_actions_drops_whole_documents_under_the_drop_action() -> None:
    config = DecontamConfig(action="drop", cut_window_chars=10, min_piece_chars=5)
    actions, pieces = apply_actions(docs4(), hits_of([("d0002", "t/2", 50, 60)]), config)
    assert actions.to_dicts() == [{"doc_id": "d0002", "action": "drop", "num_pieces": 0}]
    assert pieces.height == 0
    actions, pieces = apply_actions(docs4(), hits_of([]), CUT_CONFIG)
    assert actions.height == 0 and pieces.height == 0 and list(actions.schema) == list(ACTION_SCHEMA)


def test_clean_documents_are_whole_rows_and_pieces_in_the_order_given() -> None:
    # The kept documents come in keep order (here a contaminated source-0 document after a clean
    # source-1 one): the clean rows keep it, a cut document's pieces in its place.
    docs = pl.concat([frame(["zz", "yy"], source_index=1, prefix="a"), frame(["w" * 100])]).with_columns(pl.Series("doc_id", ["a0000", "a0001", "d0001"]))
    docs = pl.concat([docs, frame(["x" * 100])])
    actions = pl.DataFrame([{"doc_id": "d0000", "action": "cut", "num_pieces": 2}, {"doc_id": "a0000", "action": "drop", "num_pieces": 0}], schema=ACTION_SCHEMA)
    pieces = pl.DataFrame(
        [
            {"doc_id": "d0000", "piece": 1, "char_start": 70, "char_end": 100, "text": "x" * 30},
            {"doc_id": "d0000", "piece": 0, "char_start": 0, "char_end": 40, "text": "x" * 40},
        ],
        schema={"doc_id": pl.String, "piece": pl.Int32, "char_start": pl.Int64, "char_end": pl.Int64, "text": pl.String},
    )
    rows = clean_documents(docs, actions, pieces)
    assert rows.select("doc_id", "piece", "char_start", "char_end", "source_index", "row").rows() == [
        ("a0001", None, 0, 2, 1, 1),
        ("d0001", None, 0, 100, 0, 0),
        ("d0000", 0, 0, 40, 0, 0),
        ("d0000", 1, 70, 100, 0, 0),
    ]
    assert rows["source_record_id"].to_list() == ["r1", "r0", "r0", "r0"]
    # Batch by batch gives the same rows.
    batched = pl.concat(clean_batches([docs.slice(0, 2), docs.slice(2, 2)], actions, pieces))
    assert batched.equals(rows)


def test_a_whole_row_sorts_before_the_pieces_of_its_document() -> None:
    # A document id with both a whole row and pieces cannot happen in the pipeline, but the order
    # rule (nulls first) is what puts a piece beside its document.
    docs = frame(["x" * 100])
    pieces = pl.DataFrame([{"doc_id": "d0000", "piece": 0, "char_start": 0, "char_end": 10, "text": "x" * 10}])
    rows = clean_documents(docs, pl.DataFrame(schema=ACTION_SCHEMA), pieces.cast({"piece": pl.Int32}))
    assert rows["piece"].to_list() == [None, 0]


def dedup_rows(**columns) -> pl.DataFrame:
    n = len(columns["doc_id"])
    return pl.DataFrame({"source_record_id": [f"r-{d}" for d in columns["doc_id"]], "family_id": columns.get("cluster_id", [None] * n), **columns})


def test_final_decisions_give_each_document_its_state() -> None:
    dedup = dedup_rows(
        doc_id=["d1", "d2", "d3", "d4"],
        dedup_state=["kept", "duplicate", "kept", "kept"],
        method=[None, "exact", None, None],
        duplicate_of=[None, "d1", None, None],
        cluster_id=["d1", "d1", "d3", "d4"],
        similarity=[None, 1.0, None, None],
    )
    hits = hits_of([("d3", "t/2", 0, 1), ("d3", "t/1", 5, 6), ("d3", "t/2", 9, 10), ("d4", "t/3", 0, 1)])
    actions = pl.DataFrame([{"doc_id": "d3", "action": "cut", "num_pieces": 2}, {"doc_id": "d4", "action": "drop", "num_pieces": 0}], schema=ACTION_SCHEMA)
    final = decisions(dedup, hits, actions)
    assert final.schema == pl.Schema(FINAL_SCHEMA)
    assert final.select("doc_id", "state", "action", "num_pieces", "eval_item_ids").rows() == [
        ("d1", "kept", None, 0, None),
        ("d2", "duplicate", None, 0, None),
        ("d3", "contaminated", "cut", 2, ["t/1", "t/2"]),
        ("d4", "contaminated", "drop", 0, ["t/3"]),
    ]
    assert final.row(1, named=True)["duplicate_of"] == "d1" and final.row(1, named=True)["method"] == "exact"
    assert final["source_record_id"].to_list() == ["r-d1", "r-d2", "r-d3", "r-d4"] and final["family_id"].to_list() == ["d1", "d1", "d3", "d4"]
    # Batches keep their order and give the same rows.
    batched = pl.concat(final_batches([dedup.slice(2, 2), dedup.slice(0, 2)], hits, actions))
    assert batched["doc_id"].to_list() == ["d3", "d4", "d1", "d2"]


def test_a_duplicate_stays_a_duplicate_with_its_eval_items_and_action() -> None:
    # Every document is scanned: a duplicate with hits is removed as a duplicate, and keeps the
    # record of what it matched and what decontamination would have done.
    dedup = dedup_rows(doc_id=["d1", "d2"], dedup_state=["kept", "duplicate"], method=[None, "near"], duplicate_of=[None, "d1"], cluster_id=["d1", "d1"], similarity=[None, 0.9])
    actions = pl.DataFrame([{"doc_id": "d1", "action": "drop", "num_pieces": 0}, {"doc_id": "d2", "action": "drop", "num_pieces": 0}], schema=ACTION_SCHEMA)
    final = decisions(dedup, hits_of([("d1", "t/1", 0, 1), ("d2", "t/1", 0, 1)]), actions)
    assert final.select("state", "action", "eval_item_ids").rows() == [("contaminated", "drop", ["t/1"]), ("duplicate", "drop", ["t/1"])]
