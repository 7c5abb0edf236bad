"""Stage gates under hostile numbers: only finite figures pass, thresholds hold at their boundary,
units that no battery could have produced are refused, the answer loss scores what it counts, and
the step-time flag reads the ratio it records."""

from __future__ import annotations

import json
import math

import pytest
from tokenizers import Tokenizer, models

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.evals.suite import EvalItem
from ito_assets.runtime.stage import noise
from ito_assets.runtime.stage.battery import answer_units
from ito_assets.runtime.stage.calibration import Calibration
from ito_assets.runtime.stage.eval_gate import Direction, EvalGatePolicy, GatedMetric, VerdictStore, judge_stage
from ito_assets.runtime.stage.noise import Units
from ito_assets.training.evaluation import continuation_logprobs
from ito_assets.training.model import build_model, config_by_name

LOWER = GatedMetric(name="heldout_loss", direction=Direction.LOWER_IS_BETTER, noise_band=0.25)
HIGHER = GatedMetric(name="score", direction=Direction.HIGHER_IS_BETTER, noise_band=0.25)
INF, NAN = math.inf, math.nan
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")  # NaN and overflow, on purpose


def _steady(value: float, num_units: int = 4) -> Units:
    """Units that all score `value` per token: no item noise, the band is the seed part alone."""
    return Units(loss=(value,) * num_units, tokens=(1,) * num_units)


def _judge(value: float, previous: float, *, metric: GatedMetric = LOWER, later: bool = False, **policy):
    return judge_stage("mid_training" if later else "pretraining", {metric.name: _steady(value)},
                       {metric.name: previous}, EvalGatePolicy(metrics=(metric,), **policy),
                       previous_stage="pretraining" if later else None)


# --- only finite figures pass ---------------------------------------------------------------------

@pytest.mark.parametrize("later", [False, True])
def test_a_diverged_reference_is_no_ground_for_a_pass(later):
    # An infinite previous loss makes any finite loss an infinite gain: a comparison with nothing.
    verdict = _judge(3.0, INF, later=later)
    assert not verdict.passed and verdict.error_code == "EVAL_GATE_FAILED"


@pytest.mark.parametrize("value,previous", [(NAN, 6.0), (INF, 6.0), (6.0, NAN), (NAN, NAN), (INF, INF)])
def test_a_diverged_stage_fails_its_gate(value, previous):
    assert not _judge(value, previous).passed and not _judge(value, previous, later=True).passed


def test_a_gain_that_overflows_is_not_a_pass():
    # 1.7e308 - (-1.7e308) overflows to an infinite gain for a higher-is-better metric.
    verdict = _judge(1.7e308, -1.7e308, metric=HIGHER)
    assert not verdict.passed


@pytest.mark.parametrize("band", [INF, NAN, 0.0, -0.0, -0.1])
def test_a_noise_band_that_is_not_a_positive_finite_figure_is_refused(band):
    # An infinite band allowed any regression (-2 x inf), a NaN one failed everything silently.
    with pytest.raises(ValueError, match="noise_band"):
        GatedMetric(name="x", direction=Direction.LOWER_IS_BETTER, noise_band=band)


@pytest.mark.parametrize("bands", [{"max_regression_bands": INF}, {"min_improvement_bands": INF},
                                   {"max_regression_bands": NAN}, {"min_improvement_bands": NAN},
                                   {"max_regression_bands": -1.0}])
def test_thresholds_that_are_not_finite_are_refused(bands):
    with pytest.raises(ValueError, match="finite"):
        EvalGatePolicy(metrics=(LOWER,), **bands)


# --- the thresholds at their boundary ---------------------------------------------------------------
# Seed band 0.25 and steady units: the band is exactly 0.25, every figure below is exact in binary.

@pytest.mark.parametrize("bands,value,passed", [
    (3.0, 5.25, True),                      # a gain of exactly 3 bands
    (3.0, math.nextafter(5.25, INF), False),
    (3.0, 5.0, True),
    (0.0, 6.0, True),                       # 0 bands: no gain is enough
    (0.0, math.nextafter(6.0, INF), False),
])
def test_min_improvement_bands_at_its_boundary(bands, value, passed):
    assert _judge(value, 6.0, min_improvement_bands=bands).passed is passed


@pytest.mark.parametrize("bands,value,passed", [
    (3.0, 4.75, True),                      # a regression of exactly 3 bands
    (3.0, math.nextafter(4.75, INF), False),
    (3.0, 4.5, True),
    (0.0, 4.0, True),                       # 0 bands: no regression at all
    (0.0, math.nextafter(4.0, INF), False),
    (0.0, 3.0, True),
])
def test_max_regression_bands_at_its_boundary(bands, value, passed):
    assert _judge(value, 4.0, later=True, max_regression_bands=bands).passed is passed


def test_negative_zero_is_zero():
    assert _judge(-0.0, 0.0, later=True, max_regression_bands=0.0).passed
    assert not _judge(-0.0, 0.0, min_improvement_bands=0.5).passed


# --- units the battery could not have produced --------------------------------------------------------

def test_units_whose_losses_and_token_counts_do_not_match_are_refused():
    # Two losses over three counts pooled 20 nats over 1,002 tokens: a loss no unit measured.
    with pytest.raises(ValueError, match="both its loss and its token count"):
        Units(loss=(10.0, 10.0), tokens=(1, 1, 1000))


@pytest.mark.parametrize("tokens", [(0, 4), (4, -1)])
def test_a_unit_of_no_tokens_is_refused(tokens):
    with pytest.raises(ValueError, match="at least one token"):
        Units(loss=(0.0, 8.0), tokens=tokens)


def test_units_of_other_windows_do_not_pair():
    # As many units, other token counts: another battery's units, not these units under another model.
    current, reference = Units(loss=(4.0,) * 4, tokens=(4,) * 4), Units(loss=(8.0,) * 4, tokens=(8,) * 4)
    with pytest.raises(ValueError, match="same units"):
        noise.band(0.01, current, reference)
    assert noise.band(0.01, current, Units(loss=(5.0,) * 4, tokens=(4,) * 4)).method == "paired bootstrap"


def test_units_read_back_as_lists_still_pair():
    listed = Units(loss=[4.0, 5.0], tokens=[2, 2])  # as a record's JSON gives them
    assert noise.band(0.01, listed, Units(loss=(5.0, 6.0), tokens=(2, 2))).method == "paired bootstrap"


# --- the answer loss scores every token it counts ----------------------------------------------------------

@pytest.fixture(scope="module")
def micro():
    return build_model(config_by_name("micro", vocab_size=64), seed=0)


class _Ids:
    """A tokenizer stand-in: the prompt is 3 tokens, an answer is as many tokens as it has words."""

    @staticmethod
    def encode(text: str):
        return type("Encoding", (), {"ids": [5, 6, 7] if text.startswith("Question") else [9] * len(text.split())})


@pytest.mark.parametrize("words", [1, 255, 256, 257, 400, 600])
def test_an_answer_beyond_the_window_is_scored_on_its_first_tokens(micro, words):
    window = micro.config.max_seq_len
    units = answer_units(micro, _Ids(), [EvalItem(id="a", benchmark="b", question="q", answer=" ".join(["w"] * words))])
    assert units.tokens == (min(words, window),)  # 257 tokens were scored as 1, 400 as 144
    expected = continuation_logprobs(micro, [([5, 6, 7], [9] * min(words, window))], 32)[0]
    assert units.loss[0] == pytest.approx(-sum(expected))


def test_an_answer_that_encodes_to_nothing_is_refused(micro):
    bare = Tokenizer(models.BPE(vocab={"a": 0, "Q": 1}, merges=[]))  # no byte fallback: unknown text vanishes
    assert bare.encode(" \N{CRAB}").ids == []
    items = [EvalItem(id="kept", benchmark="b", question="q", answer="a"),
             EvalItem(id="crab", benchmark="b", question="q", answer="\N{CRAB}")]
    with pytest.raises(ValueError, match="'crab'.*no tokens"):
        answer_units(micro, bare, items)


# --- the step-time flag ---------------------------------------------------------------------------------------

def _calibration(predicted: float, measured: float, predicted_memory: int = 1) -> Calibration:
    return Calibration(predicted_step_s=predicted, measured_step_s=measured, peak_memory_source="ru_maxrss",
                       predicted_peak_memory_bytes=predicted_memory, measured_peak_memory_bytes=1, device="CPU")


@pytest.mark.parametrize("predicted,measured,flagged", [
    (0.1, 0.075, False), (0.1, 0.125, False), (3.0, 2.25, False), (3.0, 3.75, False),  # exactly a quarter off
    (0.1, 0.07499, True), (0.1, 0.12501, True),
])
def test_a_quarter_off_exactly_is_not_flagged_whatever_the_binary_rounding(predicted, measured, flagged):
    figures = _calibration(predicted, measured)
    assert figures.flagged is flagged and figures.to_dict()["flagged"] is flagged


@pytest.mark.parametrize("predicted,measured", [(1.0, NAN), (NAN, 1.0), (0.0, 1.0), (1.0, INF), (1.0, 0.0)])
def test_a_step_time_that_cannot_be_compared_is_flagged_not_raised(predicted, measured):
    figures = _calibration(predicted, measured)
    assert figures.flagged and figures.to_dict()["flagged"]


def test_a_zero_memory_prediction_does_not_stop_the_record():
    assert math.isnan(_calibration(1.0, 1.0, predicted_memory=0).to_dict()["peak_memory_ratio"])


# --- the verdict store: only a recorded pass lets the run go on ------------------------------------------------

@pytest.mark.parametrize("body", [{"stage": "pretraining", "passed": "false"}, {"stage": "pretraining"},
                                  {"stage": "pretraining", "passed": 1}, ["passed", True]])
def test_a_verdict_that_does_not_say_passed_stops_the_run(tmp_path, body):
    (tmp_path / "gate-pretraining.json").write_text(json.dumps(body))
    store = VerdictStore(tmp_path)
    with pytest.raises(ItoError) as caught:
        store.ensure_not_failed(("pretraining",))
    assert caught.value.code is ErrorCode.EVAL_GATE_FAILED
    with pytest.raises(ItoError, match="stays failed"):
        store.record(_judge(1.0, 6.0))
