"""A stage's eval battery reads the run's own copy of the eval suite, made when the stage is
configured: the worker evaluates hours later, and an edit of the configured file meanwhile (even
one undone) would otherwise fail the stage with EVAL_SUITE_MISMATCH after its compute was spent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ito_assets.defs.resources import ItoSettingsResource
from ito_assets.defs.training.assets import _eval_suite
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.evals.suite import load_suite
from ito_assets.manifest.schema import Manifest
from ito_assets.runtime.record.storage import RunLayout
from helpers import valid_manifest


def _setup(tmp_path: Path, name: str):
    """The fixture suite under `name` (a header line names its id where the name's stem does not),
    and a manifest decontaminated against exactly those bytes."""
    from ito_assets.settings import load_settings

    settings = load_settings()
    original = settings.eval_suite_path.read_bytes()
    if Path(name).stem != settings.eval_suite_path.stem:
        original = json.dumps({"suite_id": settings.eval_suite_path.stem}).encode() + b"\n" + original
    suite_path = tmp_path / "suites" / name
    suite_path.parent.mkdir()
    suite_path.write_bytes(original)
    ito = ItoSettingsResource.from_settings(settings).model_copy(update={"eval_suite_path": str(suite_path)})
    document = valid_manifest()
    document["data"][0]["decontamination"]["eval_suite_sha256"] = load_suite(suite_path).digest
    manifest = Manifest.model_validate_json(json.dumps(document))
    layout = RunLayout.for_run(tmp_path / "run", "run_x")
    layout.checkpoint_dir.mkdir()
    return ito, manifest, layout, suite_path, original


@pytest.mark.parametrize("name", ["ito-fixture-evals-v1.jsonl", "my evals.jsonl"])
def test_the_worker_reads_the_runs_copy_whatever_the_file_becomes(tmp_path, name):
    ito, manifest, layout, suite_path, original = _setup(tmp_path, name)
    copy, suite = _eval_suite(ito, manifest, layout)
    assert copy.is_relative_to(layout.run_dir) and copy.read_bytes() == original
    suite_path.write_bytes(original + b"\n")  # edited while the stage trains
    assert load_suite(copy).digest == suite.digest and load_suite(copy).items == suite.items


def test_a_second_stage_reuses_the_copy_and_a_tampered_copy_is_rewritten(tmp_path):
    ito, manifest, layout, _, original = _setup(tmp_path, "ito-fixture-evals-v1.jsonl")
    copy, _ = _eval_suite(ito, manifest, layout)
    copy.write_bytes(b"tampered\n")
    again, suite = _eval_suite(ito, manifest, layout)
    assert again == copy and copy.read_bytes() == original


def test_a_suite_that_is_not_the_manifests_is_refused_before_any_copy(tmp_path):
    ito, manifest, layout, suite_path, original = _setup(tmp_path, "ito-fixture-evals-v1.jsonl")
    suite_path.write_bytes(original.replace(b"?", b"!", 1))
    with pytest.raises(ItoError) as refused:
        _eval_suite(ito, manifest, layout)
    assert refused.value.code is ErrorCode.EVAL_SUITE_MISMATCH
    assert not (layout.run_dir / "eval-suite").exists()
