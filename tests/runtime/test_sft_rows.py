"""Supervised fine-tuning's rows on the stage worker: instruction pairs become rows whose targets
are -100 except on the response and its eos; the loader resumes rows as it resumes windows; and a
step weighs every target of the global batch once, however micro-batches and ranks split the rows.
The pairs are lines of a package's own documentation (SQLAlchemy's description, shipped in its
wheel), so that responses have every length."""

from __future__ import annotations

import importlib.metadata
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from ito_assets.posttraining.fixtures import InstructionPair
from ito_assets.posttraining.losses import sft_loss
from ito_assets.posttraining.policy import token_logprobs
from ito_assets.posttraining.sft import response_batch, sft_rows
from ito_assets.posttraining.vocab import PRINTABLE, CharVocab
from ito_assets.posttraining.optim import WORKER_RECIPE
from ito_assets.runtime.record import events
from ito_assets.runtime.stage.config import RESULT_NAME, WorkerConfig
from ito_assets.runtime.worker import batches, execution
from ito_assets.runtime.worker.batches import IGNORE, BatchPlan, ResumableBatches
from ito_assets.runtime.worker.step import target_divisors, train_step
from ito_assets.training.layout import Layout
from ito_assets.training.model import build_model, config_by_name
from ito_assets.training.trainer import TrainConfig, build_optimizer
from runtime_helpers import assert_trained_as_one_rank, drive_in_turn, finish, run_worker, start_worker, step_losses, worker_config

CODEC = CharVocab()
LENGTH = 96  # positions per row: the longest documentation line kept below needs at most this


def _documentation_pairs() -> list[InstructionPair]:
    """Each prose line of SQLAlchemy's description: its first word is the prompt, the rest the response."""
    meta = importlib.metadata.metadata("sqlalchemy")
    text = meta.get_payload() or meta["Description"]  # importlib_metadata, once imported, moves the body there
    lines = [line.strip() for line in text.splitlines()]
    kept = [line for line in lines if 12 <= len(line) <= LENGTH - 3 and " " in line and set(line) <= set(PRINTABLE)]
    pairs = []
    for index, line in enumerate(kept):
        head, _, tail = line.partition(" ")
        pairs.append(InstructionPair(pair_id=f"doc/{index}", prompt=head + " ", response=tail))
    return pairs


PAIRS = _documentation_pairs()


def test_the_documentation_gives_responses_of_many_lengths():
    lengths = sorted(len(pair.response) for pair in PAIRS)
    assert len(PAIRS) >= 32 and lengths[-1] >= 4 * lengths[0]


def test_rows_take_the_loss_of_the_response_and_its_eos_only():
    rows = sft_rows(CODEC, PAIRS, LENGTH)
    assert rows.shape == (len(PAIRS), 2, LENGTH) and rows.dtype == np.int32
    tokens, mask = response_batch(CODEC, [p.prompt for p in PAIRS], [p.response for p in PAIRS])
    assert int((rows[:, 1] != IGNORE).sum()) == int(mask.sum())
    for row, pair in zip(rows, PAIRS):
        targets = row[1][row[1] != IGNORE].tolist()
        assert targets == CODEC.encode(pair.response) + [CODEC.eos_id]
    model = build_model(config_by_name("micro", vocab_size=CODEC.vocab_size), seed=0)
    with torch.no_grad():
        expected = sft_loss(token_logprobs(model, tokens), mask)
        got = model.loss(torch.from_numpy(rows[:, 0]).long(), torch.from_numpy(rows[:, 1]).long())
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_a_pair_fits_at_exactly_its_length_and_is_refused_one_below():
    pair = InstructionPair(pair_id="p", prompt="ab", response="cd")  # bos a b c d eos: 5 positions
    a, b, c, d = CODEC.encode("abcd")
    exact = sft_rows(CODEC, [pair], 5)[0]
    assert exact[0].tolist() == [CODEC.bos_id, a, b, c, d]
    assert exact[1].tolist() == [IGNORE, IGNORE, c, d, CODEC.eos_id]
    padded = sft_rows(CODEC, [pair], 6)[0]
    assert padded[0].tolist() == [CODEC.bos_id, a, b, c, d, CODEC.pad_id]
    assert padded[1].tolist() == [IGNORE, IGNORE, c, d, CODEC.eos_id, IGNORE]
    with pytest.raises(ValueError, match="pair 0 needs 5 positions; the rows have 4"):
        sft_rows(CODEC, [pair], 4)


def _rows(count: int = 32) -> np.ndarray:
    return sft_rows(CODEC, PAIRS[:count], LENGTH)


def test_rows_are_visited_once_an_epoch_and_resume_at_their_position():
    rows = _rows()
    plan = BatchPlan(batch_size=8, sequence_length=LENGTH, seed=3)
    straight = ResumableBatches(rows, plan)
    assert straight.has_rows and straight.batches_per_epoch == 4
    batches = [straight.next_batch() for _ in range(6)]
    assert sorted(np.concatenate([straight.rows_at(p) for p in range(4)]).tolist()) == list(range(len(rows)))
    for position, x, y in batches:
        assert_cut_rows(rows[straight.rows_at(position)], x, y)
    resumed = ResumableBatches(rows, plan, position=5)
    position, x, y = resumed.next_batch()
    assert position == 5 and torch.equal(x, batches[5][1]) and torch.equal(y, batches[5][2])
    # Two data-parallel ranks take the two halves of the one-rank batch, each cut to its own rows.
    for r in (0, 1):
        half = ResumableBatches(rows, BatchPlan(batch_size=8, sequence_length=LENGTH, seed=3, rank=r, world_size=2))
        _, x, y = half.next_batch()
        assert torch.equal(x, batches[0][1][4 * r : 4 * r + 4, : x.shape[1]])
        assert_cut_rows(rows[straight.rows_at(0)[4 * r : 4 * r + 4]], x, y)


def assert_cut_rows(chosen: np.ndarray, x: torch.Tensor, y: torch.Tensor, multiple: int = 1) -> None:
    """`x`, `y` are the chosen rows' inputs and targets up to the last position where one of them
    has a target (rounded up to `multiple`): nothing after it takes a loss, and nothing before is lost."""
    end = x.shape[1]
    assert y.shape[1] == end and (end % multiple == 0 or end == chosen.shape[-1])
    assert torch.equal(x, torch.from_numpy(chosen[:, 0, :end].astype(np.int64)))
    assert torch.equal(y, torch.from_numpy(chosen[:, 1, :end].astype(np.int64)))
    assert (chosen[:, 1, end:] == IGNORE).all()
    last = int((chosen[:, 1] != IGNORE).any(axis=0).nonzero()[0].max())
    assert end - multiple <= last < end


@pytest.mark.parametrize(("last", "multiple", "kept"), [
    (0, 1, 1), (9, 1, 10), (15, 1, 16), (9, 2, 10), (10, 2, 12), (10, 4, 12), (13, 4, 16), (14, 4, 16), (15, 8, 16),
])
def test_a_batch_keeps_the_positions_up_to_its_last_target_rounded_up_never_past_its_length(last, multiple, kept):
    rows = np.full((3, 2, 16), IGNORE, dtype=np.int32)
    rows[:, 0] = 7
    rows[0, 1, 0] = 1  # every row has a target; the batch's last is at `last`
    rows[1, 1, 0] = 1
    rows[2, 1, last] = 1
    assert batches.cut_length(rows, multiple) == kept
    dpo = np.stack([rows, rows[::-1]], axis=1)  # (N, S, 2, T): the pair's answers cut together
    assert batches.cut_length(dpo, multiple) == kept


def test_a_cut_batch_trains_as_its_padded_rows_do():
    """The cut is exact under a causal model: the loss and every gradient of a batch cut after
    its last target equal the padded batch's (fp32, up to the order of the sums)."""
    rows = _rows()
    chosen = torch.from_numpy(rows[:8].astype(np.int64))
    end = batches.cut_length(rows[:8])
    assert end < LENGTH  # the test's rows do end before the stage's length
    figures = []
    for x, y in ((chosen[:, 0], chosen[:, 1]), (chosen[:, 0, :end], chosen[:, 1, :end])):
        model = build_model(config_by_name("micro", vocab_size=CODEC.vocab_size), seed=0)
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=IGNORE)
        loss.backward()
        figures.append((float(loss), [p.grad.clone() for p in model.parameters()]))
    (padded, padded_grads), (cut, cut_grads) = figures
    assert abs(padded - cut) <= 1e-6
    assert max(float((a - b).abs().max()) for a, b in zip(padded_grads, cut_grads)) <= 1e-6


def test_a_batch_counts_each_rows_tokens_up_to_its_last_target_on_every_rank():
    rows = _rows()
    plan = BatchPlan(batch_size=8, sequence_length=LENGTH, seed=3)
    loader = ResumableBatches(rows, plan)
    for _ in range(6):  # into the second epoch
        position, x, y = loader.next_batch()
        # By the text: bos, then the prompt and response's characters (the eos is a target, never an
        # input, and the codec drops the padding).
        expected = sum(1 + len(CODEC.decode(row)) for row in x.tolist())
        assert loader.tokens_at(position) == expected < 8 * LENGTH  # the padding is not counted
        ranks = [ResumableBatches(rows, BatchPlan(batch_size=8, sequence_length=LENGTH, seed=3, rank=r, world_size=2))
                 for r in (0, 1)]
        assert [r.tokens_at(position) for r in ranks] == [expected, expected]  # the global batch's, on every rank
    # A row whose last target is its last position counts it whole; one whose only target is its first, one.
    full, first = np.full((2, LENGTH), 5, dtype=np.int32), np.full((2, LENGTH), IGNORE, dtype=np.int32)
    first[1, 0] = 5
    edge = ResumableBatches(np.stack([full, first]), BatchPlan(batch_size=2, sequence_length=LENGTH, seed=0))
    assert edge.tokens_at(0) == LENGTH + 1
    windows = ResumableBatches(np.arange(8 * 33 + 1, dtype=np.int32), BatchPlan(batch_size=4, sequence_length=32, seed=0))
    assert windows.tokens_at(1) == 4 * 32


def test_rows_of_another_length_or_without_a_target_are_refused():
    rows = _rows()
    with pytest.raises(ValueError, match=r"rows must have shape \(N, 2, T\) with T = 64"):
        ResumableBatches(rows, BatchPlan(batch_size=8, sequence_length=64, seed=0))
    with pytest.raises(ValueError, match="not 2-D"):
        ResumableBatches(rows[:, 0], BatchPlan(batch_size=8, sequence_length=LENGTH, seed=0))
    rows[7, 1] = IGNORE
    with pytest.raises(ValueError, match="every row must have at least one target"):
        ResumableBatches(rows, BatchPlan(batch_size=8, sequence_length=LENGTH, seed=0))


def test_the_rows_check_reads_in_chunks_and_finds_a_bad_row_in_any_of_them(monkeypatch):
    monkeypatch.setattr(batches, "_CHECK_ROWS", 5)  # 32 rows: chunks of 5, the last of 2
    for bad in (0, 4, 5, 31):
        rows = _rows()
        rows[bad, 1] = IGNORE
        with pytest.raises(ValueError, match="every row must have at least one target"):
            ResumableBatches(rows, BatchPlan(batch_size=8, sequence_length=LENGTH, seed=0))
    assert ResumableBatches(_rows(), BatchPlan(batch_size=8, sequence_length=LENGTH, seed=0)).has_rows


CONFIG = TrainConfig(num_steps=4, batch_size=8, sequence_length=LENGTH, learning_rate=1e-3)


def _step(micro: int, *, count_targets: bool) -> tuple[float, dict[str, torch.Tensor]]:
    model = build_model(config_by_name("micro", vocab_size=CODEC.vocab_size), seed=0)
    run = execution.prepare(model, Layout(precision="fp32", compile=False, micro_batch_size=micro), (),
                            device=torch.device("cpu"), world_size=1)
    grads = {}
    _, x, y = ResumableBatches(_rows(), BatchPlan(batch_size=8, sequence_length=LENGTH, seed=0)).next_batch()
    loss, _, _, _ = train_step(run, model, build_optimizer(model, CONFIG), x, y, 1, CONFIG,
                               before_update=lambda: grads.update({n: p.grad.clone() for n, p in model.named_parameters()}),
                               count_targets=count_targets)
    return loss, grads


def test_a_step_weighs_every_target_of_the_batch_once_however_micro_batches_split_it():
    whole_loss, whole = _step(8, count_targets=True)
    split_loss, split = _step(1, count_targets=True)
    assert split_loss == pytest.approx(whole_loss, abs=1e-6)
    for name in whole:
        torch.testing.assert_close(split[name], whole[name], atol=1e-6, rtol=1e-4, msg=name)
    # Without the weighting each row would count alike, a short response as much as a long one: the
    # gradient moves by 12% of its norm (measured), at an untrained model's near-uniform loss.
    _, rows_alike = _step(1, count_targets=False)
    assert _norm({n: rows_alike[n] - whole[n] for n in whole}) > 0.05 * _norm(whole)


def _norm(grads: dict[str, torch.Tensor]) -> float:
    return float(torch.stack([g.norm() for g in grads.values()]).norm())


def test_the_divisors_are_the_micro_batch_count_for_equal_targets():
    full = torch.zeros(2, 4, dtype=torch.long)
    assert target_divisors([full, full, full]) == [3.0, 3.0, 3.0]
    short = torch.full((2, 4), IGNORE)
    short[0, 0] = 1
    assert target_divisors([full, short]) == [9 / 8, 9.0]
    # No raise on one rank while the others wait in the all-reduce: the empty micro-batch's NaN loss
    # makes the step non-finite, and every rank drops it.
    assert target_divisors([full, torch.full((2, 4), IGNORE)]) == [1.0, 8.0]


def _one_rank_straight(tmp_path: Path) -> tuple[tuple[Path, None], dict, WorkerConfig]:
    """The documentation's rows as a shard, the settings every layout of the rows tests shares, and
    the reference: one rank, the whole batch as one micro-batch, 12 steps."""
    folder = tmp_path / "rows"
    folder.mkdir()
    np.save(folder / "train.npy", _rows(len(PAIRS)))
    tokens = (folder / "train.npy", None)
    settings = dict(model="micro", vocab_size=CODEC.vocab_size, stage="sft", num_steps=12, interval_steps=6,
                    batch_size=8, sequence_length=LENGTH, heldout_path=None, learning_rate=1e-2)
    one = worker_config(tmp_path / "one", tokens, layout=Layout(precision="fp32", compile=False, micro_batch_size=8),
                        **settings)
    return tokens, settings, one


@pytest.mark.parametrize("resumed", [False, pytest.param(True, marks=pytest.mark.long)])
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_the_worker_trains_rows_alike_on_one_rank_and_on_two_by_ddp_and_tp(tmp_path, resumed):
    """Two ranks, each its rows as two micro-batches, and two tensor-parallel ranks, against one
    rank straight: the same losses and weights, so each target of the global batch counted once.
    `make test-long` also stops the two ranks at step 6 and resumes them (a resume of rows on one
    rank: tests/posttraining/test_worker_sft.py). (FSDP2 and HSDP: `make test-long`, below.)"""
    tokens, settings, one = _one_rank_straight(tmp_path)
    two = worker_config(tmp_path / "two", tokens, stop_after_step=6 if resumed else None, **settings,
                        layout=Layout(dp_replicate=2, precision="fp32", compile=False, micro_batch_size=2))
    # Tensor-parallel peers hold the same rows: they count each target once per peer, and the ranks too.
    sliced = worker_config(tmp_path / "tp", tokens, **settings,
                           layout=Layout(tp=2, precision="fp32", compile=False, micro_batch_size=4))
    # The two-rank layouts in turn in one launch (start-up dominates on CPU), beside the one rank.
    running = [start_worker(one, nproc=1), drive_in_turn(tmp_path / "two-ranks", [sliced, two], nproc=2)]
    for done in map(finish, running):
        assert done.returncode == 0, done.stderr[-3000:]
    if resumed:
        assert max(step_losses(Path(two.stage_dir))) == 6
        again = run_worker(worker_config(tmp_path / "two", tokens, attempt=1, **settings, layout=two.layout), nproc=2)
        assert again.returncode == 0, again.stderr[-3000:]
    expected = step_losses(Path(one.stage_dir))
    assert expected[12] < expected[1]  # it learned the documentation's responses
    for other in (two, sliced):
        assert_trained_as_one_rank(one, other)
    # Throughput counts each row up to its last target, the global batch's on one rank and on two.
    loader = ResumableBatches(_rows(len(PAIRS)), BatchPlan(batch_size=8, sequence_length=LENGTH, seed=one.seed))
    for config in (one, sliced):
        assert _tokens_trained(config, steps=(10, 12)) == pytest.approx([loader.tokens_at(9), loader.tokens_at(11)])
    assert loader.tokens_at(11) < 8 * LENGTH


@pytest.mark.long  # `make test` runs DDP and TP above; FSDP2's rows are weighed as DDP's are
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_fsdp2_trains_rows_as_one_rank_does(tmp_path):
    """FSDP2 shards the weights, not the rows: each rank weighs its own rows' targets as DDP's do."""
    tokens, settings, one = _one_rank_straight(tmp_path)
    sharded = worker_config(tmp_path / "fsdp", tokens, **settings,
                            layout=Layout(dp_shard=2, precision="fp32", compile=False, micro_batch_size=2))
    for done in map(finish, [start_worker(one, nproc=1), start_worker(sharded, nproc=2)]):
        assert done.returncode == 0, done.stderr[-3000:]
    assert_trained_as_one_rank(one, sharded)


@pytest.mark.long  # four ranks on CI's two cores: `make test-long`
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_hsdp_trains_rows_as_one_rank_does(tmp_path):
    """FSDP2 inside DDP (two replicas of two shards), each rank two rows: each target of the global
    batch is counted once across replicas and shards, as on one rank."""
    tokens, settings, one = _one_rank_straight(tmp_path)
    hybrid = worker_config(tmp_path / "hsdp", tokens, **settings,
                           layout=Layout(dp_replicate=2, dp_shard=2, precision="fp32", compile=False,
                                         micro_batch_size=1))
    running = [start_worker(one, nproc=1), start_worker(hybrid, nproc=4)]
    for done in map(finish, running):
        assert done.returncode == 0, done.stderr[-3000:]
    ran = json.loads((Path(hybrid.stage_dir) / RESULT_NAME).read_text())["layout"]
    assert ran["ran"] == hybrid.layout.describe() and ran["fallbacks"] == []
    assert_trained_as_one_rank(one, hybrid)
    loader = ResumableBatches(_rows(len(PAIRS)), BatchPlan(batch_size=8, sequence_length=LENGTH, seed=one.seed))
    assert _tokens_trained(hybrid, steps=(12,)) == pytest.approx([loader.tokens_at(11)])


def _tokens_trained(config: WorkerConfig, *, steps: tuple[int, ...]) -> list[float]:
    """tokens_per_second x the step's seconds, at each logged step of `steps`."""
    lines = [json.loads(line) for line in Path(config.metrics_path).read_text().splitlines()]
    rates = {m["step"]: m["tokens_per_second"] for m in lines if "tokens_per_second" in m}
    seconds = {e.step: e.seconds for e in events.read(Path(config.stage_dir)) if e.kind is events.EventKind.STEP}
    return [rates[step] * seconds[step] for step in steps]


@pytest.mark.parametrize("optimizer, message", [
    ({"momentum": 0.9}, "must be among"),
    ({"beta2": math.nan}, "finite numbers"),
    ({"weight_decay": True}, "finite numbers"),
    ({"grad_clip": "1.0"}, "finite numbers"),
])
def test_the_worker_config_refuses_an_unknown_or_non_numeric_optimizer_setting(tmp_path, optimizer, message):
    tokens = (tmp_path / "train.npy", None)
    with pytest.raises(ValueError, match=message):
        worker_config(tmp_path, tokens, optimizer=optimizer)
    assert worker_config(tmp_path, tokens, optimizer={"beta2": 0.999}).optimizer == {"beta2": 0.999}
    assert WorkerConfig.from_json(worker_config(tmp_path, tokens, optimizer=dict(WORKER_RECIPE)).to_json()).optimizer == WORKER_RECIPE
