"""Every resource of the code location refuses a field it does not have: built in Python, a
misspelt or retired field would otherwise be dropped without a word and the resource run with
its default (run configuration is checked by Dagster's own schema, also tested here)."""

from __future__ import annotations

import dagster as dg
import pydantic
import pytest

from definitions import build_definitions
from ito_assets.defs.posttraining.resources import PostTrainingResource
from ito_assets.defs.resources import StrictResource
from ito_assets.defs.training.resources import TrainingRuntimeResource
from ito_assets.settings import load_settings

RESOURCES = build_definitions(load_settings()).resources
OURS = {key: resource for key, resource in RESOURCES.items() if type(resource).__module__.startswith("ito_assets.")}


def test_every_resource_of_ours_is_strict():
    assert set(OURS) == {"ito", "ledger", "booked_hardware", "training_runtime", "training_launcher", "posttraining"}
    assert all(isinstance(resource, StrictResource) for resource in OURS.values())


@pytest.mark.parametrize("key", sorted(OURS))
def test_a_field_the_resource_does_not_have_is_refused(key):
    resource = OURS[key]
    fields = resource.model_dump()
    rebuilt = type(resource)(**fields)  # every field it has is accepted back
    assert rebuilt.model_dump() == fields
    with pytest.raises(pydantic.ValidationError, match="max_restart"):
        type(resource)(**fields, max_restart=5)  # `max_restarts` misspelt


def test_run_configuration_with_a_field_the_resource_does_not_have_is_refused():
    @dg.asset
    def uses(training_runtime: TrainingRuntimeResource) -> int:
        return training_runtime.max_restarts

    with pytest.raises(dg.DagsterInvalidConfigError, match="max_restart"):
        dg.materialize([uses], resources={"training_runtime": OURS["training_runtime"]},
                       run_config={"resources": {"training_runtime": {"config": {"max_restart": 5}}}})


# The posttraining resource's retired fields: the recipe's sizes (batch_size, RLVR's steps, groups
# and overlong window) and the evaluation battery's (num_eval_prompts, max_new_tokens,
# held_out_fraction, now the manifest's `post_training_eval`). A configuration still setting one
# is refused, never run with other sizes or prompts than the confirmed manifest says.
RETIRED_POSTTRAINING_FIELDS = ["batch_size", "rlvr_num_steps", "rlvr_groups_per_step", "overlong_cache",
                               "num_eval_prompts", "max_new_tokens", "held_out_fraction"]


def test_the_posttraining_resource_keeps_only_what_the_manifest_does_not_say():
    assert set(OURS["posttraining"].model_dump()) == {"seed", "num_threads"}


@pytest.mark.parametrize("field", RETIRED_POSTTRAINING_FIELDS)
def test_the_posttraining_resource_refuses_a_retired_field(field):
    with pytest.raises(pydantic.ValidationError, match=field):
        PostTrainingResource(**{field: 4})

    @dg.asset
    def uses(posttraining: PostTrainingResource) -> int:
        return posttraining.seed

    with pytest.raises(dg.DagsterInvalidConfigError, match=field):
        dg.materialize([uses], resources={"posttraining": PostTrainingResource()},
                       run_config={"resources": {"posttraining": {"config": {field: 4}}}})
