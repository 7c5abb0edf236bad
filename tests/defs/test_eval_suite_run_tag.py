"""A run asked for against one eval suite (the sensor's `ito/eval_suite_digest` tag) never makes its
report against another: the suite file may change between the sensor's look and the run's read,
and the stored `eval_suite` asset is one file that a concurrent run may have rewritten."""

from __future__ import annotations


import dagster as dg
import pytest

from ito_assets.control.run_tags import EVAL_SUITE_DIGEST
from ito_assets.defs.manifest.assets import eval_suite
from ito_assets.defs.resources import ItoSettingsResource
from ito_assets.evals.suite import load_suite
from ito_assets.settings import load_settings


def _materialize(tags: dict[str, str]) -> dg.ExecuteInProcessResult:
    return dg.materialize([eval_suite], resources={"ito": ItoSettingsResource.from_settings(load_settings())},
                          tags=tags, raise_on_error=False)


def _failure(result: dg.ExecuteInProcessResult) -> dg.DagsterEvent:
    return next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")


def test_the_suite_the_run_was_asked_for_is_read():
    digest = load_suite(load_settings().eval_suite_path).digest
    assert _materialize({EVAL_SUITE_DIGEST: digest}).success
    assert _materialize({}).success  # a run no sensor tagged (the UI, `ito data prepare`) reads what is there


@pytest.mark.parametrize("last", ["0", "f"])
def test_another_suite_than_the_run_was_asked_for_fails_with_the_mismatch(last):
    digest = load_suite(load_settings().eval_suite_path).digest
    other = digest[:-1] + (last if digest[-1] != last else "1")  # one hex digit off
    result = _materialize({EVAL_SUITE_DIGEST: other})
    assert not result.success
    failure = _failure(result).step_failure_data
    assert failure.user_failure_data.metadata["error_code"].value == "EVAL_SUITE_MISMATCH"
    assert other in failure.error.message and digest in failure.error.message
