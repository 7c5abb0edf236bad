"""Decontamination quality and speed on the planted fixtures, side by side with datatrove.

- Recall per planted style (verbatim_qa, question_only, edited_question, case_punct): a plant is
  found when its document is flagged with the planted eval item (datatrove's filter reports one
  item per document: the first n-gram it meets); a second line counts a plant flagged at all.
- Two miss classes, planted here (`--plants` per style, seeded):
  - edited_short_tail: a stretch of a question ending at its end, with one word replaced, dropped
    or inserted so that 1 to seed-1 words follow the edit, starting where the words before the
    edit fall 1 to tail words short of the evidence: the plant holds the evidence only with the
    words after the edit;
  - merged_punctuation: question and answer of a fixture item with punctuation between two words
    (code: `sorted('banana')`, `__eq__`) deleted, merging them, or now and then replaced by a space;
  - merged_punct_doctest: the same on generated HumanEval-like items (signature, docstring, doctest
    lines whose numbers are degenerate seeds, a one-line body), added to the suite for this run.
  These plants are scanned 10 at a time: the code-reading items share three phrasings, and more
  than 10 plants of one phrasing in one scan would make its seeds common (ignored), a rule these
  styles do not measure.
- False positives: flagged documents among the clean ones: every fixture document that is not a
  plant (hard negatives included), plus a larger synthetic corpus built from the PSF fixture
  texts only (`dedup_corpus`, forum posts excluded, so that it holds no plant).
- Throughput: MB of text per second per core for the whole scan (tokenise, n-grams, match,
  evidence, offsets), on the synthetic corpus; datatrove with query n-grams on and off.
  Everything on one core (POLARS_MAX_THREADS=1).

    .venv/bin/python benchmarks/decontam.py [--docs 20000] [--plants 60] [--datatrove-python /tmp/bench-venv/bin/python]
"""

from __future__ import annotations

import os

os.environ["POLARS_MAX_THREADS"] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

import polars as pl  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(ROOT / "tests"))  # reference_impl

import dedup_corpus  # noqa: E402
from dedup_speed import machine  # noqa: E402
from ito_assets.data.config import DecontamConfig  # noqa: E402
from ito_assets.data.eval_index import build_index  # noqa: E402
from ito_assets.data.text import words_of  # noqa: E402
from ito_assets.evals.suite import load_suite  # noqa: E402
from reference_impl import scan  # noqa: E402

FIXTURES = ROOT / "data" / "fixtures"
SUITE = FIXTURES / "evals" / "ito-fixture-evals-v1.jsonl"
STYLES = ("verbatim_qa", "question_only", "edited_question", "case_punct", "edited_short_tail", "merged_punctuation", "merged_punct_doctest")
LEAD_INS = ["Saw this in the quiz channel:", "Copying this from the practice sheet:", "Interview prep question I keep seeing:"]
WRAP_UPS = ["Does that match what everyone else would say?", "Posting it here so I can find it again later."]
PLANT_BATCH = 10  # never more than common_min_docs documents of one phrasing in a scan
EDIT_WORDS = ["really", "basically", "exactly", "actually", "probably"]
# A run of punctuation between two letters or digits, without whitespace: where deleting it merges words.
JOIN = re.compile(r"(?<=[^\W_])(?:[^\w\s]|_)+(?=[^\W_])")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def fixture_documents() -> list[dict]:
    docs = []
    for path in sorted((FIXTURES / "corpora").glob("*.jsonl")):
        docs += [{"id": f"{path.name}:{r['id']}", "text": r["text"]} for r in read_jsonl(path)]
    return docs


def edited_short_tail(rng: random.Random, question: str, config: DecontamConfig) -> str | None:
    """A stretch of the question up to its end, one word edited so that 1..seed-1 words follow the
    edit, starting so that the words before the edit are 1..tail short of the evidence (None when
    the question is too short for it). Words as the scan sees them, digits kept."""
    words = words_of(question, digits_normalized=False)
    seed, evidence = config.seed_size(len(words)), config.evidence_words(len(words))
    tail = rng.randint(1, seed - 1)
    edit = len(words) - 1 - tail  # the edited word (inserted after it)
    kind = rng.choice(["replace", "drop", "insert"])
    before = rng.randint(max(seed, evidence - tail), evidence - 1)  # matched words before the edit
    first = edit + (kind == "insert") - before
    if first < 0:
        return None
    filler = rng.choice([w for w in EDIT_WORDS if w != words[edit]])
    edited = {"replace": [filler], "drop": [], "insert": [words[edit], filler]}[kind]
    return " ".join(words[first:edit] + edited + words[edit + 1 :])


def merged_punctuation(rng: random.Random, text: str) -> str:
    """Punctuation between two words deleted (merging them), one time in four replaced by a space;
    the rest of the punctuation deleted."""
    merged = JOIN.sub(lambda m: " " if rng.random() < 0.25 else "", text)
    return re.sub(r"(?:[^\w\s]|_)+", "", merged)


DOCTEST_FUNCS = [
    ("unique", "l: list", "sorted unique elements in a list", "sorted(list(set({a})))"),
    ("rolling_max", "numbers: List[int]", "the running maximum so far", "[max({a}[: i + 1]) for i in range(len({a}))]"),
    ("below_zero", "operations: List[int]", "True if the balance falls below zero", "any(sum({a}[: i + 1]) < 0 for i in range(len({a})))"),
    ("count_upper", "s: str", "the count of upper case vowels", "sum(1 for i, c in enumerate({a}) if i % 2 == 0 and c in 'AEIOU')"),
    ("strange_sort", "lst: list", "the list in strange order", "[x for pair in zip(sorted({a}), sorted({a}, reverse=True)) for x in pair][: len({a})]"),
    ("pairs_sum_to_zero", "l: list", "True if two elements sum to zero", "any(x + y == 0 for i, x in enumerate({a}) for y in {a}[i + 1 :])"),
    ("monotonic", "l: list", "True if the list is monotonic", "{a} == sorted({a}) or {a} == sorted({a}, reverse=True)"),
    ("common", "l1: list, l2: list", "sorted common elements of two lists", "sorted(set({a}) & set(l2))"),
    ("incr_list", "l: list", "the list incremented by one", "[e + 1 for e in {a}]"),
    ("sum_squares", "lst: list", "the sum of squared ceilings", "sum(math.ceil(x) ** 2 for x in {a})"),
    ("even_odd_count", "num: int", "counts of even and odd digits", "(sum(int(d) % 2 == 0 for d in str(abs({a}))), sum(int(d) % 2 for d in str(abs({a}))))"),
    ("max_element", "l: list", "the maximum element of the list", "functools.reduce(lambda x, y: x if x > y else y, {a})"),
]


def doctest_items(rng: random.Random) -> list[dict]:
    """HumanEval-like items: signature, a short docstring (as HumanEval/34's "Return sorted unique
    elements in a list"), two doctests (number runs: degenerate seeds), a one-line body."""
    items = []
    for k, (name, args, summary, body) in enumerate(DOCTEST_FUNCS):
        arg = args.split(":")[0]
        examples = []
        for _ in range(2):
            numbers = ", ".join(str(rng.randint(-9, 130)) for _ in range(rng.randint(5, 9)))
            result = ", ".join(str(rng.randint(0, 130)) for _ in range(rng.randint(3, 6)))
            examples.append(f"    >>> {name}([{numbers}])\n    [{result}]")
        question = f"def {name}({args}):\n    \"\"\"Return {summary}.\n" + "\n".join(examples) + '\n    """'
        items.append({"id": f"doctest/{k:03d}", "benchmark": "doctest", "question": question, "answer": f"    return {body.format(a=arg)}"})
    return items


def extra_plants(rng: random.Random, suite_items: list[dict], per_style: int) -> tuple[list[dict], list[dict]]:
    """Documents and truth rows of the styles planted here."""
    config = DecontamConfig()
    fixture = [it for it in suite_items if it["benchmark"] != "doctest"]
    joined = [it for it in fixture if JOIN.search(f"{it['question']} {it['answer']}")]
    payloads = []
    for item in rng.sample(fixture, len(fixture)):
        plant = edited_short_tail(rng, item["question"], config)
        if plant is not None and len([p for p in payloads if p[1] == "edited_short_tail"]) < per_style:
            payloads.append((item, "edited_short_tail", plant))
    for item in rng.sample(joined, min(per_style, len(joined))):
        payloads.append((item, "merged_punctuation", merged_punctuation(rng, f"{item['question']} {item['answer']}")))
    doctests = [it for it in suite_items if it["benchmark"] == "doctest"]
    for k in range(per_style):
        item = doctests[k % len(doctests)]
        payloads.append((item, "merged_punct_doctest", merged_punctuation(rng, f"{item['question']}\n{item['answer']}")))
    docs, truth = [], []
    for k, (item, style, plant) in enumerate(payloads):
        docs.append({"id": f"plants:{k:04d}", "text": f"{rng.choice(LEAD_INS)} {plant}\n{rng.choice(WRAP_UPS)}"})
        truth.append({"source": "plants", "id": f"{k:04d}", "eval_item_id": item["id"], "style": style})
    return docs, truth


def run_ito(docs: list[dict], suite_path: Path) -> tuple[dict[str, set[str]], float]:
    frame = pl.DataFrame({"doc_id": [d["id"] for d in docs], "text": [d["text"] for d in docs]}, schema={"doc_id": pl.String, "text": pl.String})
    start = time.perf_counter()
    config = DecontamConfig()
    hits, _ = scan(frame, build_index(load_suite(suite_path), config), config)
    seconds = time.perf_counter() - start
    flagged: dict[str, set[str]] = {}
    for doc, item in hits.select("doc_id", "eval_item_id").iter_rows():
        flagged.setdefault(doc, set()).add(item)
    return flagged, seconds


def run_datatrove(python: str, docs: list[dict], query: bool, work: Path, suite_path: Path) -> tuple[dict[str, set[str]], float]:
    corpus = work / f"corpus-{len(docs)}.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in docs))
    runner = Path(__file__).with_name("decontam_datatrove_runner.py")
    done = subprocess.run(
        [python, str(runner), str(suite_path), str(corpus), str(work / f"dt-{query}-{len(docs)}"), "13", "1" if query else "0"],
        capture_output=True, text=True, check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {k: {v} for k, v in result["flagged"].items()}, result["seconds"]


def quality(flagged: dict[str, set[str]], truth: list[dict], clean_ids: set[str]) -> dict:
    found = Counter(t["style"] for t in truth if t["eval_item_id"] in flagged.get(f"{t['source']}:{t['id']}", set()))
    total = Counter(t["style"] for t in truth)
    anywhere = Counter(t["style"] for t in truth if f"{t['source']}:{t['id']}" in flagged)
    false_positives = sorted(d for d in flagged if d in clean_ids)
    return {
        "recall": {s: found[s] / total[s] for s in STYLES},
        "recall_any_item": {s: anywhere[s] / total[s] for s in STYLES},
        "false_positives": false_positives,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=20_000)
    parser.add_argument("--plants", type=int, default=60, help="plants per style planted here")
    parser.add_argument("--datatrove-python", default="/tmp/bench-venv/bin/python")
    args = parser.parse_args()
    print(machine())
    work = Path(tempfile.mkdtemp(prefix="ito-decontam-"))
    rng = random.Random(7)
    suite_items = read_jsonl(SUITE) + doctest_items(rng)
    suite_path = work / "ito-fixture-evals-with-doctests.jsonl"
    suite_path.write_text("".join(json.dumps(it) + "\n" for it in suite_items))
    truth = read_jsonl(FIXTURES / "truth" / "planted_contamination.jsonl")
    plants, extra_truth = extra_plants(rng, suite_items, args.plants)
    truth += extra_truth
    planted = {f"{t['source']}:{t['id']}" for t in truth}
    fixtures = fixture_documents()
    synthetic = [{"id": f"synthetic:{r['id']}", "text": r["text"]} for r in dedup_corpus.build(args.docs, seed=1, exclude=("forum_posts.jsonl",))]
    clean_ids = {d["id"] for d in fixtures + synthetic} - planted
    mb = sum(len(d["text"].encode()) for d in synthetic) / 1e6
    print(f"fixtures: {len(fixtures)} documents, {len(truth)} plants ({len(plants)} planted here, "
          f"{len(suite_items)} eval items); clean documents: {len(clean_ids)}; "
          f"throughput corpus: {len(synthetic)} documents, {mb:.1f} MB; n = 13")
    runs = {"ito": lambda docs: run_ito(docs, suite_path)}
    if Path(args.datatrove_python).is_file():
        runs["datatrove (query n-grams on)"] = lambda docs: run_datatrove(args.datatrove_python, docs, True, work, suite_path)
        runs["datatrove (query n-grams off)"] = lambda docs: run_datatrove(args.datatrove_python, docs, False, work, suite_path)
    width = max(len(s) for s in STYLES)
    totals = Counter(t["style"] for t in truth)
    print(f"{'plants per style':32s} " + " ".join(f"{totals[s]:>{width}d}" for s in STYLES))
    print(f"{'method':32s} " + " ".join(f"{s:>{width}s}" for s in STYLES) + f" {'FP docs':>8s} {'FP rate':>9s} {'MB/s/core':>10s}")
    for name, run in runs.items():
        flagged, _ = run(fixtures)
        flagged_plants = {k: v for start in range(0, len(plants), PLANT_BATCH) for k, v in run(plants[start : start + PLANT_BATCH])[0].items()}
        flagged_synthetic, seconds = run(synthetic)
        result = quality({**flagged, **flagged_plants, **flagged_synthetic}, truth, clean_ids)
        fp = result["false_positives"]
        print(f"{name:32s} " + " ".join(f"{result['recall'][s]:{width}.3f}" for s in STYLES) + f" {len(fp):8d} {len(fp) / len(clean_ids):9.4%} {mb / seconds:10.2f}")
        print(f"{'  flagged at all (any item)':32s} " + " ".join(f"{result['recall_any_item'][s]:{width}.3f}" for s in STYLES))
        if fp:
            print(f"    false positives: {fp[:5]}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
