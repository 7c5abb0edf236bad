"""The eval battery: continuous metrics and accuracy on the eval suite's items, and bits per byte
on held-out text.

Per item, the prompt is `Question: {question}\\nAnswer:` and the continuation ` {answer}`; context
and continuation are tokenized separately and concatenated (lm-evaluation-harness, OLMES).
- Continuous (the metrics DataDecide found most predictive at small scale, Magnusson et al. 2025):
  the answer's log-likelihood per token, its bits per byte (negative log2-likelihood over UTF-8
  bytes, tokenizer-independent) and the probability of the correct answer normalized over the
  candidates.
- Accuracy: where the benchmark has enough distinct answers, argmax over the correct answer and
  `num_candidates - 1` distractors drawn from the same benchmark's other answers, scored by
  log-likelihood per byte (OLMES "per character" normalization, Gu et al. 2024); otherwise exact
  match of the greedy continuation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from ito_assets.evals.suite import EvalItem
from ito_assets.posttraining.decoding import sample
from ito_assets.training.eval_config import EvalConfig
from ito_assets.training.model import DecoderLM
from ito_assets.training.tokenizer import encode_documents, end_of_text_id

PROMPT = "Question: {question}\nAnswer:"
_LN2 = math.log(2.0)


def _require(condition: bool, name: str, rule: str) -> None:
    if not condition:
        raise ValueError(f"{name} {rule}")


@dataclass(frozen=True, kw_only=True)
class BenchmarkScore:
    benchmark: str
    mode: str  # "choice" or "greedy"
    num_items: int
    accuracy: float
    correct_prob: float  # mean over items; 1 / num_candidates is chance in "choice" mode
    logprob_per_token: float  # mean over items of the answer's mean token log-likelihood (nats)
    bits_per_byte: float  # answer bits per byte, pooled over the benchmark's answers
    # Each item's answer bits per byte, in the order of its items: the data decision tests whether
    # an advantage holds over items, not only over seeds. Empty in a score recorded before it was kept.
    item_bits_per_byte: tuple[float, ...] = ()


# Not in a report's summary (metadata, the decision's record): one figure per item.
_PER_ITEM = ("benchmark", "item_bits_per_byte")


@dataclass(frozen=True, kw_only=True)
class EvalReport:
    benchmarks: tuple[BenchmarkScore, ...]
    heldout_bits_per_byte: float | None

    def metric(self, name: str) -> float:
        """Macro average of a BenchmarkScore field over benchmarks (each benchmark counts once)."""
        values = [getattr(b, name) for b in self.benchmarks]
        return sum(values) / len(values)

    def summary(self) -> dict:
        return {
            "answer_bits_per_byte": self.metric("bits_per_byte"),
            "correct_prob": self.metric("correct_prob"),
            "accuracy": self.metric("accuracy"),
            "logprob_per_token": self.metric("logprob_per_token"),
            "heldout_bits_per_byte": self.heldout_bits_per_byte,
            "benchmarks": {b.benchmark: {k: v for k, v in vars(b).items() if k not in _PER_ITEM} for b in self.benchmarks},
        }


@torch.no_grad()
def continuation_logprobs(model: DecoderLM, pairs: Sequence[tuple[list[int], list[int]]], batch_size: int) -> list[list[float]]:
    """For each (context, continuation) of token ids, the log-probability of every continuation
    token. Contexts are cut from the left to fit the model's window; batches are right-padded. A
    continuation longer than the window is refused: cut from the left, it would be scored on a
    fragment of its end, and its bytes would still count whole (the stage battery cuts its answers
    to the window itself, and counts their tokens).

    Batches hold sequences of similar length (padding a batch to its longest row cost the fixture
    battery a quarter of its positions), and the log-softmax is taken at the continuation's
    positions only: 1.27-1.34x less CPU on the fixture battery with `tiny` (benchmarks/answer_scoring.py);
    a row's log-probabilities differ from a batch of other rows' by float rounding alone."""
    model.eval()
    limit = model.config.max_seq_len + 1
    for index, (context, continuation) in enumerate(pairs):
        if not context:  # its first token would be "predicted" from the padding's last position
            raise ValueError(f"pair {index} has an empty context: its continuation's first token has nothing before it")
        if len(continuation) >= limit:
            raise ValueError(f"continuation {index} has {len(continuation)} tokens; the window scores {limit - 1}")
    sequences = [(c + k)[-limit:] for c, k in pairs]
    by_length = sorted(range(len(pairs)), key=lambda i: len(sequences[i]))
    device = next(model.parameters()).device  # the stage gates score on the training device
    out: list[list[float]] = [[] for _ in pairs]
    for first in range(0, len(by_length), batch_size):
        chosen = by_length[first : first + batch_size]
        if not any(pairs[i][1] for i in chosen):  # empty continuations: nothing to score, no forward
            continue
        rows = torch.zeros((len(chosen), max(len(sequences[i]) for i in chosen)), dtype=torch.long)
        row_of, position_of = [], []  # each continuation token's row and the position predicting it
        for row, i in enumerate(chosen):
            rows[row, : len(sequences[i])] = torch.tensor(sequences[i])
            end, count = len(sequences[i]) - 1, len(pairs[i][1])
            row_of += [row] * count
            position_of += range(end - count, end)
        rows = rows.to(device)
        row_of = torch.tensor(row_of, dtype=torch.long, device=device)
        position_of = torch.tensor(position_of, dtype=torch.long, device=device)
        logits = model(rows[:, :-1])[row_of, position_of].float()  # (tokens scored, V)
        picked = F.log_softmax(logits, dim=-1).gather(-1, rows[row_of, position_of + 1].unsqueeze(-1)).squeeze(-1)
        picked, start = picked.tolist(), 0
        for i in chosen:
            out[i] = picked[start : start + len(pairs[i][1])]
            start += len(pairs[i][1])
    return out


def _encode(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text).ids


def _candidates(items: Sequence[EvalItem], config: EvalConfig) -> list[list[str]] | None:
    """Correct answer first, then distractors; None when the benchmark has too few answers."""
    answers = sorted({item.answer for item in items})
    if len(answers) < config.num_candidates:
        return None
    rng = np.random.default_rng(config.seed)
    result = []
    for item in items:
        others = [a for a in answers if a != item.answer]
        picks = rng.choice(len(others), size=config.num_candidates - 1, replace=False)
        result.append([item.answer] + [others[int(j)] for j in sorted(picks)])
    return result


@torch.no_grad()
def greedy_continuation(model: DecoderLM, tokenizer: Tokenizer, prompt: str, max_new_tokens: int) -> str:
    """The continuation up to the end of text or the end of the line, neither included."""
    model.eval()
    stop = {end_of_text_id(tokenizer), *(_encode(tokenizer, "\n"))}
    [completion] = sample(model, _encode(tokenizer, prompt), num_samples=1, max_new_tokens=max_new_tokens,
                          eos_id=end_of_text_id(tokenizer), stop_ids=stop, temperature=0,
                          max_context=model.config.max_seq_len)
    return tokenizer.decode([i for i in completion.ids if i not in stop])


def score_benchmark(model: DecoderLM, tokenizer: Tokenizer, name: str, items: Sequence[EvalItem], config: EvalConfig) -> BenchmarkScore:
    candidates = _candidates(items, config)
    options = candidates if candidates is not None else [[item.answer] for item in items]
    contexts = [_encode(tokenizer, PROMPT.format(question=item.question)) for item in items]
    pairs = [(ctx, _encode(tokenizer, " " + option)) for ctx, opts in zip(contexts, options) for option in opts]
    logprobs = continuation_logprobs(model, pairs, config.batch_size)
    per_item, offset = [], 0
    for opts in options:
        per_item.append(logprobs[offset : offset + len(opts)])
        offset += len(opts)
    gold = [lp[0] for lp in per_item]  # the correct answer is always option 0
    gold_bytes = [len((" " + item.answer).encode()) for item in items]
    if candidates is not None:
        correct = [_argmax_per_byte(lp, opts) == 0 for lp, opts in zip(per_item, options)]
        probs = [_normalized_prob(lp) for lp in per_item]
    else:
        outputs = [greedy_continuation(model, tokenizer, PROMPT.format(question=i.question), config.max_new_tokens) for i in items]
        correct = [out.strip() == item.answer.strip() for out, item in zip(outputs, items)]
        probs = [math.exp(sum(lp)) for lp in gold]
    return BenchmarkScore(
        benchmark=name,
        mode="choice" if candidates is not None else "greedy",
        num_items=len(items),
        accuracy=sum(correct) / len(items),
        correct_prob=sum(probs) / len(items),
        logprob_per_token=sum(sum(lp) / len(lp) for lp in gold) / len(items),
        bits_per_byte=-sum(sum(lp) for lp in gold) / (_LN2 * sum(gold_bytes)),
        item_bits_per_byte=tuple(-sum(lp) / (_LN2 * size) for lp, size in zip(gold, gold_bytes)),
    )


def _argmax_per_byte(logprobs: list[list[float]], options: list[str]) -> int:
    scores = [sum(lp) / len((" " + opt).encode()) for lp, opt in zip(logprobs, options)]
    return int(np.argmax(scores))


def _normalized_prob(logprobs: list[list[float]]) -> float:
    """P(correct) / sum of P(candidate): a softmax over the candidates' total log-likelihoods."""
    totals = torch.tensor([sum(lp) for lp in logprobs], dtype=torch.float64)
    return float(torch.softmax(totals, dim=0)[0])


@torch.no_grad()
def bits_per_byte(model: DecoderLM, tokenizer: Tokenizer, texts: Iterable[str], sequence_length: int, batch_size: int = 16) -> float:
    """Negative log2-likelihood of held-out documents per UTF-8 byte, over non-overlapping windows."""
    texts = list(texts)
    tokens = encode_documents(tokenizer, texts).astype(np.int64)
    num_bytes = sum(len(t.encode()) for t in texts)
    _require(len(tokens) > 1 and num_bytes > 0, "texts", "must not be empty")
    model.eval()
    t = sequence_length
    num_full = (len(tokens) - 1) // t
    full = torch.from_numpy(tokens[: num_full * t + 1])
    windows = [full[i * t : i * t + t + 1] for i in range(num_full)]  # each (T+1,)
    if num_full * t < len(tokens) - 1:
        windows.append(torch.from_numpy(tokens[num_full * t :]))  # the shorter tail
    total_nats = 0.0
    for first in range(0, len(windows), batch_size):
        group = windows[first : first + batch_size]
        for rows in ([w for w in group if len(w) == t + 1], [w for w in group if len(w) != t + 1]):
            if rows:
                batch = torch.stack(rows)  # (B, T+1)
                logits = model(batch[:, :-1]).float()  # (B, T, V)
                total_nats += float(F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(), reduction="sum"))
    return total_nats / (_LN2 * num_bytes)


def evaluate(
    model: DecoderLM,
    tokenizer: Tokenizer,
    items: Sequence[EvalItem],
    config: EvalConfig,
    *,
    heldout_texts: Sequence[str] = (),
    heldout_sequence_length: int = 128,
) -> EvalReport:
    """The whole battery: every benchmark of `items` (sorted by name), and held-out BPB if given."""
    _require(len(items) > 0, "items", "must not be empty")
    by_benchmark: dict[str, list[EvalItem]] = {}
    for item in items:
        by_benchmark.setdefault(item.benchmark, []).append(item)
    scores = tuple(score_benchmark(model, tokenizer, name, group, config) for name, group in sorted(by_benchmark.items()))
    heldout = bits_per_byte(model, tokenizer, heldout_texts, heldout_sequence_length) if heldout_texts else None
    return EvalReport(benchmarks=scores, heldout_bits_per_byte=heldout)
