"""Clean documents and the conservation account.

Every input document ends in exactly one state:
- kept: in the clean shards whole (piece is null);
- duplicate: removed, recorded against the kept document it duplicates (cluster id, similarity);
- contaminated: removed whole (action drop) or cut (action cut: the GPT-3 rule, the hit and a
  window either side removed, the remaining pieces of at least `min_piece_chars` in the clean
  shards with their offsets), recorded with the eval items it matched.
Every document is scanned, duplicates too: a duplicate with hits keeps its eval items and the
action decontamination chose for it (not applied: it is already removed). The keep order puts
contaminated documents after clean ones (`tiers_of`), so no document is recorded as a
duplicate of one that decontamination treats worse.
`account_of` (in DuckDB, over the stage's Parquet files; `account` over frames) checks that the
states add up to the input exactly and that the clean rows are exactly the kept documents plus the
pieces of cut ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import duckdb
import polars as pl

from ito_assets.data.config import DecontamConfig
from ito_assets.data.dedup import DUPLICATE, KEPT
from ito_assets.data.exact_dedup import CLEAN_TIER

CONTAMINATED = "contaminated"
STATES = (KEPT, DUPLICATE, CONTAMINATED)
DROP, CUT = "drop", "cut"
# Where the keep order puts a document: clean first, then cut (part of it survives), then dropped.
TIERS = {CUT: CLEAN_TIER + 1, DROP: CLEAN_TIER + 2}

ACTION_SCHEMA = {"doc_id": pl.String, "action": pl.String, "num_pieces": pl.Int32}
PIECE_SCHEMA = {"doc_id": pl.String, "piece": pl.Int32, "char_start": pl.Int64, "char_end": pl.Int64, "text": pl.String}
PROVENANCE = ["source_index", "source_uri", "source_sha256", "license", "row", "source_record_id"]


def tiers_of(actions: pl.DataFrame) -> pl.DataFrame:
    """(doc_id, tier) of the contaminated documents, for the keep order (`exact_dedup.KEEP_ORDER`)."""
    return actions.select("doc_id", pl.col("action").replace_strict(TIERS, return_dtype=pl.Int8).alias("tier"))


@dataclass(frozen=True)
class Conservation:
    num_input: int
    num_kept: int
    num_duplicate: int
    num_contaminated_dropped: int
    num_contaminated_cut: int
    num_clean_rows: int
    num_pieces: int
    problems: tuple[str, ...]
    num_duplicate_contaminated: int = 0  # duplicates that matched eval items too (removed as duplicates)

    @property
    def holds(self) -> bool:
        return not self.problems

    @property
    def num_contaminated(self) -> int:
        return self.num_contaminated_dropped + self.num_contaminated_cut


def cut_pieces(text: str, regions: list[tuple[int, int]], config: DecontamConfig) -> list[tuple[int, int]] | None:
    """Spans that remain after removing each region widened by the window; None when the document
    would be split into more than `max_pieces` pieces (then it is dropped, as in GPT-3)."""
    window = config.cut_window_chars
    widened = sorted((max(0, s - window), min(len(text), e + window)) for s, e in regions)
    merged: list[list[int]] = []
    for start, end in widened:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    spans, cursor = [], 0
    for start, end in merged:
        if start > cursor:
            spans.append((cursor, start))
        cursor = end
    if cursor < len(text):
        spans.append((cursor, len(text)))
    if len(spans) > config.max_pieces:
        return None
    return [(s, e) for s, e in spans if e - s >= config.min_piece_chars]


def apply_actions(docs: pl.DataFrame, hits: pl.DataFrame, config: DecontamConfig) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Scanned documents (doc_id, text) and their hits -> (an action per contaminated document,
    the pieces that survive cutting)."""
    actions: list[dict] = []
    pieces: list[dict] = []
    if hits.height == 0:
        return pl.DataFrame(schema=ACTION_SCHEMA), pl.DataFrame(schema=PIECE_SCHEMA)
    regions = hits.group_by("doc_id").agg(pl.col("char_start"), pl.col("char_end"))
    texts = docs.join(regions, on="doc_id", how="inner").sort("doc_id")
    for doc_id, text, starts, ends in texts.select("doc_id", "text", "char_start", "char_end").iter_rows():
        spans = cut_pieces(text, list(zip(starts, ends)), config) if config.action == CUT else None
        if not spans:
            actions.append({"doc_id": doc_id, "action": DROP, "num_pieces": 0})
            continue
        actions.append({"doc_id": doc_id, "action": CUT, "num_pieces": len(spans)})
        pieces.extend({"doc_id": doc_id, "piece": i, "char_start": s, "char_end": e, "text": text[s:e]} for i, (s, e) in enumerate(spans))
    return pl.DataFrame(actions, schema=ACTION_SCHEMA), pl.DataFrame(pieces, schema=PIECE_SCHEMA)


def clean_batches(batches: Iterable[pl.DataFrame], actions: pl.DataFrame, pieces: pl.DataFrame) -> Iterator[pl.DataFrame]:
    """`clean_documents` a batch of kept documents at a time: a piece stays beside its own
    document, so the batches' clean rows are in the order `clean_documents` gives the whole frame."""
    for batch in batches:
        yield clean_documents(batch, actions, pieces)


def clean_documents(scanned: pl.DataFrame, actions: pl.DataFrame, pieces: pl.DataFrame) -> pl.DataFrame:
    """The clean rows: uncontaminated documents whole, and the pieces of cut ones, with
    provenance, in the order of `scanned` (a cut document's pieces in its place)."""
    scanned = scanned.with_row_index("_order")
    whole = (
        scanned.join(actions, on="doc_id", how="anti")
        .with_columns(
            pl.lit(None, dtype=pl.Int32).alias("piece"),
            pl.lit(0, dtype=pl.Int64).alias("char_start"),
            pl.col("text").str.len_chars().cast(pl.Int64).alias("char_end"),
        )
        .select("_order", "doc_id", "piece", "char_start", "char_end", *PROVENANCE, "text")
    )
    cut = pieces.join(scanned.select("_order", "doc_id", *PROVENANCE), on="doc_id").select(whole.columns)
    return pl.concat([whole, cut]).sort("_order", "piece", nulls_last=False).drop("_order")


FINAL_SCHEMA = {
    "doc_id": pl.String,
    "source_record_id": pl.String,
    "state": pl.String,
    "method": pl.String,
    "duplicate_of": pl.String,
    "cluster_id": pl.String,
    "similarity": pl.Float64,
    "family_id": pl.String,
    "eval_item_ids": pl.List(pl.String),
    "action": pl.String,
    "num_pieces": pl.Int32,
}


def final_batches(dedup: Iterable[pl.DataFrame], hits: pl.DataFrame, actions: pl.DataFrame) -> Iterator[pl.DataFrame]:
    """One row per input document, its final state and why (FINAL_SCHEMA), a batch of the
    deduplication's decisions at a time and in their order. A duplicate stays a duplicate, with
    its eval items and decontamination's action for it if it has hits. Only the contaminated
    documents' rows (hits, actions) are held whole: no sort, no frame of every document."""
    items = hits.group_by("doc_id").agg(pl.col("eval_item_id").unique().sort().alias("eval_item_ids"))
    for batch in dedup:
        yield (
            batch.join(actions, on="doc_id", how="left", maintain_order="left")
            .join(items, on="doc_id", how="left", maintain_order="left")
            .with_columns(
                pl.when(pl.col("dedup_state") == DUPLICATE).then(pl.lit(DUPLICATE))
                .when(pl.col("action").is_not_null()).then(pl.lit(CONTAMINATED))
                .otherwise(pl.lit(KEPT))
                .alias("state"),
                pl.col("num_pieces").fill_null(0),
            )
            .select(list(FINAL_SCHEMA))
            .cast(FINAL_SCHEMA)
        )


def decisions(dedup: pl.DataFrame, hits: pl.DataFrame, actions: pl.DataFrame) -> pl.DataFrame:
    """`final_batches` of a whole frame of decisions."""
    return pl.concat([pl.DataFrame(schema=FINAL_SCHEMA), *final_batches([dedup], hits, actions)])


def account(input_ids: pl.Series, final: pl.DataFrame, clean: pl.DataFrame) -> Conservation:
    """`account_of` over frames."""
    with duckdb.connect() as db:
        db.register("input_documents", input_ids.to_frame("doc_id"))
        db.register("final_decisions", final)
        db.register("clean_rows", clean.select("doc_id", "piece"))
        return account_of(db)


def account_of(db: duckdb.DuckDBPyConnection) -> Conservation:
    """Check that every input document is in exactly one state and the clean rows match them.
    Relations: `input_documents` (doc_id), `final_decisions` (FINAL_SCHEMA), `clean_rows`
    (doc_id, piece: null for a whole document). Counts and anti-joins only, in DuckDB."""

    def count(rows: str) -> int:  # rows: what follows FROM
        return int(db.execute(f"SELECT count(*) FROM {rows}").fetchone()[0])

    def differ(left: str, right: str) -> bool:  # two queries of doc_id: not the same set
        return bool(count(f"({left}) ANTI JOIN ({right}) USING (doc_id)") or count(f"({right}) ANTI JOIN ({left}) USING (doc_id)"))

    states = dict(db.execute("SELECT state, count(*) FROM final_decisions GROUP BY state").fetchall())
    counts = {state: int(states.get(state, 0)) for state in STATES}
    num_input = count("input_documents")
    decided = "SELECT doc_id FROM final_decisions"
    whole = "SELECT doc_id FROM clean_rows WHERE piece IS NULL"
    problems: list[str] = []
    if count("(SELECT DISTINCT doc_id FROM final_decisions)") != count("final_decisions"):
        problems.append("a document has more than one decision")
    if differ(decided, "SELECT doc_id FROM input_documents"):
        problems.append("the decisions and the input documents differ")
    if sum(counts.values()) != num_input:
        problems.append("the states do not add up to the input")
    if count(f"(SELECT DISTINCT doc_id FROM ({whole}))") != count(f"({whole})") or differ(whole, f"{decided} WHERE state = '{KEPT}'"):
        problems.append("the whole documents in the clean shards are not exactly the kept ones")
    cut = f"SELECT doc_id, num_pieces FROM final_decisions WHERE state = '{CONTAMINATED}' AND action = '{CUT}'"
    pieces = "SELECT doc_id, count(*) AS found FROM clean_rows WHERE piece IS NOT NULL GROUP BY doc_id"
    if count(f"({cut}) FULL JOIN ({pieces}) USING (doc_id) WHERE num_pieces IS DISTINCT FROM found"):
        problems.append("the pieces in the clean shards do not match the cut documents")
    if count("final_decisions WHERE action IS NOT NULL AND coalesce(len(eval_item_ids), 0) = 0"):
        problems.append("a contaminated document has no eval item")
    if count(f"final_decisions WHERE state = '{CONTAMINATED}' AND action IS NULL"):
        problems.append("a contaminated document has no action")
    duplicates = f"SELECT * FROM final_decisions WHERE state = '{DUPLICATE}'"
    if count(f"({duplicates}) WHERE duplicate_of IS NULL OR cluster_id IS NULL"):
        problems.append("a duplicate has no kept document or cluster")
    survivors = f"SELECT doc_id AS duplicate_of FROM final_decisions WHERE state <> '{DUPLICATE}'"
    if count(f"({duplicates}) ANTI JOIN ({survivors}) USING (duplicate_of)"):
        problems.append("a duplicate is recorded against a document that was not kept by deduplication")
    tier = lambda column: f"CASE {column} WHEN '{CUT}' THEN {TIERS[CUT]} WHEN '{DROP}' THEN {TIERS[DROP]} ELSE {CLEAN_TIER} END"  # noqa: E731
    if count(f"({duplicates}) d JOIN final_decisions k ON k.doc_id = d.duplicate_of WHERE {tier('k.action')} > {tier('d.action')}"):
        problems.append("a document was removed as a duplicate of one that decontamination treats worse")
    dropped = count(f"final_decisions WHERE state = '{CONTAMINATED}' AND action = '{DROP}'")
    num_clean_rows = count("clean_rows")
    return Conservation(
        num_input=num_input,
        num_kept=counts[KEPT],
        num_duplicate=counts[DUPLICATE],
        num_contaminated_dropped=dropped,
        num_contaminated_cut=counts[CONTAMINATED] - dropped,
        num_clean_rows=num_clean_rows,
        num_pieces=num_clean_rows - count(f"({whole})"),
        problems=tuple(problems),
        num_duplicate_contaminated=count(f"final_decisions WHERE state = '{DUPLICATE}' AND action IS NOT NULL"),
    )
