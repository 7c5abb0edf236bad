"""Run configuration of the data stage (editable in the launchpad), defaulting to the core's
documented defaults (`ito_assets.data.config`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import dagster as dg

from ito_assets.data.config import DataPrepConfig, DecontamConfig, DedupConfig, ParaphraseConfig, ScaleConfig

_DEDUP = DedupConfig()
_DECONTAM = DecontamConfig()
_SCALE = ScaleConfig()
_SCALE_FIELDS = {"num_workers", "unit_bytes"}
_PARAPHRASE = ParaphraseConfig()
_PARAPHRASE_FIELDS = {"paraphrase_candidates", "paraphrase_threshold"}


class ScaleParams(dg.Config):
    """How a step spreads its work over the machine; never what it produces."""

    num_workers: int = _SCALE.num_workers
    unit_bytes: int = _SCALE.unit_bytes

    def scale(self, engine: str) -> ScaleConfig:
        """`engine` is the instance's (ITO_DATA_ENGINE), not a run's choice: it changes no result."""
        return ScaleConfig(num_workers=self.num_workers, unit_bytes=self.unit_bytes, engine=engine)

    def to_config(self, engine: str = "local") -> DataPrepConfig:
        return DataPrepConfig(scale=self.scale(engine))


class DedupParams(ScaleParams):
    shingle_size: int = _DEDUP.shingle_size
    num_perm: int = _DEDUP.num_perm
    bands: int = _DEDUP.bands
    rows: int = _DEDUP.rows
    threshold: float = _DEDUP.threshold
    verify: Literal["exact", "signature"] = _DEDUP.verify
    # Each member of a band's bucket is paired with the bucket's first this many in keep order.
    bucket_anchors: int = _DEDUP.bucket_anchors
    warn_duplicate_rate: float = _DEDUP.warn_duplicate_rate
    # Band rows per partition of the LSH band join (at least one partition per worker): how the
    # join is spread, never what it finds.
    partition_rows: int = _SCALE.partition_rows
    # MB of text and documents up to which one worker deduplicates in memory, without the
    # streamed path's files (0 MB: always streamed): never what it finds.
    in_memory_mb: int = _SCALE.in_memory_mb
    in_memory_documents: int = _SCALE.in_memory_documents

    def to_config(self, engine: str = "local") -> DataPrepConfig:
        scale = replace(self.scale(engine), partition_rows=self.partition_rows, in_memory_mb=self.in_memory_mb,
                        in_memory_documents=self.in_memory_documents)
        extra = {"partition_rows", "in_memory_mb", "in_memory_documents"}
        return DataPrepConfig(dedup=DedupConfig(**self.model_dump(exclude=_SCALE_FIELDS | extra)), scale=scale)


class DecontamParams(ScaleParams):
    """n (ngram_size) comes from the manifest's decontamination provenance, not from here."""

    seed_ngram_size: int = _DECONTAM.seed_ngram_size
    min_overlap: float = _DECONTAM.min_overlap
    common_min_docs: int = _DECONTAM.common_min_docs
    action: Literal["drop", "cut"] = _DECONTAM.action
    cut_window_chars: int = _DECONTAM.cut_window_chars
    # Possible paraphrases by embedding similarity, reported for review and never removed; off by
    # default (little gain over the n-gram rule on the benchmark, at 8-16x its time).
    paraphrase_candidates: bool = False
    paraphrase_threshold: float = _PARAPHRASE.threshold

    def to_config(self, engine: str = "local") -> DataPrepConfig:
        paraphrase = ParaphraseConfig(threshold=self.paraphrase_threshold) if self.paraphrase_candidates else None
        decontam = DecontamConfig(**self.model_dump(exclude=_SCALE_FIELDS | _PARAPHRASE_FIELDS))
        return DataPrepConfig(decontam=decontam, scale=self.scale(engine), paraphrase=paraphrase)
