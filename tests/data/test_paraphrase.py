"""Paraphrase candidates (ito_assets/data/paraphrase.py): what the embedding step reports, where,
and that its configuration refuses values outside its ranges."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from ito_assets.data.config import DecontamConfig
from ito_assets.data.eval_index import build_index
from ito_assets.data.paraphrase import (CANDIDATE_SCHEMA, EXCERPT_CHARS, ItemVectors, ParaphraseConfig, WordEmbedder,
                                        find_candidates, item_vectors, load_embedder, window_spans)
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.evals.suite import load_suite
from reference_impl import scan

ROOT = Path(__file__).resolve().parents[2]
FILLER = "Our deploy script copies the wheel every night."  # 8 words: a stride of the default window
# py-trivia/004 with its clauses restated: no 13 of its words in a row survive, so n-grams miss it.
PARAPHRASE = ("Which keyword lets a nested function rebind a name belonging to the enclosing function "
              "rather than making a new local variable?")
UNRELATED = ("The parser will not be ready to parse another document until the reset method has been called. "
             "Close may raise an exception when the underlying stream has already been shut down.")


@pytest.fixture(scope="module")
def embedder() -> WordEmbedder:
    pytest.importorskip("wordllama")
    return load_embedder()


@pytest.fixture(scope="module")
def suite():
    path = ROOT / "data" / "fixtures" / "evals" / "ito-fixture-evals-v1.jsonl"
    if not path.is_file():
        pytest.skip("the committed fixtures are missing")
    return load_suite(path)


def fake_embedder(vectors: dict[str, list[float]]) -> WordEmbedder:
    """One token per known word, its row the given vector; unknown words have no token."""
    words = sorted(vectors)
    ids = {w: i for i, w in enumerate(words)}
    table = np.array([vectors[w] for w in words], dtype=np.float32)
    return WordEmbedder(table=table, tokenize=lambda batch: [[ids[w]] if w in ids else [] for w in batch])


def one_item(vector: list[float]) -> ItemVectors:
    unit = np.array([vector], dtype=np.float32)
    return ItemVectors(item_ids=("item/0",), benchmarks=("bench",), views=("question",), vectors=unit / np.linalg.norm(unit))


def test_a_paraphrase_the_ngram_rule_misses_is_a_candidate(embedder, suite):
    document = f"{FILLER} {PARAPHRASE} {FILLER} {FILLER}"
    config = ParaphraseConfig()
    found = find_candidates([("doc", document)], item_vectors(suite, embedder), embedder, config)
    assert found["eval_item_id"].to_list() == ["py-trivia/004"]
    assert found["similarity"][0] >= config.threshold
    decontam = DecontamConfig()
    hits, _ = scan(pl.DataFrame({"doc_id": ["doc"], "text": [document]}), build_index(suite, decontam), decontam)
    assert hits.height == 0


def test_an_unrelated_document_is_not_a_candidate(embedder, suite):
    found = find_candidates([("doc", UNRELATED), ("empty", ""), ("punctuation", "... !!! ---")],
                            item_vectors(suite, embedder), embedder, ParaphraseConfig())
    assert found.height == 0
    assert found.schema == pl.Schema(CANDIDATE_SCHEMA)


def test_the_embedder_reads_the_files_inside_the_wheel(monkeypatch, tmp_path):
    """No model hub: a download or a hub tokenizer would fail here."""
    pytest.importorskip("wordllama")
    import requests
    import tokenizers

    def refuse(*args, **kwargs):
        raise AssertionError("the embedder tried to download")

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(requests, "get", refuse)
    monkeypatch.setattr(tokenizers.Tokenizer, "from_pretrained", refuse)
    embedder = load_embedder()
    assert embedder.table.shape == (32000, 256)


def test_without_wordllama_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "wordllama", None)  # makes `import wordllama` fail
    with pytest.raises(ItoError) as caught:
        load_embedder()
    assert caught.value.code is ErrorCode.CAPABILITY_MISSING
    assert "paraphrase" in caught.value.message


def test_wordllama_is_imported_only_by_the_loader_and_leaves_logging_alone():
    pytest.importorskip("wordllama")
    code = ("import logging, sys, ito_assets.data.paraphrase as p\n"
            "assert 'wordllama' not in sys.modules\n"
            "p.load_embedder()\n"
            "assert not logging.getLogger().handlers and logging.getLogger().level == logging.WARNING\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_window_exactly_at_the_threshold_counts_and_just_below_does_not():
    embedder = fake_embedder({"alpha": [1.0, 0.0], "beta": [0.0, 1.0]})
    items = one_item([1.0, 0.0])
    docs = [("doc", "alpha beta beta beta")]
    config = ParaphraseConfig(threshold=0.01, window_words=4, stride_words=4)
    similarity = find_candidates(docs, items, embedder, config)["similarity"][0]
    assert similarity == pytest.approx(1 / np.sqrt(10), abs=1e-6)
    at = find_candidates(docs, items, embedder, ParaphraseConfig(threshold=similarity, window_words=4, stride_words=4))
    above = float(np.nextafter(similarity, 2.0))
    just_above = find_candidates(docs, items, embedder, ParaphraseConfig(threshold=above, window_words=4, stride_words=4))
    assert at.height == 1 and at["similarity"][0] == similarity
    assert just_above.height == 0


def test_window_spans_map_back_to_the_words_of_the_text():
    text = "Zürich's café — naïve_words, 42 times!\nThe END of line two; and three more words here."
    spans = window_spans(text, ParaphraseConfig(window_words=4, stride_words=3))
    assert [text[s:e] for s, e in spans] == [
        "Zürich's café — naïve", "naïve_words, 42 times", "times!\nThe END of", "of line two; and",
        "and three more words", "three more words here",
    ]
    assert window_spans("short text", ParaphraseConfig(window_words=4, stride_words=3)) == [(0, 10)]
    assert window_spans("", ParaphraseConfig()) == []


def test_candidate_offsets_and_excerpts_are_the_documents_text():
    rng = np.random.default_rng(3)
    words = [f"w{i}" for i in range(30)]
    embedder = fake_embedder({w: rng.standard_normal(8).tolist() for w in words})
    docs = [(f"d{k}", "  ".join(" ".join(rng.choice(words, 5)) + "." for _ in range(rng.integers(1, 40)))) for k in range(20)]
    config = ParaphraseConfig(threshold=0.3, window_words=6, stride_words=2)
    found = find_candidates(docs, one_item(rng.standard_normal(8).tolist()), embedder, config)
    assert found.height > 10
    texts = dict(docs)
    for doc, start, end, excerpt in found.select("doc_id", "char_start", "char_end", "excerpt").iter_rows():
        assert (start, end) in window_spans(texts[doc], config)
        assert excerpt == texts[doc][start:end][:EXCERPT_CHARS]


def test_batches_give_the_same_candidates_as_one_batch():
    rng = np.random.default_rng(5)
    words = [f"w{i}" for i in range(50)]
    embedder = fake_embedder({w: rng.standard_normal(16).tolist() for w in words})
    items = ItemVectors(item_ids=("a", "b", "c"), benchmarks=("x", "x", "y"), views=("question",) * 3,
                        vectors=np.linalg.qr(rng.standard_normal((16, 3)))[0].T.astype(np.float32))
    docs = [(f"d{k}", " ".join(rng.choice(words, int(rng.integers(0, 120))))) for k in range(15)]
    runs = [find_candidates(docs, items, embedder, ParaphraseConfig(threshold=0.4, window_words=12, stride_words=4, batch_windows=b))
            for b in (1, 7, 64, 65_536)]
    assert runs[0].height > 10
    for run in runs[1:]:
        assert run.drop("similarity").equals(runs[0].drop("similarity"))
        assert np.allclose(run["similarity"].to_numpy(), runs[0]["similarity"].to_numpy(), rtol=0, atol=1e-6)


@pytest.mark.parametrize(("field", "good", "bad"), [
    ("threshold", [1e-9, 0.5, 1.0], [0.0, -0.1, 1.0 + 1e-9]),
    ("window_words", [4, 512], [3, 513]),
    ("batch_windows", [1, 65_536], [0, 65_537]),
])
def test_config_ranges(field, good, bad):
    for value in good:
        assert getattr(ParaphraseConfig(**{field: value, **({"stride_words": 4} if field == "window_words" else {})}), field) == value
    for value in bad:
        with pytest.raises(ValueError, match=field):
            ParaphraseConfig(**{field: value})


def test_the_stride_lies_between_one_and_the_window():
    assert ParaphraseConfig(window_words=10, stride_words=1).stride_words == 1
    assert ParaphraseConfig(window_words=10, stride_words=10).stride_words == 10
    for stride in (0, 11):
        with pytest.raises(ValueError, match="stride_words"):
            ParaphraseConfig(window_words=10, stride_words=stride)


def test_the_config_is_frozen_and_keyword_only():
    with pytest.raises(AttributeError):
        ParaphraseConfig().threshold = 0.5  # type: ignore[misc]
    with pytest.raises(TypeError):
        ParaphraseConfig(0.5)  # type: ignore[misc]


def test_the_contamination_stage_reports_paraphrases_for_review_and_removes_nothing(embedder, suite, real_tmp, monkeypatch):
    import json

    from ito_assets.api.cli import run
    from ito_assets.data import stages
    from ito_assets.data.config import DataPrepConfig, ScaleConfig
    from ito_assets.digests import file_sha256
    from ito_assets.manifest.verify import verify_manifest

    records = [{"id": "mine-1", "text": f"{FILLER} {PARAPHRASE} {FILLER}"}, {"id": "mine-2", "text": UNRELATED}]
    (real_tmp / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    manifest = json.loads((ROOT / "data" / "fixtures" / "manifests" / "fixture-small.json").read_text())
    manifest["data"] = [{**manifest["data"][0], "uri": "dataroot://corpus.jsonl", "sha256": file_sha256(real_tmp / "corpus.jsonl")}]
    (real_tmp / "manifest.json").write_text(json.dumps(manifest))
    verified = verify_manifest(str(real_tmp / "manifest.json"))
    state, warehouse = real_tmp / "state", real_tmp / "state" / "warehouse.duckdb"
    config = DataPrepConfig(paraphrase=ParaphraseConfig(), scale=ScaleConfig(memory_limit_mb=128))
    source = stages.run_sources(verified, real_tmp, state, warehouse, config)
    decontam = stages.run_decontam(verified, suite, source, state, warehouse, config)
    dedup = stages.run_dedup(source, decontam.actions, state, warehouse, config)
    clean = stages.run_clean(verified, source, dedup, decontam, state, warehouse, config)
    candidates = pl.read_parquet(decontam.paraphrases.path)
    assert candidates.select("source_record_id", "eval_item_id").rows() == [("mine-1", "py-trivia/004")]
    # A report, not a removal: both documents are in the clean shards.
    assert clean.conservation.num_kept == 2 and decontam.counts.num_contaminated_documents == 0
    monkeypatch.setenv("ITO_STATE_DIR", str(state))
    report, status = run(["audit", "eval-item", "py-trivia/004", "--json"])
    assert status == 0 and report["data"]["hits"] == []
    assert [c["source_record_id"] for c in report["data"]["paraphrase_candidates"]] == ["mine-1"]
    # Run again without the report: no stale candidates stay in the warehouse.
    stages.run_decontam(verified, suite, source, state, warehouse, DataPrepConfig(scale=ScaleConfig(memory_limit_mb=128)))
    report, _ = run(["audit", "eval-item", "py-trivia/004", "--json"])
    assert report["data"]["paraphrase_candidates"] == []


def test_the_launchpad_switch_turns_the_report_on_with_its_threshold():
    from ito_assets.defs.data.params import DecontamParams

    assert DecontamParams().to_config().paraphrase is None
    on = DecontamParams(paraphrase_candidates=True, paraphrase_threshold=0.85).to_config()
    assert on.paraphrase == ParaphraseConfig(threshold=0.85) and on.decontam == DecontamConfig()
    assert "paraphrase.threshold" in on.as_metadata() and "paraphrase.threshold" not in DecontamParams().to_config().as_metadata()


@pytest.mark.parametrize(("num_workers", "unit_bytes"), [(1, 3_000), (2, 3_000), (1, 10**9)])  # small units, on a pool, a shard a unit
def test_the_report_over_the_shards_units_is_the_whole_corpus_s(embedder, suite, tmp_path, num_workers, unit_bytes):
    """On the installed packages' descriptions with a paraphrase planted in some: the units'
    candidates are what one pass over every document finds, with each document's own id, and
    the same bytes on one worker and on a pool of processes."""
    from ito_assets.data.config import ScaleConfig
    from ito_assets.data.paraphrase_units import paraphrase_shards
    from ito_assets.data.scratch import scratch_space
    from ito_assets.data.shards import write_shards
    from test_source_pieces import package_paragraphs

    texts = [f"{text} {PARAPHRASE}" if i % 11 == 0 else text for i, text in enumerate(package_paragraphs()[:400])]
    # Ids out of the shards' order, as hashes are: the report is ordered by id across units.
    ids = {f"d{i * 7919 % len(texts):04d}": f"mine-{i}" for i in range(len(texts))}
    docs = pl.DataFrame({"doc_id": list(ids), "source_record_id": list(ids.values()), "text": texts})
    shards = write_shards(docs, tmp_path / "source", prefix="d", max_rows=37).shards
    config = ParaphraseConfig()
    with scratch_space(tmp_path / "_scratch", ScaleConfig(unit_bytes=unit_bytes, num_workers=num_workers, memory_limit_mb=128)) as scratch:
        report = paraphrase_shards(scratch, shards, suite, config)
    whole = find_candidates(docs.select("doc_id", "text").iter_rows(), item_vectors(suite, embedder), embedder, config)
    found = set(report.filter(pl.col("eval_item_id") == "py-trivia/004")["source_record_id"])
    assert len(found & {f"mine-{i}" for i in range(0, len(texts), 11)}) >= 20  # where a window lines up with the planted question
    assert report.drop("similarity", "source_record_id").equals(whole.drop("similarity"))
    assert np.allclose(report["similarity"].to_numpy(), whole["similarity"].to_numpy(), rtol=0, atol=1e-6)  # batches differ
    assert report["source_record_id"].to_list() == [ids[d] for d in report["doc_id"]]
    with scratch_space(tmp_path / "_again", ScaleConfig(unit_bytes=unit_bytes, num_workers=3 - num_workers, memory_limit_mb=128)) as scratch:
        assert paraphrase_shards(scratch, shards, suite, config).equals(report)  # the other number of workers: the same frame
