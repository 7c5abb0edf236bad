"""The stage's eval battery (held-out loss and answer loss on the eval suite) and where its gate
thresholds come from (the manifest's `eval_gate`, else the runtime resource)."""

from __future__ import annotations

import json
from pathlib import Path

import pydantic
import pytest
import torch
import torch.nn.functional as F

from ito_assets.defs.training.resources import TrainingRuntimeResource
from ito_assets.evals.suite import EvalItem
from ito_assets.manifest.schema import EvalGate, Manifest
from ito_assets.runtime.stage import battery as stage_eval
from ito_assets.training.evaluation import PROMPT
from ito_assets.training.model import build_model, config_by_name
from ito_assets.training.tokenizer import LoaderConfig, TokenizerConfig, encode_documents, iterate_batches, train_tokenizer
from ito_assets.training.trainer import TrainConfig, train

pytestmark = pytest.mark.filterwarnings("ignore::dagster.PreviewWarning")
ROOT = Path(__file__).resolve().parents[2]
ITEMS = tuple(EvalItem(id=f"t/{i}", benchmark="t", question=q, answer=a) for i, (q, a) in enumerate([
    ("Which keyword defines a function?", "def"),
    ("What does len return for an empty list?", "zero, because the list holds no items"),
    ("Which exception does a missing dictionary key raise?", "KeyError"),
]))


@pytest.fixture(scope="module")
def tokenizer():
    texts = [PROMPT.format(question=i.question) + " " + i.answer for i in ITEMS] * 20
    return train_tokenizer(texts, TokenizerConfig(vocab_size=300)), texts


def test_answer_loss_is_the_answers_nll_per_token_pooled_over_items(tokenizer):
    tok, _ = tokenizer
    model = build_model(config_by_name("micro", vocab_size=tok.get_vocab_size()), seed=0)
    expected = []
    for item in ITEMS:
        prompt, answer = tok.encode(PROMPT.format(question=item.question)).ids, tok.encode(" " + item.answer).ids
        ids = torch.tensor([prompt + answer])
        with torch.no_grad():
            logits = model(ids[:, :-1])[0, -len(answer):]  # the positions that predict the answer
        expected.append((float(F.cross_entropy(logits, torch.tensor(answer), reduction="sum")), len(answer)))
    got = stage_eval.answer_loss(model, tok, ITEMS)
    assert got == pytest.approx(sum(n for n, _ in expected) / sum(c for _, c in expected), rel=1e-5)
    assert len({c for _, c in expected}) > 1  # answers of different lengths: pooling is not a mean of means
    assert model.training  # the eval leaves the model as it found it


def test_the_battery_moves_with_training_on_the_answers(tokenizer):
    tok, texts = tokenizer
    model = build_model(config_by_name("micro", vocab_size=tok.get_vocab_size()), seed=0)
    tokens = encode_documents(tok, texts)
    battery = stage_eval.Battery(heldout=tokens, sequence_length=32, num_windows=8, tokenizer=tok, items=ITEMS)
    before = stage_eval.run_battery(model, battery)
    config = TrainConfig(num_steps=40, batch_size=8, sequence_length=32)
    train(model, iterate_batches(tokens, LoaderConfig(batch_size=8, sequence_length=32, seed=0)), config)
    after = stage_eval.run_battery(model, battery)
    assert set(before) == set(after) == {"heldout_loss", "answer_loss"}
    assert after["answer_loss"] < before["answer_loss"] - 1.0 and after["heldout_loss"] < before["heldout_loss"] - 1.0
    without_suite = stage_eval.Battery(heldout=tokens, sequence_length=32, num_windows=8)
    assert set(stage_eval.run_battery(model, without_suite)) == {"heldout_loss"}


def test_the_gate_judges_every_metric_of_the_battery_with_the_manifests_thresholds():
    runtime = TrainingRuntimeResource(min_improvement_bands=3.0)
    default = runtime.gate_policy(None)
    assert [m.name for m in default.metrics] == ["heldout_loss", "answer_loss"]
    assert (default.min_improvement_bands, default.max_regression_bands) == (3.0, 2.0)
    reviewed = runtime.gate_policy(EvalGate(min_improvement_bands=1.0, max_regression_bands=0.5))
    assert (reviewed.min_improvement_bands, reviewed.max_regression_bands) == (1.0, 0.5)
    assert reviewed.metrics == default.metrics  # noise bands are measured, never reviewed


def test_eval_gate_is_optional_in_the_manifest():
    document = json.loads((ROOT / "data/fixtures/manifests/fixture-docs-only.json").read_bytes())
    assert Manifest.model_validate_json(json.dumps(document)).training_target.eval_gate is None  # unchanged
    document["training_target"]["eval_gate"] = {"min_improvement_bands": 4, "max_regression_bands": 1.5}
    gate = Manifest.model_validate_json(json.dumps(document)).training_target.eval_gate
    assert (gate.min_improvement_bands, gate.max_regression_bands) == (4.0, 1.5)
    for bad in ({"min_improvement_bands": -1.0}, {"max_regression_bands": 1.0, "override": True}):
        document["training_target"]["eval_gate"] = bad
        with pytest.raises(pydantic.ValidationError):
            Manifest.model_validate_json(json.dumps(document))
