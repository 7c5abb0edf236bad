"""A post-training stage's metadata: its curves as one chart, each curve's last value as a number
beside it (the stage outcome is the one `ito metrics` is tested with)."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from ito_assets.defs.posttraining.assets import outcome_metadata  # noqa: E402
from ito_assets.manifest.schema import RlvrStep  # noqa: E402
from posttraining.test_pretrained_start import _outcome  # noqa: E402


def test_curves_are_a_chart_with_their_last_values_as_numbers(tmp_path):
    metadata = outcome_metadata(_outcome(tmp_path), RlvrStep(kind="rlvr"))
    assert metadata["curves_chart"].value.startswith("![rlvr curves](data:image/png;base64,")
    assert metadata["final_reward"] == pytest.approx(249 / 250) and metadata["final_kl"] == 0.01
    assert not {"reward_curve", "kl_curve", "final_loss"} & set(metadata)  # no tables of numbers, no absent curve
