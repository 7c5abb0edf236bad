"""Configuration of the data-preparation stage: one frozen, keyword-only dataclass per step.

Every default names where it comes from. Values are validated on construction with a ValueError
that names the field, so a bad configuration fails before any document is read.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Literal

DecontamAction = Literal["drop", "cut"]


def _require(condition: bool, name: str, rule: str) -> None:
    if not condition:
        raise ValueError(f"{name} {rule}")


@dataclass(frozen=True, kw_only=True)
class DedupConfig:
    """Exact and near-duplicate removal (MinHash LSH with verification).

    - shingle_size 5 words and threshold 0.8: Lee et al. (2022), "Deduplicating Training Data Makes
      Language Models Better" (NearDup: word 5-grams, Jaccard >= 0.8); datatrove's MinhashConfig
      also shingles word 5-grams.
    - bands x rows = 20 x 6 (num_perm 120): the S-curve 1 - (1 - J^6)^20 makes a pair at J = 0.8 a
      candidate with probability 0.9977 (0.23% missed; at J = 0.85, 0.01%), where datatrove's 14 x 8
      misses 7.6% at J = 0.8. The price is more candidates below the threshold (61% at J = 0.6),
      which verification discards cheaply.
    - verify "exact": a removal needs the exact Jaccard of the shingle sets >= threshold (the
      signature estimate has a standard deviation of sqrt(J(1-J)/num_perm) = 0.037 at J = 0.8,
      which would make ~30% of removals near the threshold unjustified). "signature" trusts the
      estimate alone. Either way, pairs whose estimate is below threshold - prefilter_margin are
      not verified (margin 0.15 = 4 standard deviations at J = 0.8: a true 0.8 pair is lost with
      probability 3e-5).
    - bucket_anchors 128: a band's bucket pairs each member with its first 128 members in keep
      order, not with every other member (0: every two). A cluster of m near-copies in one bucket
      (licence headers, boilerplate, short replies) gave m(m-1)/2 candidates in every band it
      shares: 4,000 licences differing in their copyright line, 8.0 million pairs and a 3.6 GB
      peak (the whole data stage); at 128, 0.91 million pairs, 1.9 s and 473 MB (deduplication
      alone), the same documents removed. A pair is a candidate where any band pairs it, so two
      copies late in a big bucket still meet where another band holds them apart from the rest: a
      reviewer's 800 pages of one template, each with a one-word copy, lost no copy at 128 or at 32
      (with a pair taken only from its first shared band, 173 were kept). A bucket of up to 129
      members is paired whole; the fixtures' largest holds 18.
    """

    shingle_size: int = 5
    num_perm: int = 120
    bands: int = 20
    rows: int = 6
    threshold: float = 0.8
    verify: Literal["exact", "signature"] = "exact"
    prefilter_margin: float = 0.15
    bucket_anchors: int = 128
    seed: int = 1
    # Above this share of removed documents the WARN check fires: the fixture corpora lose ~15%
    # (stdlib re-exports and inherited docstrings); a source listed twice would lose >= 50%.
    warn_duplicate_rate: float = 0.4

    def __post_init__(self) -> None:
        _require(1 <= self.shingle_size <= 32, "shingle_size", "must be between 1 and 32 words")
        _require(self.bands >= 1 and self.rows >= 1, "bands", "and rows must be positive")
        _require(self.bucket_anchors >= 0, "bucket_anchors", "must be 0 (off) or positive")
        _require(self.bands * self.rows <= self.num_perm, "num_perm", "must be at least bands x rows")
        _require(0.0 < self.threshold <= 1.0, "threshold", "must be in (0, 1]")
        _require(self.verify in ("exact", "signature"), "verify", "must be 'exact' or 'signature'")
        _require(0.0 <= self.prefilter_margin < 1.0, "prefilter_margin", "must be in [0, 1)")
        _require(0.0 < self.warn_duplicate_rate <= 1.0, "warn_duplicate_rate", "must be in (0, 1]")

    @property
    def lsh_threshold(self) -> float:
        """Where the banding S-curve crosses 1/2, approximately (1/b)^(1/r)."""
        return (1.0 / self.bands) ** (1.0 / self.rows)


@dataclass(frozen=True, kw_only=True)
class DecontamConfig:
    """N-gram decontamination against the eval suite.

    - ngram_size 13: GPT-3 (Brown et al. 2020, appendix C): a document is contaminated by an item
      when 13 of the item's words (normalised) are matched; views shorter than 13 / min_overlap
      words need min_overlap of their words instead (the shorter n for short items).
    - min_overlap 0.7: PaLM (Chowdhery et al. 2022, section 8) calls an example contaminated when
      70% of its 8-grams occur in the training data. Here the 70% is of a short view's words, which
      is looser: a 10-word view needs 7 matched words in a row, where 70% of its three 8-grams
      needs all 10, and any edit would hide it. The looser rule finds an edited short item; its
      price is that a common opening of 7 words ("what is the name of the largest") flags another
      question that shares it, unless the opening is common enough to be ignored (below).
    - seed_ngram_size 6: matches are found through shared word 6-grams ("seeds"). An edit breaks
      every seed that spans it, so a seed shorter than the evidence keeps an edited question
      detectable: with two edits in 25 words, the unedited stretches of >= 6 words always cover
      >= 13 words. Short views use seeds of half their length, never below min_seed_ngram_size.
      Where a seed leaves 1 to n words of its view after it (before it), the longest run of them
      up to the view's end (from its start) that the document holds next to the seed, at its
      alignment or one word off (one word replaced, dropped or inserted), counts too: no seed fits
      in a tail shorter than a seed, so one edit near the end of a short view would otherwise
      leave it a word short.
    - window_bytes 20: join windows (eval_index) hash the 20 bytes of a view's words written end to
      end from a word start, where punctuation alone joined two words (a copy that deletes it
      merges them). 20 letters are about 4 English words (4.79 letters a word: Norvig 2013,
      "English Letter Frequency Counts: Mayzner Revisited", Google Books n-grams), the
      min_seed_ngram_size seed. A common window is ignored like a common seed, measured against
      the median of its view's word seeds.
    - common_min_docs 10: GPT-3 ignored 13-grams with more than 10 hits (common phrases, legal
      boilerplate). A plain cut would also hide a benchmark copied into many documents, so a seed
      is ignored only when it is also common_relative_factor times more frequent than the median
      seed of its own item view.
    - cut_window_chars 200, min_piece_chars 200, max_pieces 10: the GPT-3 rule for "cut": remove
      the match and 200 characters either side, drop pieces under 200 characters, drop the whole
      document when it would be split into more than 10 pieces.
    """

    ngram_size: int = 13
    min_overlap: float = 0.7
    seed_ngram_size: int = 6
    min_seed_ngram_size: int = 4
    min_view_words: int = 8
    min_answer_words: int = 13
    common_min_docs: int = 10
    common_relative_factor: float = 4.0
    # A seed whose distinct tokens are fewer than this share of its length (a run of numbers
    # becomes "0 0 0 ..." after digit normalisation) or whose number tokens exceed it never counts.
    degenerate_fraction: float = 0.5
    window_bytes: int = 20
    action: DecontamAction = "drop"
    cut_window_chars: int = 200
    min_piece_chars: int = 200
    max_pieces: int = 10

    def __post_init__(self) -> None:
        _require(4 <= self.ngram_size <= 50, "ngram_size", "must be between 4 and 50 (the manifest schema's range)")
        _require(0.0 < self.min_overlap <= 1.0, "min_overlap", "must be in (0, 1]")
        _require(2 <= self.min_seed_ngram_size <= self.seed_ngram_size, "min_seed_ngram_size", "must be between 2 and seed_ngram_size")
        _require(self.seed_ngram_size <= self.ngram_size, "seed_ngram_size", "must not exceed ngram_size")
        _require(self.min_view_words >= self.min_seed_ngram_size, "min_view_words", "must be at least min_seed_ngram_size")
        _require(self.min_answer_words >= 1, "min_answer_words", "must be positive")
        _require(self.common_min_docs >= 1, "common_min_docs", "must be positive")
        _require(self.common_relative_factor >= 1.0, "common_relative_factor", "must be at least 1")
        _require(0.0 < self.degenerate_fraction < 1.0, "degenerate_fraction", "must be in (0, 1)")
        _require(8 <= self.window_bytes <= 64, "window_bytes", "must be between 8 and 64")
        _require(self.action in ("drop", "cut"), "action", "must be 'drop' or 'cut'")
        _require(self.cut_window_chars >= 0 and self.min_piece_chars >= 0, "cut_window_chars", "and min_piece_chars must be >= 0")
        _require(self.max_pieces >= 1, "max_pieces", "must be positive")

    def seed_size(self, view_len: int) -> int:
        """Seed n-gram size for a view of `view_len` words: the shorter n for short items."""
        return max(self.min_seed_ngram_size, min(self.seed_ngram_size, view_len // 2))

    def evidence_words(self, view_len: int) -> int:
        """Matched words needed to call a view contaminated: 13, or min_overlap of a short view."""
        return min(self.ngram_size, max(1, math.ceil(self.min_overlap * view_len - 1e-9)))


@dataclass(frozen=True, kw_only=True)
class ParaphraseConfig:
    """Embedding candidates for eval items restated in other words (off unless asked for).

    Defaults measured by `benchmarks/paraphrase.py` on paraphrases of the fixture suite (918
    plants, 553 hard negatives) and the 2,981 clean fixture documents (docs/performance.md,
    "Paraphrase candidates", 2026-12-02):

    - window_words 24, stride_words 8: fixture questions run 17-35 words, 24 on average. Swept
      from 16/4 to 32/16, each window/stride at its lowest threshold that flags no clean document
      recovers 3.0-6.6% of the 361 paraphrases the n-gram rule misses: 24/8 5.8% with 9 of 553
      hard negatives flagged, 24/4 6.1% with 12 (twice the windows), 20/4 6.6% with 21. Longer
      windows dilute the item (32/16: 3.0%).
    - threshold 0.9: the lowest swept cosine that flags none of the clean fixture documents (0.875
      and 0.85 flag 1, 0.8 flags 19); it flags 9 of the 553 hard negatives.
    - batch_windows 1,024: a batch holds the vectors of its distinct words (at most batch x
      stride + window), a sparse window x word count matrix (batch x window entries) and batch x
      (256 + views) floats: a few MB with the fixture suite's 410 views.
    """

    threshold: float = 0.9
    window_words: int = 24
    stride_words: int = 8
    batch_windows: int = 1024

    def __post_init__(self) -> None:
        _require(0.0 < self.threshold <= 1.0, "threshold", "must be in (0, 1]")
        _require(4 <= self.window_words <= 512, "window_words", "must be between 4 and 512")
        # A stride past the window would leave words that no window sees.
        _require(1 <= self.stride_words <= self.window_words, "stride_words", "must be between 1 and window_words")
        _require(1 <= self.batch_windows <= 65_536, "batch_windows", "must be between 1 and 65,536")


ENGINES = ("local", "ray")
# DuckDB's documented minimum of 125 MB per thread, rounded up to a power of two.
MIN_MB_PER_DUCKDB_THREAD = 128


@dataclass(frozen=True, kw_only=True)
class ScaleConfig:
    """How one data step spreads its work over a machine. None of these changes a result (the
    streamed and in-memory paths agree exactly: tests/data/test_dedup_units.py,
    test_dedup_memory.py, test_decontam_units.py); they bound memory.

    - unit_bytes 8 MiB: the documents are cut into work units of about this many bytes of text;
      a unit's shingling, signatures and decontamination scan are independent steps. A worker
      on an 8 MiB unit peaked at ~350 MB RSS, ~200 MB of it the interpreter with polars, DuckDB
      and numpy loaded (benchmarks/data_scaling.py): ~18x the unit's text on top (token and
      shingle hashes, polars' word lists), so a worker stays near 350 MB whatever the corpus.
      It also sizes the buckets of `bucket_sort`, which puts text into keep order: one bucket,
      sorted in the step's own process, holds about a unit's text.
    - num_workers 1: worker processes per step (1 runs the units in the step's own process).
    - engine "local": where the units run; "ray" sends each unit to a Ray cluster as a task
      (`ray_engine.py`), which then decides the parallelism; the band join's partitions go
      the same way, and the other global steps stay in the step's process either way.
    - memory_limit_mb 512: DuckDB's buffer-manager cap for the out-of-core joins and sorts (keep
      order, exact-copy groups: ids and hashes, never text; the band join's partitions share it,
      `partition_memory_mb` each); past it DuckDB spills to the step's scratch folder (DuckDB docs, "Memory management"). Its
      default, 80% of RAM, would crowd the workers.
      DuckDB asks for at least 125 MB per thread (DuckDB docs, "Tuning workloads"), so the
      scratch database runs min(num_workers, memory_limit_mb // 128) threads: measured on a
      120 MB corpus, 2 threads under a 128 MB cap ran out of memory where 1 thread spilled, and
      under 64 MB even 1 thread did (hence the 128 MB floor).
    - pair_batch 16,384 candidate pairs per verification batch: a batch gathers the shingle sets
      of both documents of each pair, ~2 x 16k x 300 x 8 bytes = 80 MB for 300-shingle documents.
    - partition_rows 16M: the LSH band join is hash-partitioned by bucket key (`band_join`), one
      partition per this many band rows (at least one per worker); each partition is a task with
      its own DuckDB under `partition_memory_mb`. Measured on this project's 2-core VM: 20M band
      rows (1M documents of 20 bands) joined in 4.6 s under a 512 MB cap on one thread, so a
      partition is seconds of work, never a node's memory.
    - in_memory_mb 32: with one worker, a corpus of at most this many MB of text is deduplicated
      in the step's memory (`dedup_memory`), without the streamed path's files and joins; 0
      always streams. Measured on 20.9 MB of short documents (benchmarks/dedup_speed.py): the
      process's peak 327 MB above its 229 MB before deduplication, about 16x the text, against
      233 MB streamed; so 32 MB of text stays near 0.5 GB.
    - in_memory_documents 250,000: and at most this many documents, for a document costs about
      1.4 kB in memory whatever its length (its ids, signature, band keys, decision row): 2.7 M
      documents of about 7 bytes (29.9 MB counted as text) peaked at 3.9 GB in memory, 2.4 GB
      streamed (this project's review of 2026-12-06). 250,000 of them stay near 0.35 GB.
    """

    unit_bytes: int = 8 * 2**20
    num_workers: int = 1
    memory_limit_mb: int = 512
    pair_batch: int = 16_384
    engine: str = "local"
    partition_rows: int = 16_000_000
    in_memory_mb: int = 32
    in_memory_documents: int = 250_000

    @property
    def duckdb_threads(self) -> int:
        return max(1, min(self.num_workers, self.memory_limit_mb // MIN_MB_PER_DUCKDB_THREAD))

    @property
    def partition_memory_mb(self) -> int:
        """Each band-join partition's DuckDB cap: the workers that run partitions at once share the
        step's cap, down to DuckDB's floor for one thread."""
        return max(MIN_MB_PER_DUCKDB_THREAD, self.memory_limit_mb // self.num_workers)

    def __post_init__(self) -> None:
        _require(self.unit_bytes >= 1, "unit_bytes", "must be positive")
        _require(self.num_workers >= 1, "num_workers", "must be positive")
        _require(self.memory_limit_mb >= MIN_MB_PER_DUCKDB_THREAD, "memory_limit_mb", f"must be at least {MIN_MB_PER_DUCKDB_THREAD} (DuckDB's floor for one thread)")
        _require(self.pair_batch >= 1, "pair_batch", "must be positive")
        _require(self.partition_rows >= 1, "partition_rows", "must be positive")
        _require(self.in_memory_mb >= 0, "in_memory_mb", "must be 0 or more")
        _require(self.in_memory_documents >= 0, "in_memory_documents", "must be 0 or more")
        _require(self.engine in ENGINES, "engine", f"must be one of {', '.join(ENGINES)}")


@dataclass(frozen=True, kw_only=True)
class DataPrepConfig:
    dedup: DedupConfig = field(default_factory=DedupConfig)
    decontam: DecontamConfig = field(default_factory=DecontamConfig)
    # Embedding candidates for paraphrased eval items, a report for review beside the n-gram hits
    # (`data.paraphrase`); off unless asked for: on the project's benchmark they add little over
    # the n-gram rule at 8-16x its time (docs/performance.md, "Paraphrase candidates").
    paraphrase: ParaphraseConfig | None = None
    # Not in `as_metadata`: how the work is spread never changes what it produces.
    scale: ScaleConfig = field(default_factory=ScaleConfig)
    # Rows per Parquet shard: ~50k documents of a few kB keep a shard near 100 MB, the size that
    # Parquet readers and object stores handle best (Apache Parquet docs: 512 MB-1 GB row groups
    # for HDFS; smaller files for local, parallel reads).
    shard_max_rows: int = 50_000

    def __post_init__(self) -> None:
        _require(self.shard_max_rows >= 1, "shard_max_rows", "must be positive")

    def as_metadata(self) -> dict:
        """Flat parameters for the materialisation metadata (what a data engineer sees in the UI)."""
        flat = {f"dedup.{k}": v for k, v in asdict(self.dedup).items()}
        flat.update({f"decontam.{k}": v for k, v in asdict(self.decontam).items()})
        flat["shard_max_rows"] = self.shard_max_rows
        if self.paraphrase is not None:
            flat.update({f"paraphrase.{k}": v for k, v in asdict(self.paraphrase).items()})
        return flat
