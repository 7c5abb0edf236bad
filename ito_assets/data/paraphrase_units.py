"""Paraphrase candidates over work units: the source shards' own rows (`units.shard_units`), a
unit a task on the step's pool (or in its process, for one worker), so no document's text passes
through the step's process. A window's match depends on its own document only, and a unit never
splits a document, so the units' candidates together are the corpus's (`find_candidates`); the
units are the same whatever the number of workers, hence so are the batches and the bytes.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import polars as pl

from ito_assets.data.config import ParaphraseConfig
from ito_assets.data.paraphrase import CANDIDATE_SCHEMA, ItemVectors, WordEmbedder, find_candidates, item_vectors, load_embedder
from ito_assets.data.scratch import Scratch
from ito_assets.data.shards import Shard
from ito_assets.data.units import WorkUnit, map_units, shard_units, worker_pool
from ito_assets.evals.suite import EvalSuite

# The report's rows: a candidate and the user's own id of its document.
REPORT_SCHEMA = {**CANDIDATE_SCHEMA, "source_record_id": pl.String}


@functools.cache
def _embedder() -> WordEmbedder:
    """Loaded once per process: a worker keeps it for all its units."""
    return load_embedder()


def items_digest(items: ItemVectors) -> str:
    """SHA-256 of the item views and their vectors: what a unit's candidates were matched against."""
    digest = hashlib.sha256()
    for names in (items.item_ids, items.benchmarks, items.views):
        digest.update("\x1f".join(names).encode() + b"\x1e")
    digest.update(items.vectors.tobytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class ParaphraseTask:
    unit: WorkUnit
    items: ItemVectors
    items_digest: str
    config: ParaphraseConfig

    def key(self) -> dict:
        return {"unit": self.unit.key(), "items": self.items_digest, "config": asdict(self.config)}

    def inputs(self) -> tuple[str, ...]:
        return (self.unit.path,)

    def outputs(self) -> tuple[str, ...]:
        return ()


def paraphrase_unit(task: ParaphraseTask) -> pl.DataFrame:
    """One unit's candidates (REPORT_SCHEMA), ordered by document and offset."""
    docs = task.unit.read(["doc_id", "source_record_id", "text"])
    candidates = find_candidates(docs.select("doc_id", "text").iter_rows(), task.items, _embedder(), task.config)
    ids = docs.select("doc_id", "source_record_id").filter(pl.col("doc_id").is_in(candidates["doc_id"].implode()))
    return candidates.join(ids, on="doc_id", how="left", maintain_order="left").cast(REPORT_SCHEMA)


def paraphrase_shards(scratch: Scratch, shards: Sequence[Shard], suite: EvalSuite, config: ParaphraseConfig) -> pl.DataFrame:
    """The suite's possible paraphrases in the source shards (verified against their digests by
    the caller), REPORT_SCHEMA, ordered by document, offset and eval item as `find_candidates`
    orders them. A rerun after a failure redoes only the units that did not finish."""
    items = item_vectors(suite, _embedder())
    digest = items_digest(items)
    units = shard_units(shards, scratch.scale.unit_bytes)
    tasks = [ParaphraseTask(unit=u, items=items, items_digest=digest, config=config) for u in units]
    with worker_pool(scratch.scale.num_workers, scratch.scale.engine) as pool:
        found = map_units(paraphrase_unit, tasks, pool, phase="paraphrase candidates", markers=scratch.finished("paraphrase-candidates"),
                          known={shard.path: shard.sha256 for shard in shards})
    report = pl.concat([pl.DataFrame(schema=REPORT_SCHEMA), *found])
    return report.sort("doc_id", "char_start", "eval_item_id", maintain_order=True)
