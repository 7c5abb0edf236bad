"""ito_assets.data.clean_units: the clean shards written in parts, a kept shard a task, are the
bytes the one pass writes.

The corpus is text we did not write (the installed packages' descriptions, a paragraph a
document), with eval questions planted in some paragraphs and exact copies of others, so that
the clean step meets whole documents, dropped ones, cut ones (their pieces) and duplicates."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import polars as pl
import pytest

from corpus_manifest import corpus_manifest
from ito_assets.data import clean, decontam_units, stages
from ito_assets.data.config import DataPrepConfig, DecontamConfig, ScaleConfig
from ito_assets.digests import file_sha256
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.evals.suite import load_suite
from ito_assets.manifest.verify import VerifiedManifest
from ito_assets.settings import PROJECT_ROOT
from test_source_pieces import _threads, package_paragraphs

FIXTURES = PROJECT_ROOT / "data" / "fixtures"
SUITE = load_suite(FIXTURES / "evals" / "ito-fixture-evals-v1.jsonl")
KEPT_ROWS = 37  # rows per kept (and clean) shard: tens of kept shards, so tens of tasks


@dataclass
class Upstream:
    root: Path
    verified: VerifiedManifest
    source: stages.SourceStage
    decontam: stages.DecontamStage
    dedup: stages.DedupStage


def _records() -> list[dict]:
    questions = [item.question for item in SUITE.items]
    records = []
    for i, text in enumerate(package_paragraphs()):
        if i % 13 == 0:  # a planted question, in the middle of the paragraph: cut around it, or dropped
            text = f"{text} {questions[i % len(questions)]} {text}"
        records.append({"id": f"p{i}", "text": text})
        if i % 7 == 0:
            records.append({"id": f"p{i}-copy", "text": text})
    return records


def _upstream(root: Path, action: str, records: list[dict] | None = None) -> Upstream:
    """The sources, decontamination and deduplication of the corpus under `root` (one worker)."""
    verified = corpus_manifest(root, records or _records())
    config = _config(action, num_workers=1)
    state, warehouse = root / "upstream", root / "upstream" / "warehouse.duckdb"
    source = stages.run_sources(verified, root, state, warehouse, config)
    decontam = stages.run_decontam(verified, SUITE, source, state, warehouse, config)
    dedup = stages.run_dedup(source, decontam.actions, state, warehouse, config)
    return Upstream(root, verified, source, decontam, dedup)


def _config(action: str, shard_max_rows: int = KEPT_ROWS, **scale) -> DataPrepConfig:
    return DataPrepConfig(decontam=DecontamConfig(action=action), scale=ScaleConfig(**scale), shard_max_rows=shard_max_rows)


def _clean(up: Upstream, state: str, shard_max_rows: int = KEPT_ROWS, **scale) -> stages.CleanStage:
    folder = up.root / state
    return stages.run_clean(up.verified, up.source, up.dedup, up.decontam, folder, folder / "warehouse.duckdb",
                            _config(up.decontam.config["action"], shard_max_rows, **scale))


def _digests(stage: stages.CleanStage) -> dict:
    return {"shards": [s.sha256 for s in stage.shards.shards], "rows": [s.num_rows for s in stage.shards.shards],
            "decisions": stage.decisions.sha256, "conservation": vars(stage.conservation)}


@pytest.fixture(scope="module")
def cut(tmp_path_factory) -> Upstream:
    return _upstream(tmp_path_factory.mktemp("clean-cut").resolve(), "cut")


@pytest.fixture(scope="module")
def drop(tmp_path_factory) -> Upstream:
    return _upstream(tmp_path_factory.mktemp("clean-drop").resolve(), "drop")


# Kept and clean shards of 37 rows (tens of tasks), of 7 (clean shards cut across many kept
# ones) and of 100,000 (one clean shard from every kept file); dropped documents at 37.
@pytest.mark.parametrize(("action", "shard_max_rows"), [pytest.param("cut", KEPT_ROWS, marks=pytest.mark.long), ("cut", 7), ("cut", 100_000), ("drop", KEPT_ROWS)])
def test_the_parts_are_the_one_pass_s_clean_shards(request, action, shard_max_rows):
    upstream = request.getfixturevalue(action)
    one_pass = _clean(upstream, f"one-{shard_max_rows}", shard_max_rows)
    parts = _clean(upstream, f"parts-{shard_max_rows}", shard_max_rows, num_workers=2)
    assert _digests(parts) == _digests(one_pass)
    assert len(upstream.dedup.kept.shards) > 20 and one_pass.conservation.holds
    c = one_pass.conservation
    assert c.num_duplicate > 0 and c.num_contaminated_dropped + c.num_contaminated_cut > 0
    if action == "cut":
        assert c.num_contaminated_cut > 0 and c.num_pieces > c.num_contaminated_cut  # pieces on either side of a question
    # A cut document's pieces stay beside it: the clean rows are the kept documents' order.
    rows = pl.concat([pl.read_parquet(s.path, columns=["doc_id", "piece"]) for s in parts.shards.shards])
    kept = upstream.dedup.kept.read(["doc_id"])["doc_id"].to_list()
    assert rows.unique("doc_id", keep="first", maintain_order=True)["doc_id"].to_list() == [d for d in kept if d in set(rows["doc_id"])]


def test_the_dedup_stage_starts_its_workers_once(cut, tmp_path, monkeypatch):
    """Exact copies, signatures, the band join and the kept shards share the stage's pool (a
    start imports polars, numpy and DuckDB in each worker), and write the one-worker stage's bytes."""
    from ito_assets.data import units

    started = []

    @contextmanager
    def counted(num_workers, engine):
        started.append(num_workers)
        with _threads(num_workers, engine) as pool:
            yield pool

    monkeypatch.setattr(units, "_new_pool", counted)
    config = _config("cut", num_workers=2)
    stage = stages.run_dedup(cut.source, cut.decontam.actions, tmp_path, tmp_path / "warehouse.duckdb", config)
    assert started == [2]
    assert stage.decisions.sha256 == cut.dedup.decisions.sha256
    assert [s.sha256 for s in stage.kept.shards] == [s.sha256 for s in cut.dedup.kept.shards]


def test_a_kept_document_s_pieces_are_written_by_the_task_of_its_shard(cut, tmp_path):
    """Each task reads only its own documents' actions and pieces, and writes them as the whole
    frame's `clean_documents` would."""
    from ito_assets.data.clean_units import CleanTask, clean_shard

    decontam, kept = cut.decontam, cut.dedup.kept
    assert decontam.pieces.num_rows > 0
    for i, shard in enumerate(kept.shards[:5]):
        task = CleanTask(kept=shard, actions=decontam.actions, pieces=decontam.pieces, output=str(tmp_path / f"rows-{i}.parquet"))
        expected = clean.clean_documents(pl.read_parquet(shard.path), pl.read_parquet(decontam.actions.path), pl.read_parquet(decontam.pieces.path))
        assert clean_shard(task) == expected.height
        assert pl.read_parquet(task.output).equals(expected.cast(dict(pl.read_parquet(task.output).schema)))


def test_a_rerun_after_a_failed_task_cleans_only_the_kept_shards_left(cut, monkeypatch):
    upstream = cut
    done = _clean(upstream, "reference", num_workers=2)
    real, seen = clean.clean_documents, []

    def failing(scanned, actions, pieces):
        seen.append(1)
        if len(seen) == 9:  # inside a later kept shard, after some have finished
            raise RuntimeError("the worker's disk went away")
        return real(scanned, actions, pieces)

    monkeypatch.setattr(stages, "worker_pool", _threads)
    monkeypatch.setattr(clean, "clean_documents", failing)
    with pytest.raises(RuntimeError):
        _clean(upstream, "state", num_workers=1)  # one thread: the kept shards in order
    monkeypatch.setattr(clean, "clean_documents", real)
    again = _clean(upstream, "state", num_workers=2)
    assert 0 < again.units_resumed < len(upstream.dedup.kept.shards)
    assert _digests(again) == _digests(done)
    assert _clean(upstream, "state", num_workers=2).units_resumed == 0  # success removes the markers


def test_a_tampered_kept_shard_fails_before_any_task_runs(drop, tmp_path):
    shards = list(drop.dedup.kept.shards)
    data = bytearray(Path(shards[3].path).read_bytes())
    data[len(data) // 2] ^= 0xFF
    tampered = tmp_path / Path(shards[3].path).name
    tampered.write_bytes(bytes(data))
    shards[3] = replace(shards[3], path=str(tampered))
    up = replace(drop, root=tmp_path, dedup=replace(drop.dedup, kept=replace(drop.dedup.kept, shards=tuple(shards))))
    with pytest.raises(ItoError) as raised:
        _clean(up, "parts", num_workers=2)
    assert raised.value.code is ErrorCode.SHARD_CORRUPT and tampered.name in raised.value.message
    assert not list((tmp_path / "parts").rglob("rows-*.parquet"))  # no kept shard was cleaned


def test_every_document_dropped_writes_one_pass_s_one_empty_part(tmp_path):
    questions = [item.question for item in SUITE.items]
    records = [{"id": f"q{i}", "text": f"Asked in the suite: {question}"} for i, question in enumerate(questions[:40])]
    up = _upstream(tmp_path.resolve(), "drop", records)
    assert up.dedup.kept.num_rows > 0
    one_pass, parts = _clean(up, "one"), _clean(up, "parts", num_workers=2)
    assert parts.conservation.num_clean_rows == 0 and len(parts.shards.shards) == 1
    assert _digests(parts) == _digests(one_pass)


@pytest.mark.parametrize("unit_bytes", [2_000, 10**9])  # row groups cut into slices; a shard a unit
def test_decontamination_on_two_workers_writes_one_worker_s_files(cut, tmp_path, monkeypatch, unit_bytes):
    """On the packages' descriptions with questions planted: the scan's units are the source
    shards' rows, on a pool (threads here) and in slices, and the hits, actions, pieces and
    common seeds are the bytes of the one-worker stage, whose units are the same shards whole."""
    monkeypatch.setattr(decontam_units, "worker_pool", _threads)
    config = _config("cut", num_workers=2, unit_bytes=unit_bytes)
    stage = stages.run_decontam(cut.verified, SUITE, cut.source, tmp_path, tmp_path / "warehouse.duckdb", config)
    files = lambda s: [file_sha256(t.path) for t in (s.hits, s.actions, s.pieces, s.ignored_seeds)]  # noqa: E731
    assert files(stage) == files(cut.decontam) and stage.counts == cut.decontam.counts
    assert cut.decontam.counts.num_contaminated_documents > 10
