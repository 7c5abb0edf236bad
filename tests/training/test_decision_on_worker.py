"""The decision's arms trained through the stage worker (under the supervisor, the
layout fitted to this host), as the curriculum's stages are: the weights the decision scores are
the worker's final checkpoint, the losses its event log's, and an arm that cannot finish stops
the decision with DECISION_ARM_FAILED instead of a verdict drawn from the others."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.evals.suite import load_suite
from ito_assets.runtime.record import events
from ito_assets.runtime.record.events import EventKind
from ito_assets.runtime.stage.fitting import fit_layout
from ito_assets.runtime.stage.proxy_arm import ArmLaunch
from ito_assets.runtime.supervision.supervisor import SupervisorConfig
from ito_assets.training.decision import run_decision
from ito_assets.training.decision_config import DecisionConfig
from ito_assets.training.eval_config import EvalConfig
from ito_assets.training.layout import Layout
from ito_assets.training.tokenizer import TokenizerConfig
from ito_assets.training.verdict import Verdict

FIXTURES = Path(__file__).resolve().parents[2] / "data" / "fixtures"
CONFIG = DecisionConfig(model_name="micro", tokenizer=TokenizerConfig(vocab_size=512), seeds=(0, 1), num_steps=12,
                        batch_size=8, sequence_length=64, learning_rate=1e-2, eval=EvalConfig(batch_size=64))
SUPERVISOR = SupervisorConfig(poll_interval_s=0.2, startup_timeout_s=120.0, hang_timeout_s=60.0, max_restarts=0)


def _texts(name: str, limit: int) -> list[str]:
    with (FIXTURES / "corpora" / f"{name}.jsonl").open() as handle:
        return [json.loads(line)["text"] for line in handle][:limit]


def _launch() -> ArmLaunch:
    planned = Layout(micro_batch_size=4)  # bf16 and compile, as a plan asks
    layout, fallbacks = fit_layout(planned, world_size=1, replica_groups=1, batch_size=CONFIG.batch_size,
                                   eager_reason="compile off for this test", fp32_reason="fp32 for this test")
    return ArmLaunch(layout=layout, fallbacks=fallbacks, supervisor=SUPERVISOR)


@pytest.mark.slow
@pytest.mark.long  # `make test`: an arm on the worker against the loop, above
def test_each_arm_trains_on_the_worker_and_the_decision_scores_its_final_weights(tmp_path):
    suite = load_suite(FIXTURES / "evals" / "ito-fixture-evals-v1.jsonl")
    clean = _texts("pydoc_topics", 120)
    # One seed, two arms: the seed reaching the worker is the exact-equality test's below.
    result = run_decision(candidate_texts=clean, baseline_texts=_texts("forum_posts", 120), eval_items=suite.items[::4],
                          config=dataclasses.replace(CONFIG, seeds=(0,)), work_dir=tmp_path, trainer=_launch())
    assert result.verdict in set(Verdict) and len(result.runs) == 2
    for run in result.runs:
        arm_dir = tmp_path / "arms" / f"{run.arm}-seed{run.seed}"
        steps = [e for e in events.read(arm_dir) if e.kind is EventKind.STEP]
        assert [e.step for e in steps] == list(range(1, CONFIG.num_steps + 1))
        assert run.train.losses == tuple(e.loss for e in steps)  # the worker's own losses
        assert run.train.losses[-1] < run.train.losses[0]  # it learned
        ran = json.loads((arm_dir / "result.json").read_text())["layout"]
        assert ran["ran"]["precision"] == "fp32" and ran["ran"]["micro_batch_size"] == 4
        assert {f["field"] for f in ran["fallbacks"]} == {"compile", "precision"}
    # Same seed, same initial weights: the arms' first losses differ only by their data, so each
    # arm's own data reached its worker.
    first = {(r.arm, r.seed): r.train.losses[0] for r in result.runs}
    assert first[("candidate", 0)] != first[("baseline", 0)]


@pytest.mark.slow
def test_an_arm_that_cannot_finish_stops_the_decision_with_its_code(tmp_path):
    suite = load_suite(FIXTURES / "evals" / "ito-fixture-evals-v1.jsonl")
    # A start-up bound no worker meets (importing torch alone takes longer), and no restart: the
    # first arm's supervisor gives up on it as hung.
    impatient = SupervisorConfig(poll_interval_s=0.01, startup_timeout_s=0.05, hang_timeout_s=60.0, max_restarts=0)
    launch = dataclasses.replace(_launch(), supervisor=impatient)
    with pytest.raises(ItoError) as caught:
        run_decision(candidate_texts=_texts("pydoc_topics", 60), baseline_texts=_texts("forum_posts", 60),
                     eval_items=suite.items[::4], config=CONFIG, work_dir=tmp_path, trainer=launch)
    assert caught.value.code is ErrorCode.DECISION_ARM_FAILED
    assert "candidate-seed0" in str(caught.value)


@pytest.mark.slow
def test_the_worker_trains_an_arm_exactly_as_the_in_process_loop_does(tmp_path):
    """Same seed, same initial weights, same batches, same optimizer, fp32 on CPU: the worker's
    losses and scores equal the trainer loop's up to float rounding (the two processes' matmuls may
    sum in another order), so moving the arms onto the worker changed where they run, not what
    they compute."""
    suite = load_suite(FIXTURES / "evals" / "ito-fixture-evals-v1.jsonl")
    texts = {"candidate_texts": _texts("pydoc_topics", 80), "baseline_texts": _texts("forum_posts", 80)}
    config = dataclasses.replace(CONFIG, seeds=(3,))
    on_worker = run_decision(**texts, eval_items=suite.items[::4], config=config, work_dir=tmp_path / "w",
                             trainer=_launch())
    in_process = run_decision(**texts, eval_items=suite.items[::4], config=config, work_dir=tmp_path / "p")
    for worker_run, loop_run in zip(on_worker.runs, in_process.runs, strict=True):
        assert worker_run.train.losses == pytest.approx(loop_run.train.losses, rel=1e-4, abs=0)
        assert worker_run.primary == pytest.approx(loop_run.primary, rel=1e-3, abs=0)
