"""Post-training from the pretraining chain's result: the BPE codec and its special tokens, the
DCP checkpoint loaded (and refused when changed), pair files bound to the manifest by digest, and
the stage figures as the ledger receives them for `ito metrics`."""

from __future__ import annotations

import hashlib
import json
import pickle
import time
from pathlib import Path

import pytest
import torch

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.schema import DpoStep, SftStep
from ito_assets.posttraining.base import load_pretrained, pretrained, seeded
from ito_assets.posttraining.bpe import BpeCodec, TokenizerRef
from ito_assets.posttraining.fixtures import InstructionPair, instruction_pairs, read_bound_pairs, write_jsonl
from ito_assets.posttraining.pipeline import battery
from ito_assets.posttraining.publish import MAX_CURVE_POINTS, publish_outcome, stage_metrics
from ito_assets.posttraining.sft import response_batch
from ito_assets.posttraining.stage import StageOutcome
from ito_assets.training.tokenizer import END_OF_TEXT
from posttraining.pretrained_checkpoint import Pretrained, make_pretrained


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Pretrained:
    return make_pretrained(tmp_path_factory.mktemp("pretrained"), num_steps=2)


def test_bpe_codec_uses_end_of_text_for_every_special_role(base):
    codec = BpeCodec.load(base.tokenizer)
    separator = codec.encode(END_OF_TEXT)  # not split: it is the tokenizer's one special token
    assert [codec.bos_id] == [codec.eos_id] == [codec.pad_id] == separator
    assert codec.vocab_size == base.tokens.vocab_size
    prompt, answer = codec.encode("max 371="), codec.encode("7")
    assert codec.decode(prompt) == "max 371=" and codec.decode(answer + [codec.eos_id]) == "7"
    assert codec.decode(prompt + answer) == "max 371=7"  # joined encodings decode as the joined text


def test_bpe_response_batch_masks_response_and_eos(base):
    codec = BpeCodec.load(base.tokenizer)
    tokens, mask = response_batch(codec, ["max 371="], ["7"])
    num_prompt = 1 + len(codec.encode("max 371="))  # bos + prompt
    assert tokens[0].tolist() == [codec.bos_id, *codec.encode("max 371="), *codec.encode("7"), codec.eos_id]
    assert mask[0].tolist() == [0.0] * (num_prompt - 1) + [1.0, 1.0]  # targets: the answer, then eos


def test_bpe_codec_pickles_into_the_generator_process(base):
    codec = BpeCodec.load(base.tokenizer)
    copy = pickle.loads(pickle.dumps(codec))
    assert copy == codec and copy.encode("max 905=") == codec.encode("max 905=")


def test_changed_tokenizer_is_refused(base, tmp_path):
    changed = tmp_path / "tokenizer.json"
    changed.write_text(Path(base.tokens.tokenizer_path).read_text().replace("max", "mux", 1))
    with pytest.raises(ItoError) as caught:
        BpeCodec.load(TokenizerRef(path=str(changed), sha256=base.tokens.tokenizer_sha256))
    assert caught.value.code is ErrorCode.CHECKPOINT_DIGEST_MISMATCH


def _spec(base: Pretrained):
    return pretrained(model_name="tiny", vocab_size=base.tokens.vocab_size, checkpoint=base.checkpoint,
                      tokenizer=base.tokenizer, seed=7)  # another seed: the weights must come from the checkpoint


def test_the_first_stage_starts_from_the_checkpoint_weights(base):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from ito_assets.runtime.worker import train_state

    policy = _spec(base).initial_policy()
    template = {"model": {k: torch.zeros_like(v) for k, v in train_state.weights(policy).items()}}
    with pytest.warns(UserWarning):  # DCP says it reads in one process
        dcp.load(template, checkpoint_id=base.checkpoint)  # what the runtime wrote, read independently
    loaded = get_model_state_dict(policy)
    assert all(torch.equal(loaded[k], v) for k, v in template["model"].items())
    assert policy.head.weight is policy.embedding.weight  # the weight saved once is tied again
    fresh = _spec(base).factory()()
    assert not torch.equal(fresh.embedding.weight, policy.embedding.weight)


def test_a_changed_checkpoint_is_refused(base, tmp_path):
    import shutil

    folder = tmp_path / "step-000000002"
    shutil.copytree(base.checkpoint, folder)
    shard = next(p for p in folder.iterdir() if p.suffix == ".distcp")
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the weights
    shard.write_bytes(bytes(data))
    with pytest.raises(ItoError) as caught:
        load_pretrained(_spec(base).factory()(), folder)
    assert caught.value.code is ErrorCode.CHECKPOINT_DIGEST_MISMATCH


# --- pair files bound by digest ---------------------------------------------------------------


def _bound(tmp_path: Path, kind: str = "sft", sha256: str | None = None):
    train, _ = battery()
    path = tmp_path / "data" / "pairs.jsonl"
    write_jsonl(path, instruction_pairs(train[:8], copies=1, seed=0, error_rate=0.0))
    data = {"uri": "dataroot://pairs.jsonl", "format": "jsonl", "license": "CC0-1.0",
            "sha256": sha256 or hashlib.sha256(path.read_bytes()).hexdigest()}
    step = (SftStep if kind == "sft" else DpoStep).model_validate({"kind": kind, "data": data})
    return step, path


def test_bound_pairs_are_read_when_the_digest_holds(tmp_path):
    step, _ = _bound(tmp_path)
    assert len(read_bound_pairs(step, tmp_path / "data")) == 8


@pytest.mark.parametrize("change, code", [
    ("edit", ErrorCode.SOURCE_DIGEST_MISMATCH), ("remove", ErrorCode.SOURCE_NOT_FOUND),
    ("unbind", ErrorCode.PROVENANCE_MISSING),
])
def test_bound_pairs_are_refused(tmp_path, change, code):
    step, path = _bound(tmp_path)
    if change == "edit":
        path.write_text(path.read_text().replace('"response": "', '"response": "9', 1))
    elif change == "remove":
        path.unlink()
    else:
        step = SftStep.model_validate({"kind": "sft"})
    with pytest.raises(ItoError) as caught:
        read_bound_pairs(step, tmp_path / "data")
    assert caught.value.code is code


_PAIR = '{"pair_id": "a", "prompt": "1+1=", "response": "2"}'


def _bound_step(root, body: bytes) -> SftStep:
    """An SFT step bound (uri, digest) to `body`, written as root/data/pairs.jsonl."""
    path = root / "data" / "pairs.jsonl"
    path.parent.mkdir(parents=True)
    path.write_bytes(body)
    return SftStep.model_validate({"kind": "sft", "data": {
        "uri": "dataroot://pairs.jsonl", "format": "jsonl", "license": "CC0-1.0",
        "sha256": hashlib.sha256(body).hexdigest()}})


@pytest.mark.parametrize("body, says", [
    (b'["pair_id", "prompt", "response"]\n', "line 1 is not an object"),  # the fields, as a list
    (b"null\n", "line 1 is not an object"),
    (b"[" * 5000 + b"]" * 5000 + b"\n", "line 1 is not JSON"),  # nested past the parser's limit
    (b'{"pair_id": "a", "prompt": "\\ud800", "response": "2"}\n', "line 1 holds a lone surrogate"),
    (_PAIR.encode() + b"\n\xff\n", "is not UTF-8"),
    (_PAIR.encode() + b"\n{\"pair_id\": \"b\", \"pro", "line 2 is not JSON"),  # cut mid-line
    (b"", "holds no pairs"),
])
def test_bound_pairs_that_are_not_pairs_are_refused_by_line(tmp_path, body, says):
    """Whatever the bytes that hash to the manifest's digest, a stable code naming the line, never
    a TypeError or a RecursionError."""
    with pytest.raises(ItoError) as caught:
        read_bound_pairs(_bound_step(tmp_path, body), tmp_path / "data")
    assert caught.value.code is ErrorCode.POSTTRAINING_DATA_INVALID and says in caught.value.message


def test_a_raw_line_separator_inside_a_string_is_one_pair(tmp_path):
    """JSON allows U+2028 raw in a string (str.splitlines cuts there): one line, one pair, the text kept."""
    body = '{"pair_id": "a", "prompt": "1+1=\u2028", "response": "2"}\n'.encode()
    (pair,) = read_bound_pairs(_bound_step(tmp_path, body), tmp_path / "data")
    assert pair.prompt == "1+1=\u2028"


def _bound_lines(tmp_path: Path, lines: list[str], kind: str = "sft"):
    body = "".join(line + "\n" for line in lines).encode()
    path = tmp_path / "data" / "pairs.jsonl"
    path.parent.mkdir(parents=True)
    path.write_bytes(body)
    data = {"uri": "dataroot://pairs.jsonl", "format": "jsonl", "license": "CC0-1.0",
            "sha256": hashlib.sha256(body).hexdigest()}
    return (SftStep if kind == "sft" else DpoStep).model_validate({"kind": kind, "data": data})


def _sft(pair_id: str, prompt: str, response: str = "2") -> str:
    return json.dumps({"pair_id": pair_id, "prompt": prompt, "response": response})


def _dpo(pair_id: str, prompt: str, rejected: str = "3") -> str:
    return json.dumps({"pair_id": pair_id, "prompt": prompt, "chosen": "2", "rejected": rejected})


# micro holds 256 positions; the runtime's batch is 8 pairs.
@pytest.mark.parametrize("kind, lines, says", [
    ("sft", [_sft(str(i), "1+1=") for i in range(7)] + [_sft("7", "9" * 255)], "line 8 needs 257 positions"),
    ("dpo", [_dpo(str(i), "1+1=") for i in range(7)] + [_dpo("7", "1+1=", "3" * 300)], "line 8 needs 305 positions"),
    ("sft", [_sft(str(i), "1+1=") for i in range(7)], "holds 7 pairs, fewer than one batch of 8"),
    ("sft", [_sft(str(i), "1+1=") for i in range(7)] + [_sft("7", "1+1=", "\u00e9")], "line 8 has a character outside"),
])
def test_pairs_the_model_cannot_train_are_refused_before_compute(tmp_path, kind, lines, says):
    """A pair longer than the model's window, a character the codec lacks, or fewer pairs than a
    batch: POSTTRAINING_DATA_INVALID before the stage evaluates or launches anything (the worker
    would fail its first step, and spend its restarts doing so)."""
    from ito_assets.posttraining.pipeline import run_stage
    from ito_assets.runtime.record import events

    step = _bound_lines(tmp_path, lines, kind)
    with pytest.raises(ItoError) as caught:
        run_stage(step, start=seeded(), data_root=tmp_path / "data", out_dir=tmp_path / "out")
    assert caught.value.code is ErrorCode.POSTTRAINING_DATA_INVALID and says in caught.value.message
    kinds = {e.kind.value for e in events.read(tmp_path / "out" / kind)}
    assert not kinds & {"evaluation", "step", "checkpoint"}, kinds  # nothing evaluated or trained


def test_a_pair_at_the_window_trains(tmp_path):
    """bos + prompt + response of exactly max_seq_len positions is the boundary that fits."""
    from ito_assets.posttraining.fixtures import check_pairs
    from ito_assets.posttraining.vocab import CharVocab

    pairs = [InstructionPair(pair_id="a", prompt="9" * 254, response="2")]
    check_pairs(pairs, CharVocab(), max_positions=256, batch_size=1, name="pairs")
    with pytest.raises(ItoError):
        check_pairs(pairs, CharVocab(), max_positions=255, batch_size=1, name="pairs")


def test_dpo_step_refuses_instruction_pairs(tmp_path):
    step, _ = _bound(tmp_path, kind="dpo")  # bound by digest, but the records are not preference pairs
    with pytest.raises(ItoError) as caught:
        read_bound_pairs(step, tmp_path / "data")
    assert caught.value.code is ErrorCode.POSTTRAINING_DATA_INVALID


# --- figures for `ito metrics` ----------------------------------------------------------------


def _outcome(tmp_path: Path) -> StageOutcome:
    from ito_assets.posttraining.checkpoint import save_policy
    from ito_assets.posttraining.evaluation import RewardEval
    from ito_assets.posttraining.eval_gate import BATTERY, judge_rewards

    before = RewardEval(mean_reward=0.25, per_task=(0.25, 0.25, 0.25), per_task_variance=(0.05, 0.05, 0.05),
                        greedy_accuracy=0.3, num_tasks=3, num_samples=8)
    after = RewardEval(mean_reward=0.5, per_task=(0.5, 0.375, 0.625), per_task_variance=(0.05, 0.05, 0.05),
                       greedy_accuracy=0.6, num_tasks=3, num_samples=8)
    policy = seeded().factory()()
    metrics = {"reward_curve": [i / 250 for i in range(250)], "kl_curve": [0.01] * 250, "kl_to_reference": 0.02,
               "train_seconds": 3.5, "num_dropped_all_equal": 4, "num_weight_syncs": 251,
               "staleness": {"max_staleness": 1, "num_admitted": 30, "num_dropped_stale": 2,
                             "admitted_by_staleness": {"0": 10, "1": 20}, "dropped_by_staleness": {"2": 2}}}
    return StageOutcome(stage="rlvr", policy=seeded(),
                        checkpoint=save_policy(policy, tmp_path / "policy.pt", stage="rlvr", policy_version=250),
                        gate=judge_rewards("rlvr", before, after, BATTERY["rlvr"]), eval_before=before,
                        eval_after=after, metrics=metrics, started_from=None, chain_start=None)


def test_stage_metrics_name_curves_histogram_and_kl(tmp_path):
    rows = stage_metrics(_outcome(tmp_path))
    by_name: dict[str, list[tuple[int, float]]] = {}
    for step, name, value in rows:
        by_name.setdefault(name, []).append((step, value))
    reward = by_name["rlvr/reward"]
    assert len(reward) <= MAX_CURVE_POINTS and reward[-1] == (250, pytest.approx(249 / 250))
    assert by_name["rlvr/staleness_admitted/1"] == [(250, 20.0)] and by_name["rlvr/staleness_dropped/2"] == [(250, 2.0)]
    assert by_name["rlvr/heldout_kl_to_reference"] == [(250, 0.02)]
    assert by_name["rlvr/heldout_reward"] == [(250, 0.5)] and by_name["rlvr/heldout_reward_before"] == [(250, 0.25)]
    assert by_name["rlvr/gate_passed"] == [(250, 1.0)]


def test_publishing_twice_adds_nothing(tmp_path):
    from control.gate_world import Clock, make_policy, make_world, verified
    from ito_assets.control import telemetry
    from ito_assets.control.create_run import TrainRequest, create_run
    from ito_assets.control.ledger import open_ledger

    now = int(time.time())
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}", clock=Clock(now))
    try:
        world = make_world(ledger, make_policy(tmp_path), Clock(now))
        booking = world.booking(starts_at=now - 3600, ends_at=now + 3600)
        request = TrainRequest(booking_id=booking, verified=verified(), idempotency_key="publish-0001",
                               confirmation_ref=world.confirm_train(booking, manifest=verified()))
        run_id = create_run(ledger, world.policy, world.account, request).run.run_id
        outcome = _outcome(tmp_path)
        first = publish_outcome(ledger, run_id, outcome)
        assert first == (1, len(stage_metrics(outcome)))
        assert publish_outcome(ledger, run_id, outcome) == (0, 0)
        (listed,) = telemetry.checkpoints(ledger, run_id)
        assert listed.sha256 == outcome.checkpoint.sha256 and listed.step == 250
    finally:
        ledger.dispose()


def test_post_training_runs_the_checkpoint_with_the_positions_it_was_trained_with(tmp_path):
    """A long-context stage may raise the RoPE base or interpolate positions; the rotary tables are
    buffers, not weights, so its checkpoint loaded into the catalogue's model without a word and
    every post-training stage, its evaluations and RLVR's generator ran it with other positions."""
    import dataclasses

    from ito_assets.defs.posttraining.assets import _base_policy
    from ito_assets.manifest.discovery import judge
    from ito_assets.posttraining import on_worker
    from ito_assets.runtime.stage.run import StageCheckpoint
    from ito_assets.training.model_config import config_by_name
    from helpers import valid_manifest, write_manifest

    document = valid_manifest()
    document["training_target"]["stages"][-1].update({"rope_theta": 500_000.0, "position_scale": 4.0})
    path = write_manifest(tmp_path / "long.json", document)
    verdict = judge(str(path), hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12], max_bytes=1 << 20)
    assert verdict.ok, verdict.error_message
    last = document["training_target"]["stages"][-1]["name"]
    final = StageCheckpoint(stage=last, run_dir=str(tmp_path), stage_dir=str(tmp_path), final_checkpoint=str(tmp_path),
                            num_steps=1, metadata_sha256="0" * 64, eval={}, gate={}, num_attempts=1)
    tokens = type("Tokens", (), {"vocab_size": 300, "tokenizer_path": str(tmp_path / "t.json"), "tokenizer_sha256": "0" * 64})
    spec = _base_policy(verdict, final, tokens, type("Resource", (), {"seed": 0})())
    assert (spec.rope_theta, spec.position_scale) == (500_000.0, 4.0)
    model = spec.factory()()
    assert (model.config.rope_theta, model.config.rope_position_scale) == (500_000.0, 4.0)
    catalogue = config_by_name(spec.model_name, vocab_size=300)
    assert model.config == dataclasses.replace(catalogue, rope_theta=500_000.0, rope_position_scale=4.0)
    stage = on_worker._Stage(name="sft", spec=spec, learning_rate=1e-4, batch_size=2, seed=0, num_steps=1, init_from=None)
    launch = on_worker.WorkerLaunch(run=lambda command: None, run_key="positions-test")
    config = on_worker._config(stage, None, stage_dir=tmp_path / "sft", launch=launch, data_path=tmp_path / "x",
                               sequence_length=16)
    assert (config.rope_theta, config.position_scale) == (500_000.0, 4.0)
    assert config.model_config().rope_theta == 500_000.0
    # A manifest whose stages set none runs the model's own.
    assert dataclasses.replace(spec, rope_theta=None, position_scale=None).factory()().config == catalogue
