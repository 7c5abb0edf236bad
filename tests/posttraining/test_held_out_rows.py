"""A pair is refused when any of its rows, the prompt followed by an answer, holds a held-out
prompt anywhere: a row is the tokens of its whole text, so the prompt "max 006" with the response
"=6" trains the very row of the held-out "max 006=" and its answer, and so does that text inside a
longer prompt or an answer. One rule (`tasks.trains_held_out`) at gate 5 and in the stage."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from helpers import spy_calls
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.schema import DpoStep, PostTrainingEval, SftStep
from ito_assets.posttraining import pipeline
from ito_assets.posttraining.base import seeded
from ito_assets.posttraining.pipeline import DPO_FILE, SFT_FILE, run_stage
from ito_assets.posttraining.plan import read_pair_shapes
from ito_assets.posttraining.tasks import battery_split, held_out_refusal, self_preference_refusal, trains_held_out

FRACTION = 0.2
TRAIN, HELD_OUT = battery_split(FRACTION)
HELD = HELD_OUT[0]  # "max 006=", answer "6"
CLEAN = TRAIN[0]


@pytest.mark.parametrize("prompt, answers", [
    (HELD.prompt, [HELD.answer]),  # the prompt itself: refused before, still
    (HELD.prompt[:-1], ["=" + HELD.answer]),  # split between prompt and response: the same row
    (HELD.prompt[:-1], ["="]),  # the held-out prompt exactly, at the end of the row
    (CLEAN.prompt, [f"{CLEAN.answer}\n{HELD.prompt}{HELD.answer}"]),  # inside the response
    (f"{HELD.prompt}{HELD.answer}\n{CLEAN.prompt}", [CLEAN.answer]),  # inside a longer prompt
    ("  " + HELD.prompt[:-1].replace(" ", "   "), ["=" + HELD.answer + "  "]),  # other whitespace
    (CLEAN.prompt, [CLEAN.answer, f"1 {HELD.prompt}"]),  # a DPO pair's rejected answer alone
    (CLEAN.prompt, [f"1 {HELD.prompt}", CLEAN.answer]),  # its chosen answer alone
])
def test_a_row_that_holds_a_held_out_prompt_anywhere_is_refused(prompt, answers):
    assert trains_held_out(prompt, answers, FRACTION)


@pytest.mark.parametrize("prompt, answers", [
    (CLEAN.prompt, [CLEAN.answer]),
    (HELD.prompt[:-1], [""]),  # one character short of the held-out prompt
    (HELD.prompt[:-2], [HELD.prompt[-2]]),  # the same, split
    (HELD.prompt[:-1], [" =" + HELD.answer]),  # "max 006 =6": another row than the held-out one
    (HELD.prompt[1:], [HELD.answer]),  # "ax 006=6"
    (CLEAN.prompt, [CLEAN.answer, HELD.prompt[:-1]]),
])
def test_a_row_short_of_every_held_out_prompt_is_kept(prompt, answers):
    assert not trains_held_out(prompt, answers, FRACTION)


def test_only_the_prompts_held_out_at_the_manifests_fraction_count():
    """The train side of one split is the held-out side of another."""
    other_train, other_held = battery_split(0.5)
    moved = next(t for t in other_held if t in TRAIN)
    assert not trains_held_out(moved.prompt[:-1], ["=" + moved.answer], FRACTION)
    assert trains_held_out(moved.prompt[:-1], ["=" + moved.answer], 0.5)


def _bound(data_root: Path, kind: str, rows: list[dict]) -> SftStep | DpoStep:
    name = SFT_FILE if kind == "sft" else DPO_FILE
    path = data_root / "pairs" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"pair_id": f"p{i}", **row}) + "\n" for i, row in enumerate(rows)))
    data = {"uri": f"dataroot://pairs/{name}", "format": "jsonl", "license": "CC0-1.0",
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    return (SftStep if kind == "sft" else DpoStep).model_validate({"kind": kind, "data": data, "batch_size": 2})


SPLIT_ROWS = {  # the third pair trains the held-out prompt's row, split so its prompt is not one
    "sft": [{"prompt": t.prompt, "response": t.answer} for t in TRAIN[:2]]
    + [{"prompt": HELD.prompt[:-1], "response": "=" + HELD.answer}],
    "dpo": [{"prompt": t.prompt, "chosen": t.answer, "rejected": "0"} for t in TRAIN[1:3]]
    + [{"prompt": CLEAN.prompt, "chosen": CLEAN.answer, "rejected": f"{CLEAN.answer}\n{HELD.prompt}"}],
}


@pytest.mark.parametrize("kind", ["sft", "dpo"])
def test_gate_5_and_the_stage_refuse_a_split_pair_alike_before_any_compute(tmp_path, monkeypatch, kind):
    step = _bound(tmp_path, kind, SPLIT_ROWS[kind])
    expected = held_out_refusal(step.data.uri, 3, FRACTION)
    stopped = spy_calls(monkeypatch, pipeline, "_evaluate", stop=True)
    for refuse in (lambda: read_pair_shapes([step], tmp_path, held_out_fraction=FRACTION),
                   lambda: run_stage(step, start=seeded(), data_root=tmp_path, out_dir=tmp_path / "out",
                                     evaluation=PostTrainingEval(num_prompts=2, held_out_fraction=FRACTION))):
        with pytest.raises(ItoError) as refused:
            refuse()
        assert refused.value.code is ErrorCode.POSTTRAINING_DATA_INVALID and refused.value.message == expected
    assert stopped == []
    clean = _bound(tmp_path, kind, SPLIT_ROWS[kind][:2])
    assert read_pair_shapes([clean], tmp_path, held_out_fraction=FRACTION)[kind].num_pairs == 2


def test_gate_5_refuses_a_pair_that_prefers_an_answer_to_itself_as_the_stage_does(tmp_path):
    rows = [{"prompt": t.prompt, "chosen": t.answer, "rejected": "0"} for t in TRAIN[1:3]]
    same = rows + [{"prompt": CLEAN.prompt, "chosen": CLEAN.answer, "rejected": f" {CLEAN.answer}\n"}]
    step = _bound(tmp_path, "dpo", same)
    with pytest.raises(ItoError) as refused:
        read_pair_shapes([step], tmp_path, held_out_fraction=FRACTION)
    assert refused.value.code is ErrorCode.POSTTRAINING_DATA_INVALID
    assert refused.value.message == self_preference_refusal(f"{step.data.uri}: line 3")
    assert read_pair_shapes([_bound(tmp_path, "dpo", rows)], tmp_path, held_out_fraction=FRACTION)["dpo"].num_pairs == 2
