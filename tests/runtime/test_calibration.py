"""A stage's predicted step time and memory beside the measured ones: the planner's own estimate
for the layout that ran, the ratio, and the flag at exactly a quarter off."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ito_assets.runtime.stage.calibration import FLAG_FRACTION, Calibration, calibrate
from ito_assets.training.hardware import gpu_spec, network_spec
from ito_assets.training.layout import Layout
from ito_assets.training.memory import estimate_memory
from ito_assets.training.model_config import config_by_name
from ito_assets.training.planner import Hardware, PlanRequest
from ito_assets.training.throughput import estimate_step

BASIS = PlanRequest(model=config_by_name("proxy-150m"), sequence_length=2048, global_batch_sequences=64,
                    num_training_tokens=10**9, hardware=Hardware(gpu=gpu_spec("H200"), network=network_spec("infiniband"),
                                                                 num_nodes=1, gpus_per_node=8, price_cents_per_gpu_hour=250))
RAN = Layout(dp_shard=8, micro_batch_size=8)
MEASURED = {"step_seconds": 1.0, "num_steps_timed": 10, "peak_memory_bytes": 20 * 2**30,
            "peak_memory_source": "torch.cuda.max_memory_allocated"}


def test_the_prediction_is_the_planners_for_the_layout_that_ran():
    found = calibrate(BASIS, RAN, MEASURED)
    predicted = estimate_step(BASIS.model, RAN, sequence_length=2048, global_batch_sequences=64, gpu=BASIS.hardware.gpu,
                              network=BASIS.hardware.network, gpus_per_node=8).step_s
    assert found.predicted_step_s == predicted and found.measured_step_s == 1.0
    assert found.predicted_peak_memory_bytes == estimate_memory(BASIS.model, RAN, 2048, BASIS.hardware.gpu).total
    assert found.step_time_ratio == pytest.approx(1.0 / predicted)
    # Recomputation is priced: the layout that ran, not the plan's, is the one predicted.
    assert calibrate(BASIS, replace(RAN, checkpointing="full"), MEASURED).predicted_step_s > predicted
    body = found.to_dict()
    assert body["device"] == "H200" and body["peak_memory_source"] == "torch.cuda.max_memory_allocated"


@pytest.mark.parametrize("ratio,flagged", [(1.0, False), (1 + FLAG_FRACTION, False), (1 - FLAG_FRACTION, False),
                                           (1.2501, True), (0.7499, True), (3.0, True), (0.2, True)])
def test_a_step_more_than_a_quarter_off_is_flagged(ratio, flagged):
    figures = Calibration(predicted_step_s=2.0, measured_step_s=2.0 * ratio, predicted_peak_memory_bytes=1,
                          measured_peak_memory_bytes=1, peak_memory_source="ru_maxrss", device="CPU")
    assert figures.flagged is flagged and figures.to_dict()["flagged"] is flagged


@pytest.mark.parametrize("measured", [{}, {**MEASURED, "step_seconds": None, "num_steps_timed": 0}])
def test_an_attempt_that_timed_no_steady_step_is_not_calibrated(measured):
    assert calibrate(BASIS, RAN, measured) is None


@pytest.mark.parametrize("ratio,shown,passed", [(1.25, "1.25", True), (1.2501, "1.2501", False), (1.2504, "1.2504", False)])
def test_the_check_shows_the_ratio_it_judged(ratio, shown, passed):
    # Shown to two places, a flagged 1.2504 read "ratio 1.25": exactly a quarter off, which passes.
    from ito_assets.defs.training.checks import calibration_result

    figures = Calibration(predicted_step_s=2.0, measured_step_s=2.0 * ratio, predicted_peak_memory_bytes=1,
                          measured_peak_memory_bytes=1, peak_memory_source="ru_maxrss", device="CPU").to_dict()
    result = calibration_result(figures)
    assert result.passed is passed and result.description.endswith(f"(ratio {shown})")
    assert result.metadata["step_time_ratio"].value == float(shown)
