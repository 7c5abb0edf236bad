"""DPO's pair rows on the stage worker: each pair is one row of two sequences (chosen, rejected)
that the loader draws whole and that micro-batches and ranks never split; the reference's
log-probabilities are read beside the rows; and a step takes the whole batch's DPO loss however
micro-batches and ranks split the pairs. The answers are lines of a package's own documentation
(SQLAlchemy's description, shipped in its wheel), so that they have every length."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.posttraining.dpo import dpo_rows, reference_logprobs
from ito_assets.posttraining.fixtures import PreferencePair
from ito_assets.posttraining.losses import pair_loss
from ito_assets.posttraining.vocab import PRINTABLE, CharVocab
from ito_assets.runtime.record import events
from ito_assets.runtime.record.events import EventKind
from ito_assets.runtime.stage.config import PreferenceObjective, WorkerConfig
from ito_assets.runtime.worker import batches, execution
from ito_assets.runtime.worker.batches import IGNORE, BatchPlan, ResumableBatches
from ito_assets.runtime.worker.preference import Preference, read_reference
from ito_assets.runtime.worker.step import train_step
from ito_assets.training.layout import Layout
from ito_assets.training.model import build_model, config_by_name
from ito_assets.training.trainer import TrainConfig, build_optimizer
from runtime_helpers import assert_trained_as_one_rank, final_weights, finish, run_worker, start_worker, worker_config

CODEC = CharVocab()


def _documentation_pairs() -> list[PreferencePair]:
    """Each prose line of SQLAlchemy's description: its first word the prompt, the rest the chosen
    answer, the next line's rest the rejected one."""
    meta = importlib.metadata.metadata("sqlalchemy")
    text = meta.get_payload() or meta["Description"]  # importlib_metadata, once imported, moves the body there
    lines = [line.strip() for line in text.splitlines()]
    kept = [line for line in lines if 12 <= len(line) <= 90 and " " in line and set(line) <= set(PRINTABLE)]
    split = [line.partition(" ") for line in kept]
    return [PreferencePair(pair_id=f"doc/{i}", prompt=head + " ", chosen=tail, rejected=split[(i + 1) % len(split)][2])
            for i, (head, _, tail) in enumerate(split)]


PAIRS = _documentation_pairs()
ROWS = dpo_rows(CODEC, PAIRS)
LENGTH = ROWS.shape[-1]


def test_pair_rows_hold_the_chosen_then_the_rejected_answer_each_with_its_own_targets():
    assert len(PAIRS) >= 32 and ROWS.shape == (len(PAIRS), 2, 2, LENGTH) and ROWS.dtype == np.int32
    for index in (0, 7):
        pair = PAIRS[index]
        for side, answer in enumerate((pair.chosen, pair.rejected)):
            targets = ROWS[index, side, 1]
            assert CODEC.decode([int(t) for t in targets[targets != IGNORE]][:-1]) == answer
            assert int(targets[targets != IGNORE][-1]) == CODEC.eos_id
    lengths = sorted(int((ROWS[:, 0, 1] != IGNORE).sum(axis=1)[i]) for i in range(len(PAIRS)))
    assert lengths[-1] >= 3 * lengths[0]  # answers of many lengths
    # The longest answer's last target is the rows' last position: T is no wider than it needs.
    assert (ROWS[:, :, 1, -1] != IGNORE).any()


def test_the_loader_draws_pairs_whole_and_rows_at_names_them():
    plan = BatchPlan(batch_size=8, sequence_length=LENGTH, seed=3, rank=1, world_size=2)
    loader = ResumableBatches(ROWS, plan)
    for _ in range(3):
        position, x, y = loader.next_batch()
        rows = loader.rows_at(position)
        # Both answers of each pair, cut together after the last target either of them has.
        end = batches.cut_length(ROWS[rows])
        assert x.shape == y.shape == (4, 2, end) and len(rows) == 4
        assert (ROWS[rows, :, 1, end:] == IGNORE).all() and (ROWS[rows, :, 1, end - 1] != IGNORE).any()
        assert torch.equal(x, torch.from_numpy(ROWS[rows, :, 0, :end]).long())
        assert torch.equal(y, torch.from_numpy(ROWS[rows, :, 1, :end]).long())
    whole = ResumableBatches(ROWS, BatchPlan(batch_size=8, sequence_length=LENGTH, seed=3))
    assert list(whole.rows_at(2)[4:]) == list(loader.rows_at(2))  # rank 1 takes the second half
    # Throughput counts both answers of every pair up to its last target.
    chosen = np.sort(whole.rows_at(0))
    last = lambda targets: int(LENGTH - np.argmax((targets != IGNORE)[::-1]))
    assert whole.tokens_at(0) == sum(last(ROWS[r, s, 1]) for r in chosen for s in (0, 1))


def test_a_pair_with_an_answer_without_targets_is_refused():
    for side in (0, 1):
        rows = ROWS.copy()
        rows[5, side, 1] = IGNORE
        with pytest.raises(ValueError, match="every row must have at least one target"):
            ResumableBatches(rows, BatchPlan(batch_size=8, sequence_length=LENGTH, seed=0))
    with pytest.raises(ValueError, match=r"\(N, S, 2, T\) with T = 12"):
        ResumableBatches(ROWS, BatchPlan(batch_size=8, sequence_length=12, seed=0))


def test_the_reference_is_refused_unless_one_finite_log_probability_per_answer(tmp_path):
    path = tmp_path / "reference.npy"
    good = np.full((len(PAIRS), 2), -3.0, dtype=np.float32)
    good[0, 0] = 0.0  # a certain answer: log 1, at the bound
    np.save(path, good)
    assert read_reference(path, len(PAIRS)).shape == (len(PAIRS), 2)
    for bad, message in ((good[:-1], "shape"), (good[:, :1], "shape"), (np.where(good == 0.0, 1e-3, good), "at most 0"),
                         (np.where(good == 0.0, np.nan, good), "finite"), (np.where(good == 0.0, -np.inf, good), "finite")):
        np.save(path, bad)
        with pytest.raises(ItoError, match=message) as refused:
            read_reference(path, len(PAIRS))
        assert refused.value.code is ErrorCode.POSTTRAINING_DATA_INVALID


@pytest.mark.parametrize("world_size", [2, 3])
def test_each_rank_computes_its_share_of_the_reference_and_the_shares_sum_to_the_whole(monkeypatch, world_size):
    from ito_assets.posttraining import reference_pass

    model = _model()
    whole = reference_logprobs(model, ROWS)
    # Passes of 5 pairs.
    monkeypatch.setattr(reference_pass, "LOGITS_BUDGET_BYTES", 5 * 2 * LENGTH * CODEC.vocab_size * 4)
    passes = [[] for _ in range(world_size)]
    shares = [reference_logprobs(model, ROWS, rank=rank, world_size=world_size,
                                 on_pass=lambda r=rank: passes[r].append(1)) for rank in range(world_size)]
    # A call after each of the rank's passes: the worker's heartbeat, so a long pass is no hung start-up.
    assert [len(p) for p in passes] == [len(range(5 * r, len(ROWS), 5 * world_size)) for r in range(world_size)]
    for rank, share in enumerate(shares):
        mine = np.zeros(len(ROWS), dtype=bool)
        for first in range(5 * rank, len(ROWS), 5 * world_size):
            mine[first : first + 5] = True
        assert (share[~mine] == 0).all() and (share[mine] < 0).all()
    np.testing.assert_allclose(np.sum(shares, axis=0), whole, atol=1e-5, rtol=0)
    idle = reference_logprobs(model, ROWS[:5], rank=1, world_size=2)  # one pass, rank 0's: rank 1 has none
    assert idle.shape == (5, 2) and (idle == 0).all()


@pytest.mark.parametrize("changes, message", [
    ({"beta": 0.0}, "beta"), ({"beta": float("nan")}, "beta"), ({"label_smoothing": 0.5}, "label_smoothing"),
    ({"label_smoothing": -1e-9}, "label_smoothing"), ({"rpo_alpha": -1e-9}, "rpo_alpha"),
    ({"rpo_alpha": float("inf")}, "rpo_alpha"), ({"reference_path": "reference.npy"}, "absolute")])
def test_the_objectives_settings_are_checked_before_torch_starts(changes, message):
    settings = dict(reference_path="/tmp/reference.npy", beta=0.1) | changes
    with pytest.raises(ValueError, match=message):
        PreferenceObjective(**settings)
    accepted = PreferenceObjective(reference_path="/tmp/r.npy", beta=1e-9, label_smoothing=0.4999, rpo_alpha=0.0)
    assert accepted.label_smoothing < 0.5


CONFIG = TrainConfig(num_steps=4, batch_size=8, sequence_length=LENGTH, learning_rate=1e-3)
OBJECTIVE = PreferenceObjective(reference_path="/tmp/unused.npy", beta=0.5, label_smoothing=0.1, rpo_alpha=1.0)


def _model():
    return build_model(config_by_name("micro", vocab_size=CODEC.vocab_size), seed=0)


def _reference() -> torch.Tensor:
    """Another model's log-probabilities: the margins are not all zero at the first step."""
    return torch.from_numpy(reference_logprobs(build_model(config_by_name("micro", vocab_size=CODEC.vocab_size),
                                                           seed=1), ROWS))


def _step(micro: int) -> tuple[float, dict[str, torch.Tensor], dict[str, float]]:
    model = _model()
    objective = Preference(model, OBJECTIVE)
    run = execution.prepare(model, Layout(precision="fp32", compile=False, micro_batch_size=micro), (),
                            device=torch.device("cpu"), world_size=1, objective=objective)
    loader = ResumableBatches(ROWS, BatchPlan(batch_size=8, sequence_length=LENGTH, seed=0))
    position, x, y = loader.next_batch()
    grads = {}
    loss, _, _, _ = train_step(run, model, build_optimizer(model, CONFIG), x, y, 1, CONFIG,
                               before_update=lambda: grads.update({n: p.grad.clone() for n, p in model.named_parameters()}),
                               beside=_reference()[torch.from_numpy(loader.rows_at(position))])
    return loss, grads, objective.take_metrics(torch.device("cpu"))


def test_a_step_takes_the_whole_batchs_loss_however_micro_batches_split_the_pairs():
    whole_loss, whole, whole_metrics = _step(8)
    split_loss, split, split_metrics = _step(2)
    assert split_loss == pytest.approx(whole_loss, abs=1e-6)
    for name in whole:
        torch.testing.assert_close(split[name], whole[name], atol=1e-6, rtol=1e-4, msg=name)
    assert split_metrics == pytest.approx(whole_metrics, abs=1e-6)
    # By hand: the batch's loss from its rows in one piece, and the share of positive margins.
    loader = ResumableBatches(ROWS, BatchPlan(batch_size=8, sequence_length=LENGTH, seed=0))
    position, x, y = loader.next_batch()
    with torch.no_grad():
        expected = pair_loss(_model(), x, y, _reference()[torch.from_numpy(loader.rows_at(position))], beta=0.5,
                             label_smoothing=0.1, rpo_alpha=1.0)
    assert whole_loss == pytest.approx(float(expected.loss), abs=1e-6)
    assert whole_metrics["accuracy"] == pytest.approx(expected.accuracy)
    assert whole_metrics["margin"] == pytest.approx(float(expected.margins.mean()), abs=1e-6)
    assert 0 < whole_metrics["accuracy"] < 1  # another model's reference: margins of both signs


def test_the_counts_start_again_after_every_step():
    objective = Preference(_model(), OBJECTIVE)
    assert objective.take_metrics(torch.device("cpu")) == {}  # no pair seen: nothing to report
    _, x, y = ResumableBatches(ROWS, BatchPlan(batch_size=8, sequence_length=LENGTH, seed=0)).next_batch()
    objective(x, y, _reference()[:8])
    assert objective.take_metrics(torch.device("cpu")).keys() == {"accuracy", "margin"}
    assert objective.take_metrics(torch.device("cpu")) == {}


def _pair_rows(tmp_path: Path) -> tuple[dict, WorkerConfig]:
    """The pairs as a shard with their reference log-probabilities, the settings every layout
    shares, and the reference run: one rank, the whole batch as one micro-batch, 8 steps."""
    folder = tmp_path / "rows"
    folder.mkdir()
    np.save(folder / "train.npy", ROWS)
    np.save(folder / "reference.npy", _reference().numpy())
    objective = PreferenceObjective(reference_path=str(folder / "reference.npy"), beta=0.5, label_smoothing=0.1,
                                    rpo_alpha=1.0)
    settings = dict(model="micro", vocab_size=CODEC.vocab_size, stage="dpo", num_steps=8, interval_steps=4,
                    batch_size=8, sequence_length=LENGTH, heldout_path=None, learning_rate=1e-2, preference=objective,
                    tokens=(folder / "train.npy", None))
    one = worker_config(tmp_path / "one", layout=Layout(precision="fp32", compile=False, micro_batch_size=8),
                        **settings)
    return settings, one


def _same_run(one: WorkerConfig, other: WorkerConfig) -> None:
    """`other` took one rank's losses and accuracies and ended at its weights."""
    assert_trained_as_one_rank(one, other)
    assert _accuracies(Path(other.stage_dir)) == pytest.approx(_accuracies(Path(one.stage_dir)), abs=1e-6)


@pytest.mark.slow
@pytest.mark.long  # `make test`: rows on two ranks through the stage (tests/posttraining/test_worker_sft.py)
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_the_worker_trains_pairs_alike_on_one_rank_and_on_two_by_ddp_with_a_resume(tmp_path):
    """Two ranks, each its pairs as two micro-batches, stopped at step 4 and resumed, against one
    rank straight: the same losses, accuracies and weights. (FSDP2: `make test-long`, below.)"""
    settings, one = _pair_rows(tmp_path)
    two = worker_config(tmp_path / "two", stop_after_step=4, **settings,
                        layout=Layout(dp_replicate=2, precision="fp32", compile=False, micro_batch_size=2))
    running = start_worker(one, nproc=1)
    stopped = run_worker(two, nproc=2)
    done = finish(running)
    assert done.returncode == 0, done.stderr[-3000:]
    assert stopped.returncode != 0, stopped.stderr[-3000:]
    resumed = run_worker(WorkerConfig(**{**json.loads(two.to_json()), "attempt": 1, "stop_after_step": None}), nproc=2)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    reference = final_weights(Path(one.stage_dir), 8)
    untrained = _model().state_dict()
    assert max(float((reference[f"model.{k}"] - v).abs().max()) for k, v in untrained.items()
               if f"model.{k}" in reference) > 1e-2  # it trained
    _same_run(one, two)


@pytest.mark.long  # with DDP above; FSDP2 shards the weights, not the pairs
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_fsdp2_trains_pairs_as_one_rank_does(tmp_path):
    settings, one = _pair_rows(tmp_path)
    sharded = worker_config(tmp_path / "fsdp", **settings,
                            layout=Layout(dp_shard=2, precision="fp32", compile=False, micro_batch_size=2))
    for done in map(finish, [start_worker(one, nproc=1), start_worker(sharded, nproc=2)]):
        assert done.returncode == 0, done.stderr[-3000:]
    _same_run(one, sharded)


@pytest.mark.long  # `make test`: one rank computes it (tests/posttraining/test_worker_dpo.py)
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_two_ranks_compute_the_reference_the_stage_was_not_given_and_rank_0_writes_it(tmp_path):
    settings, _ = _pair_rows(tmp_path)
    given = Path(settings["preference"].reference_path)
    absent = tmp_path / "computed" / "reference.npy"
    settings["preference"] = PreferenceObjective(reference_path=str(absent), beta=0.5, label_smoothing=0.1,
                                                 rpo_alpha=1.0)
    two = worker_config(tmp_path / "two", **settings,
                        layout=Layout(dp_replicate=2, precision="fp32", compile=False, micro_batch_size=2))
    absent.parent.mkdir()
    done = run_worker(two, nproc=2)
    assert done.returncode == 0, done.stderr[-3000:]
    # From the seed's weights (no `init_from`): the seed model's values, not the file the others were given.
    np.testing.assert_allclose(np.load(absent), reference_logprobs(_model(), ROWS), atol=1e-5, rtol=0)
    assert not np.allclose(np.load(absent), np.load(given), atol=1e-3)


def _accuracies(stage_dir: Path) -> dict[int, float]:
    return {e.step: e.metrics["accuracy"] for e in events.read(stage_dir) if e.kind is EventKind.STEP}
