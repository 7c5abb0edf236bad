"""Paraphrase candidates (embeddings) against the n-gram rule, on paraphrases of the fixture suite.

The set: every item of data/fixtures/evals restated five ways and put between two clean fixture
documents (a forum post before it, a docstring or pydoc paragraph after it); odd-numbered items
carry their answer too ("Answer: ..."), as the fixture plants do.

- verbatim: the question unchanged (a control: the n-gram rule must find all of them);
- synonyms: words and phrases replaced from the hand-written table below;
- reordered: clauses moved (facts after the question, a leading phrase to the end, or a
  "when/if/..." clause to the front);
- numbers: digits outside code written out ("3" -> "three", "10%" -> "ten percent");
- combined: numbers, then reordered, then synonyms.

A style that would not change an item's text is not generated for it. Hard negatives, which hold
no eval item: `same_words` (the item's content words, shuffled, in a sentence that asks something
else), `other_answers` (short answers of three other items of the same benchmark, with topic words)
and `sibling` (the item's template with new names, objects and numbers, or a new expression: a
different question that reads the same).

Measured: recall per style (flagged with the planted item; and flagged at all), precision on the
generated set (flagged plants / flagged documents), the false-positive rate on the clean fixture
corpora (every document that is not a planted one), for (a) the n-gram rule (tests/reference_impl
`scan`; the generated set in groups of ten documents, see `ngram_flags`), (b) embedding candidates at several thresholds, (c) their union; and throughput in
MB/s/core of the n-gram scan and of the embedding step, one core, on a synthetic corpus of PSF
fixture texts (`dedup_corpus`, as benchmarks/decontam.py), and per window on the clean fixtures.

    .venv/bin/python benchmarks/paraphrase.py [--windows 16/4,20/4,24/4,24/8,32/8,32/16] [--repeat 3] [--docs 5000]
"""

from __future__ import annotations

import os

for _name in ("POLARS_MAX_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS"):
    os.environ[_name] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the tokenizers crate would use every core

import argparse  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import polars as pl  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(ROOT / "tests"))  # reference_impl

import dedup_corpus  # noqa: E402
from decontam import FIXTURES, SUITE, read_jsonl  # noqa: E402  the decontamination benchmark's fixtures
from dedup_speed import machine  # noqa: E402
from ito_assets.data.config import DecontamConfig  # noqa: E402
from ito_assets.data.eval_index import build_index  # noqa: E402
from ito_assets.data.paraphrase import ParaphraseConfig, find_candidates, item_vectors, load_embedder  # noqa: E402
from ito_assets.evals.suite import EvalItem, load_suite  # noqa: E402
from reference_impl import scan  # noqa: E402

STYLES = ("verbatim", "synonyms", "reordered", "numbers", "combined")
NEGATIVES = ("same_words", "other_answers", "sibling")
THRESHOLDS = (0.80, 0.85, 0.875, 0.90, 0.925, 0.95)
SWEEP_FLOOR = min(THRESHOLDS)  # one run at the lowest threshold; higher ones are filters of it

# Meaning-preserving replacements, longest first when they overlap. Written for the fixture suite's
# three benchmarks: Python trivia, arithmetic word problems, "what does this expression give".
SYNONYMS = {
    # arithmetic word problems
    "how many": "what number of", "buys": "purchases", "bags": "sacks", "bag": "sack", "gives": "hands",
    "keep": "retain", "holds": "contains", "shelf": "rack", "rows": "lines", "row": "line",
    "removes": "takes away", "adds": "puts in", "now": "at this point", "saves": "puts aside",
    "every week": "each week", "spends": "uses up", "still have": "have remaining", "bus": "coach",
    "leaves with": "departs carrying", "passengers": "riders", "people": "riders", "get off": "step down",
    "get on": "climb in", "counts them again": "recounts them", "aboard": "on board", "garden": "yard",
    "beds": "plots", "bed": "plot", "picks": "cuts", "remain": "are left", "reads": "gets through",
    "pages": "sheets", "twice": "double", "amount": "number", "shared equally": "split evenly",
    "friends": "pals", "held": "contained", "were lost": "went missing", "ignoring leftovers":
    "disregarding any remainder", "times as many": "times that number", "together": "between them",
    "share out": "hand out", "classmates": "schoolmates", "have left": "have remaining",
    "cookies": "biscuits", "seashells": "shells", "coins": "pennies", "stop": "halt",
    # what does this expression give
    "evaluate to": "produce", "interactive prompt": "Python shell", "type it": "enter it",
    "without running it": "just by looking", "reading carefully": "looking closely", "fresh": "new",
    "interpreter session": "REPL process", "entered at the repl": "typed into the shell",
    "what value would": "which result would", "print for": "show for", "result of evaluating": "outcome of computing",
    # Python trivia
    "value": "result", "function": "routine", "exception": "error", "raised": "thrown", "dictionary": "mapping",
    "keyword": "reserved word", "variable": "name binding", "statement": "instruction", "called": "invoked",
    "method": "member function", "expression": "snippet", "interpreter": "runtime", "happens": "occurs",
    "object": "instance", "order": "sequence", "search": "look through", "refers to": "mentions",
    "arguments": "parameters", "argument": "parameter", "integers": "whole numbers", "integer": "whole number",
    "operator": "symbol", "empty": "blank", "original": "initial", "elements": "members", "items": "entries",
    "beginning": "start", "copy": "duplicate", "default": "fallback", "assigned": "bound", "caller": "calling code",
    "finishes": "completes", "executing": "running", "look up": "fetch", "contain": "hold", "mutable": "changeable",
    "created": "built", "across": "over", "repeated": "successive", "nested": "inner", "rebind": "reassign",
    "belongs to": "lives in", "enclosing": "outer", "instead of": "rather than", "defines": "implements",
    "try to": "attempt to", "guarantee": "promise", "prevent": "stop", "bottom": "end", "splits": "breaks",
    "drops": "discards", "effect": "impact", "delegates": "hands off", "compute": "work out",
    "multiple": "several", "performed": "done", "meaning that": "so that", "accept": "take",
    "at most": "at the maximum", "control": "determine", "added in": "introduced in", "makes": "renders",
    "under what circumstances": "in which situations", "finished": "ended", "once": "after",
    "produces": "yields", "provides": "offers", "difference between": "distinction between",
    "recommended": "advised", "usually": "generally", "missing": "absent", "requested": "asked for",
    "provided": "supplied", "specified": "given", "particular": "specific", "written": "placed",
    "common": "frequent", "different": "distinct", "lengths": "sizes", "treat": "handle",
    "typically": "normally", "begins": "starts", "suspend": "pause", "started": "launched",
    "collect": "gather", "currently": "right now", "eventually": "finally",
}
_SYNONYM = re.compile(r"\b(" + "|".join(re.escape(k) for k in sorted(SYNONYMS, key=len, reverse=True)) + r")\b", re.IGNORECASE)
_ONES = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?%?")
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_CLAUSE = re.compile(r"^(.*?),?\s+(when|if|while|once|because|so that)\s+(?!__)(.+)\?$")
_CODE = re.compile(r"(`[^`]*`)")
STOPWORDS = set("""a an and are as at be been before both but by can does do each for from get has have how in is it its
of on or that the them then they this to was were what when which while who why with would you your does did not""".split())
# Names and objects the arithmetic templates never use, so a sibling copies no item's words.
NEW_NAMES = ["Marta", "Yusuf", "Ilse", "Bruno", "Keiko", "Amara", "Tomas", "Zainab"]
NEW_OBJECTS = ["erasers", "walnuts", "crayons", "ribbons", "pebbles", "acorns"]
NEW_EXPRESSIONS = ["sorted('cherry')", "9 // 4", "'xyz' * 3", "len('hello')", "max([4, 9, 2])", "'a-b'.split('-')",
                   "list(range(3))", "abs(-8)", "str(12) + '3'", "min('dog', 'cat')", "15 % 4", "2 ** 5"]


def number_words(token: str) -> str:
    """'3' -> 'three', '-4' -> 'minus four', '3.8' -> 'three point eight', '10%' -> 'ten percent'."""
    if token.endswith("%"):
        return f"{number_words(token[:-1])} percent"
    if token.startswith("-"):
        return f"minus {number_words(token[1:])}"
    if "." in token:
        whole, fraction = token.split(".")
        return f"{number_words(whole)} point {' '.join(_ONES[int(d)] for d in fraction)}"
    return _integer_words(int(token))


def _integer_words(n: int) -> str:
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else f"-{_ONES[n % 10]}")
    if n < 1000:
        rest = n % 100
        return f"{_ONES[n // 100]} hundred" + ("" if rest == 0 else f" and {_integer_words(rest)}")
    rest = n % 1000
    return f"{_integer_words(n // 1000)} thousand" + ("" if rest == 0 else f" {_integer_words(rest)}")


def _outside_code(text: str, change) -> str:
    """Apply `change` to the text between backtick code spans only: code is not prose."""
    return "".join(part if _CODE.fullmatch(part) else change(part) for part in _CODE.split(text))


def _keep_case(old: str, new: str) -> str:
    return new[0].upper() + new[1:] if old[0].isupper() else new


def synonyms(text: str) -> str:
    return _outside_code(text, lambda part: _SYNONYM.sub(lambda m: _keep_case(m.group(), SYNONYMS[m.group().lower()]), part))


def numbers(text: str) -> str:
    return _outside_code(text, lambda part: _NUMBER.sub(lambda m: number_words(m.group()), part))


_COMMON_LEADS = {"a", "an", "the", "each", "at", "in", "when", "if", "without", "reading", "together", "which", "what",
                 "how", "why", "is", "where"}


def _lower_first(text: str) -> str:
    """Lower-case a moved clause's first word unless it is a name ("Rosa", "CPython")."""
    return text[0].lower() + text[1:] if text.split(" ", 1)[0].lower() in _COMMON_LEADS else text


def reordered(text: str) -> str:
    """Facts after the question; else a leading phrase to the end; else a subordinate clause first."""
    sentences = _SENTENCE.split(text.strip())
    if len(sentences) > 1:
        return f"{sentences[-1].rstrip('?')}, given that {_lower_first(' '.join(sentences[:-1]).rstrip('.'))}?"
    lead = re.match(r"^((?:In|Without|Reading|When|If)\b[^,`]{0,60}),\s+(.+)\?$", text)
    if lead:
        return f"{_keep_case('X', lead[2])}, {_lower_first(lead[1])}?"
    clause = _CLAUSE.match(text)
    if clause:
        return f"{_keep_case('X', clause[2])} {clause[3]}, {_lower_first(clause[1])}?"
    return text


def paraphrases(item: EvalItem) -> dict[str, tuple[str, str]]:
    """style -> (question, answer); styles that leave the text unchanged are left out."""
    answer_numbers = numbers(item.answer) if item.benchmark == "arith-words" else item.answer
    out = {
        "verbatim": (item.question, item.answer),
        "synonyms": (synonyms(item.question), item.answer),  # answers kept: "Once" -> "After" would change them
        "reordered": (reordered(item.question), item.answer),
        "numbers": (numbers(item.question), answer_numbers),
        "combined": (synonyms(reordered(numbers(item.question))), answer_numbers),
    }
    return {style: qa for style, qa in out.items() if style == "verbatim" or qa[0] != item.question}


def _content_words(text: str) -> list[str]:
    return [w for w in re.findall(r"[A-Za-z_]+", text) if w.lower() not in STOPWORDS and len(w) > 2]


def same_words(rng: random.Random, item: EvalItem) -> str:
    words = _content_words(item.question)
    rng.shuffle(words)
    head, tail = words[: len(words) // 2], words[len(words) // 2 :]
    return (f"Our team wiki has a page that mentions {', '.join(head)}; it was last edited in spring. "
            f"Does anyone know who owns the section on {', '.join(tail)}, and whether it is still maintained?")


def other_answers(rng: random.Random, item: EvalItem, items: list[EvalItem], config: DecontamConfig) -> str:
    """Answers short enough that the n-gram index does not hold them (its answer view needs
    min_answer_words), so this document contains no indexed view either."""
    pool = [o for o in items if o.benchmark == item.benchmark and o.id != item.id and len(o.answer.split()) < config.min_answer_words]
    picked = rng.sample(pool, 3)
    topic = " ".join(_content_words(item.question)[:4])
    return (f"Notes from the study group ({topic}): the answers we wrote down were {picked[0].answer}, "
            f"then {picked[1].answer}, and finally {picked[2].answer}. Please check them before Friday.")


def sibling(rng: random.Random, item: EvalItem) -> str | None:
    if item.benchmark == "arith-words":
        pool = iter(rng.sample(NEW_NAMES, len(NEW_NAMES)))
        names: dict[str, str] = {}
        objects = rng.choice(NEW_OBJECTS)
        text = re.sub(r"\b(Rosa|Priya|Quinn|Nadia|Freya|Kofi|Mateo|Ines|Ana|Dara|Oskar|Sami|Chen|Emeka|Tove|Lena|Jonas|Hana|Bilal|Goran)\b",
                      lambda m: names.setdefault(m.group(), next(pool)), item.question)
        text = re.sub(r"\b(marbles|apples|coins|tulips|pages|pencils|stickers|seashells|cookies|buttons|postcards)\b", objects, text)
        return re.sub(r"\d+", lambda m: str(rng.randint(2, 90)), text)
    if item.benchmark == "code-reading":
        return _CODE.sub(f"`{rng.choice(NEW_EXPRESSIONS)}`", item.question, count=1)
    return None


@dataclass(frozen=True)
class Doc:
    doc_id: str
    text: str
    kind: str  # a style, a negative kind, or "clean"
    item_id: str | None = None


def filler_pool() -> tuple[list[str], list[str]]:
    """Clean forum posts (no plant, no hard negative) and short clean PSF paragraphs."""
    planted = {t["id"] for t in read_jsonl(FIXTURES / "truth" / "planted_contamination.jsonl")}
    planted |= {t["id"] for t in read_jsonl(FIXTURES / "truth" / "clean_hard_negatives.jsonl")}
    posts = [r["text"] for r in read_jsonl(FIXTURES / "corpora" / "forum_posts.jsonl") if r["id"] not in planted]
    psf = [r["text"] for name in ("pydoc_topics.jsonl", "stdlib_docstrings.jsonl")
           for r in read_jsonl(FIXTURES / "corpora" / name) if len(r["text"]) <= 1200]
    return posts, psf


def _between(rng: random.Random, posts: list[str], psf: list[str], middle: str) -> str:
    return f"{rng.choice(posts)}\n\n{middle}\n\n{rng.choice(psf)}"


def generated_set(items: list[EvalItem], config: DecontamConfig, seed: int = 7) -> list[Doc]:
    rng = random.Random(seed)
    posts, psf = filler_pool()
    docs: list[Doc] = []
    for number, item in enumerate(items):
        for style, (question, answer) in paraphrases(item).items():
            middle = f"{question} Answer: {answer}" if number % 2 else question
            docs.append(Doc(f"{style}/{item.id}", _between(rng, posts, psf, middle), style, item.id))
        negatives = {"same_words": same_words(rng, item), "other_answers": other_answers(rng, item, items, config), "sibling": sibling(rng, item)}
        for kind, middle in negatives.items():
            if middle is not None:
                docs.append(Doc(f"{kind}/{item.id}", _between(rng, posts, psf, middle), kind, item.id))
    return docs


def clean_corpora() -> list[Doc]:
    """Every fixture document that is not a planted one (reposts and hard negatives included)."""
    planted = {f"{t['source']}:{t['id']}" for t in read_jsonl(FIXTURES / "truth" / "planted_contamination.jsonl")}
    docs = []
    for path in sorted((FIXTURES / "corpora").glob("*.jsonl")):
        docs += [Doc(f"{path.name}:{r['id']}", r["text"], "clean") for r in read_jsonl(path) if f"{path.name}:{r['id']}" not in planted]
    return docs


def frame(docs: list[Doc]) -> pl.DataFrame:
    return pl.DataFrame({"doc_id": [d.doc_id for d in docs], "text": [d.text for d in docs]})


def flagged_of(rows: pl.DataFrame) -> dict[str, set[str]]:
    flagged: dict[str, set[str]] = {}
    for doc, item in rows.select("doc_id", "eval_item_id").iter_rows():
        flagged.setdefault(doc, set()).add(item)
    return flagged


def union(a: dict[str, set[str]], b: dict[str, set[str]]) -> dict[str, set[str]]:
    return {doc: a.get(doc, set()) | b.get(doc, set()) for doc in a.keys() | b.keys()}


def quality(flagged: dict[str, set[str]], docs: list[Doc], clean: list[Doc]) -> dict:
    plants = [d for d in docs if d.kind in STYLES]
    negatives = [d for d in docs if d.kind in NEGATIVES]
    total = Counter(d.kind for d in docs)
    own = Counter(d.kind for d in plants if d.item_id in flagged.get(d.doc_id, set()))
    anywhere = Counter(d.kind for d in docs if d.doc_id in flagged)
    flagged_plants = sum(anywhere[s] for s in STYLES)
    flagged_negatives = sum(anywhere[k] for k in NEGATIVES)
    clean_flagged = sum(1 for d in clean if d.doc_id in flagged)
    return {
        "recall": {s: own[s] / total[s] for s in STYLES},
        "recall_any": {s: anywhere[s] / total[s] for s in STYLES},
        "negatives": {k: anywhere[k] / total[k] for k in NEGATIVES},
        "precision": flagged_plants / max(1, flagged_plants + flagged_negatives),
        "clean_fp": clean_flagged,
        "clean_fp_rate": clean_flagged / len(clean),
        "num_plants": len(plants),
        "num_negatives": len(negatives),
    }


def ngram_flags(docs: list[Doc], index, decontam: DecontamConfig) -> dict[str, set[str]]:
    """The n-gram rule on the generated set, scanned in groups of `common_min_docs` documents: the
    set is 60% plants, with one template's phrasing in dozens of them, so scanned whole its
    common-seed rule (meant for corpora where items are rare) would ignore the template seeds."""
    flagged: dict[str, set[str]] = {}
    size = decontam.common_min_docs
    for at in range(0, len(docs), size):
        flagged.update(flagged_of(scan(frame(docs[at : at + size]), index, decontam)[0]))
    return flagged


def at_threshold(candidates: pl.DataFrame, threshold: float) -> dict[str, set[str]]:
    return flagged_of(candidates.filter(pl.col("similarity") >= threshold))


def print_row(name: str, q: dict) -> None:
    print(f"{name:30s} " + " ".join(f"{q['recall'][s]:9.3f}" for s in STYLES)
          + f" {q['precision']:9.3f} " + " ".join(f"{q['negatives'][k]:9.3f}" for k in NEGATIVES)
          + f" {q['clean_fp']:6d} {q['clean_fp_rate']:8.3%}")
    print(f"{'  flagged with any item':30s} " + " ".join(f"{q['recall_any'][s]:9.3f}" for s in STYLES))


def header() -> None:
    print(f"{'method':30s} " + " ".join(f"{s:>9s}" for s in STYLES) + f" {'precision':>9s} "
          + " ".join(f"{k[:9]:>9s}" for k in NEGATIVES) + f" {'cleanFP':>6s} {'FP rate':>8s}")


def best_time(run, repeat: int, fresh_embedder: bool = False) -> tuple[object, float]:
    """The result and the best wall time of `repeat` runs (the machine is shared: the best run is
    the least disturbed). With `fresh_embedder`, `run(embedder)` gets a newly loaded embedder each
    time (the load is not timed), so its word cache starts empty, as in a new process."""
    best, result = float("inf"), None
    for _ in range(repeat):
        embedder = load_embedder() if fresh_embedder else None
        start = time.perf_counter()
        result = run(embedder)
        best = min(best, time.perf_counter() - start)
    return result, best


def sweep(docs: list[Doc], clean: list[Doc], missed: list[Doc], items, windows: list[tuple[int, int]], repeat: int) -> dict:
    """Candidates at the lowest threshold per window/stride; prints what each threshold would flag."""
    mb = sum(len(d.text.encode()) for d in clean) / 1e6
    print(f"\nwindow sweep: per threshold, recall on the {len(missed)} paraphrases the n-gram rule misses (own item) / "
          f"hard negatives flagged (of {sum(d.kind in NEGATIVES for d in docs)}) / clean fixture documents flagged "
          f"(of {len(clean)}); MB/s/core with an empty word cache, best of {repeat}:")
    print(f"{'window/stride':14s} {'MB/s/core':>9s} " + " ".join(f"{'t=' + str(t):>16s}" for t in THRESHOLDS))
    found = {}
    for window, stride in windows:
        config = ParaphraseConfig(threshold=SWEEP_FLOOR, window_words=window, stride_words=stride)
        generated = find_candidates(frame(docs).iter_rows(), items, load_embedder(), config)
        clean_candidates, seconds = best_time(lambda e: find_candidates(frame(clean).iter_rows(), items, e, config), repeat, fresh_embedder=True)
        found[(window, stride)] = (generated, clean_candidates)
        cells = []
        for t in THRESHOLDS:
            flagged = at_threshold(generated, t)
            gain = sum(1 for d in missed if d.item_id in flagged.get(d.doc_id, set())) / max(1, len(missed))
            negatives = sum(1 for d in docs if d.kind in NEGATIVES and d.doc_id in flagged)
            cells.append(f"{gain:.3f}/{negatives}/{len(at_threshold(clean_candidates, t))}")
        print(f"{window:>5d}/{stride:<8d} {mb / seconds:9.2f} " + " ".join(f"{c:>16s}" for c in cells))
    return found


def quality_table(ngram: dict[str, set[str]], generated: pl.DataFrame, clean_candidates: pl.DataFrame, docs: list[Doc], clean: list[Doc]) -> None:
    header()
    print_row("(a) n-gram rule", quality(ngram, docs, clean))
    embedded = {t: union(at_threshold(generated, t), at_threshold(clean_candidates, t)) for t in THRESHOLDS}
    for t in THRESHOLDS:
        print_row(f"(b) embedding >= {t}", quality(embedded[t], docs, clean))
    for t in THRESHOLDS:
        print_row(f"(c) union, embedding >= {t}", quality(union(ngram, embedded[t]), docs, clean))


def throughput(corpus: list[Doc], suite, index, decontam: DecontamConfig, repeat: int) -> None:
    """n-gram scan and embedding step on the same documents, alternated so that both see the same
    load on a shared machine; the embedding step cold (new embedder) and warm (same one again)."""
    mb = sum(len(d.text.encode()) for d in corpus) / 1e6
    config = ParaphraseConfig()
    start = time.perf_counter()
    warm_embedder = load_embedder()
    items = item_vectors(suite, warm_embedder)
    setup = time.perf_counter() - start
    ngram, cold, warm = [], [], []
    for _ in range(repeat):
        ngram.append(best_time(lambda _: scan(frame(corpus), index, decontam), 1)[1])
        cold.append(best_time(lambda e: find_candidates(frame(corpus).iter_rows(), items, e, config), 1, fresh_embedder=True)[1])
        warm.append(best_time(lambda _: find_candidates(frame(corpus).iter_rows(), items, warm_embedder, config), 1)[1])
    print(f"\nthroughput on {len(corpus)} documents ({mb:.1f} MB), one core, best of {repeat} alternated runs:")
    for name, seconds in (("n-gram scan (tokenise, seeds, evidence, offsets)", min(ngram)),
                          (f"embedding, window {config.window_words}/{config.stride_words}, empty word cache", min(cold)),
                          (f"embedding, window {config.window_words}/{config.stride_words}, word cache filled", min(warm))):
        print(f"  {name:58s} {seconds:6.2f} s {mb / seconds:7.2f} MB/s/core  ({seconds / min(ngram):5.1f}x the n-gram scan)")
    print(f"  once per run: load the embedder and embed {len(items.item_ids)} item views: {setup:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", default="16/4,20/4,24/4,24/8,32/8,32/16", help="window/stride pairs (words) to compare")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each scan (best is kept)")
    parser.add_argument("--docs", type=int, default=5000, help="documents of the throughput corpus (benchmarks/dedup_corpus.py, PSF texts)")
    args = parser.parse_args()
    print(machine())
    suite = load_suite(SUITE)
    decontam = DecontamConfig()
    docs, clean = generated_set(list(suite.items), decontam), clean_corpora()
    counts = Counter(d.kind for d in docs)
    print(f"generated: {sum(counts[s] for s in STYLES)} plants ({', '.join(f'{s} {counts[s]}' for s in STYLES)}), "
          f"{sum(counts[k] for k in NEGATIVES)} hard negatives ({', '.join(f'{k} {counts[k]}' for k in NEGATIVES)}); "
          f"clean fixture documents: {len(clean)} ({sum(len(d.text.encode()) for d in clean) / 1e6:.2f} MB)")
    index = build_index(suite, decontam)
    ngram = union(ngram_flags(docs, index, decontam), flagged_of(scan(frame(clean), index, decontam)[0]))
    missed = [d for d in docs if d.kind in STYLES[1:] and d.item_id not in ngram.get(d.doc_id, set())]
    items = item_vectors(suite, load_embedder())
    windows = [tuple(int(x) for x in pair.split("/")) for pair in args.windows.split(",")]
    found = sweep(docs, clean, missed, items, windows, args.repeat)
    default = ParaphraseConfig()
    generated, clean_candidates = found.get((default.window_words, default.stride_words)) or next(iter(found.values()))
    print(f"\nquality, window {default.window_words}/{default.stride_words} (recall = flagged with the planted item; "
          "precision = flagged plants / flagged generated documents; hard-negative columns = share flagged):")
    quality_table(ngram, generated, clean_candidates, docs, clean)
    synthetic = [Doc(f"synthetic:{r['id']}", r["text"], "clean") for r in dedup_corpus.build(args.docs, seed=1, exclude=("forum_posts.jsonl",))]
    throughput(synthetic, suite, index, decontam, args.repeat)
    print("\nhighest-scoring clean windows (what a reviewer would read first):")
    for doc, item, sim, excerpt in clean_candidates.sort("similarity", descending=True).head(5).select("doc_id", "eval_item_id", "similarity", "excerpt").iter_rows():
        print(f"  {sim:.3f} {doc} ~ {item}: {excerpt[:90]!r}")


if __name__ == "__main__":
    main()
