"""The eval battery's answer scoring (`evaluation.continuation_logprobs`, which the decision's
battery and the stages' gates call) against the way it scored before: batches in the callers'
order padded to their longest row, and a log-softmax at every position. Both score the fixture
suite's multiple-choice pairs (each answer and its distractors) with an untrained model of the
named size; CPU seconds of this process, best of `--repeats`, one torch thread.

    .venv/bin/python benchmarks/answer_scoring.py [--model tiny] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from ito_assets.evals.suite import load_suite  # noqa: E402
from ito_assets.training import evaluation  # noqa: E402
from ito_assets.training.eval_config import EvalConfig  # noqa: E402
from ito_assets.training.model import build_model, config_by_name  # noqa: E402
from ito_assets.training.tokenizer import TokenizerConfig, train_tokenizer  # noqa: E402

SUITE = ROOT / "data/fixtures/evals/ito-fixture-evals-v1.jsonl"
CORPUS = ROOT / "data/fixtures/corpora/pydoc_topics.jsonl"


@torch.no_grad()
def padded_in_order(model, pairs, batch_size: int) -> list[list[float]]:
    """The baseline: batches in the callers' order, the log-softmax over every position."""
    limit = model.config.max_seq_len + 1
    out = []
    for first in range(0, len(pairs), batch_size):
        chunk = [(c + k)[-limit:] for c, k in pairs[first : first + batch_size]]
        rows = torch.zeros((len(chunk), max(len(s) for s in chunk)), dtype=torch.long)
        for i, seq in enumerate(chunk):
            rows[i, : len(seq)] = torch.tensor(seq)
        logp = F.log_softmax(model(rows[:, :-1]).float(), dim=-1)
        picked = logp.gather(-1, rows[:, 1:].unsqueeze(-1)).squeeze(-1)
        for i, (seq, (_, cont)) in enumerate(zip(chunk, pairs[first : first + batch_size])):
            out.append(picked[i, len(seq) - 1 - len(cont) : len(seq) - 1].tolist())
    return out


def battery_pairs(tokenizer, config: EvalConfig) -> list[list[tuple[list[int], list[int]]]]:
    """Each benchmark's (prompt, answer) token pairs as `score_benchmark` builds them."""
    by_benchmark: dict[str, list] = {}
    for item in load_suite(SUITE).items:
        by_benchmark.setdefault(item.benchmark, []).append(item)
    batteries = []
    for _, items in sorted(by_benchmark.items()):
        options = evaluation._candidates(items, config) or [[item.answer] for item in items]
        contexts = [tokenizer.encode(evaluation.PROMPT.format(question=item.question)).ids for item in items]
        batteries.append([(context, tokenizer.encode(" " + option).ids)
                          for context, choices in zip(contexts, options) for option in choices])
    return batteries


def cpu_seconds(score, model, batteries, batch_size: int, repeats: int) -> tuple[float, list]:
    best, result = float("inf"), None
    for _ in range(repeats):
        started = time.process_time()
        result = [score(model, pairs, batch_size) for pairs in batteries]
        best = min(best, time.process_time() - started)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    texts = [json.loads(line)["text"] for line in CORPUS.read_text().splitlines()]
    tokenizer = train_tokenizer(texts, TokenizerConfig())
    model = build_model(config_by_name(args.model, vocab_size=tokenizer.get_vocab_size()), seed=0).eval()
    config = EvalConfig()
    batteries = battery_pairs(tokenizer, config)
    baseline_s, expected = cpu_seconds(padded_in_order, model, batteries, config.batch_size, args.repeats)
    scoring_s, got = cpu_seconds(evaluation.continuation_logprobs, model, batteries, config.batch_size, args.repeats)
    gap = max(abs(a - b) for want, have in zip(expected, got) for x, y in zip(want, have) for a, b in zip(x, y))
    print(json.dumps({
        "model": args.model, "pairs": sum(len(pairs) for pairs in batteries),
        "baseline_cpu_s": round(baseline_s, 3), "continuation_logprobs_cpu_s": round(scoring_s, 3),
        "speedup": round(baseline_s / scoring_s, 2), "max_logprob_difference": gap,
    }, indent=1))


if __name__ == "__main__":
    main()
