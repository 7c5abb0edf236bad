"""The plan of a recipe's post-training stages: what it prices is what the runtime runs (the steps,
rows and widths `sft_batches`, `dpo_batches` and the RLVR worker use), each part at the rate of what
runs it, and the whole counted in the run's time and cost."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.schema import DpoStep, PostTrainingEval, RlvrStep, SftStep
from ito_assets.posttraining import plan as post
from ito_assets.posttraining.eval_gate import EVAL_BATCH_PROMPTS, EVAL_SAMPLES_PER_PROMPT
from ito_assets.posttraining.dpo import DpoConfig, dpo_batches
from ito_assets.posttraining.fixtures import read_instruction_pairs, read_preference_pairs
from ito_assets.posttraining.reference_pass import busiest_rank_pairs, reference_chunk
from ito_assets.posttraining.sft import SftConfig, sft_batches
from ito_assets.posttraining.vocab import CharVocab
from ito_assets.training.cost import cost_cents
from ito_assets.training.hardware import gpu_spec, network_spec
from ito_assets.training.model_config import config_by_name, flops_per_token
from ito_assets.training.planner import Hardware
from ito_assets.training.throughput import matmul_efficiency
from ito_assets.training.tokenizer import TokenizerConfig, train_tokenizer

from helpers import PAIR_FIXTURES

TINY = config_by_name("tiny")
BATTERY = PostTrainingEval()
ONE_CORE = gpu_spec("CPU").peak_fp32_flops / 2  # the stage's process and the generator: one thread each


def hardware(gpu: str = "H100-SXM", nodes: int = 1, per_node: int = 8) -> Hardware:
    return Hardware(gpu=gpu_spec(gpu), network=network_spec("infiniband"), num_nodes=nodes, gpus_per_node=per_node,
                    price_cents_per_gpu_hour=250)


def sft(**fields) -> SftStep:
    return SftStep(kind="sft", **fields)


def shape(num_pairs: int, longest: int = 20) -> post.PairShape:
    return post.PairShape(num_pairs=num_pairs, longest_positions=longest)


def one(step, shapes=None, hw=None, config=TINY, battery=BATTERY) -> post.PostTrainingStagePlan:
    [planned] = post.plan_post_training([step], config, hw or hardware(), shapes or {}, battery)
    return planned


@pytest.mark.parametrize("num_pairs, steps", [(7, 0), (8, 1), (15, 1), (16, 2)])
def test_sft_steps_are_full_batches_only_as_the_stage_draws_them(num_pairs: int, steps: int) -> None:
    planned = one(sft(batch_size=8, num_epochs=3), {"sft": shape(num_pairs)})
    assert planned.num_steps == 3 * steps
    assert planned.worker_flops == 3 * steps * 8 * 20 * flops_per_token(TINY, 20)
    assert planned.host_flops == 0


@pytest.mark.parametrize("longest, width", [(TINY.max_seq_len - 1, TINY.max_seq_len - 1),
                                            (TINY.max_seq_len, TINY.max_seq_len),
                                            (TINY.max_seq_len + 1, TINY.max_seq_len)])
def test_rows_are_priced_at_the_longest_pairs_width_never_past_the_model(longest: int, width: int) -> None:
    assert one(sft(), {"sft": shape(64, longest)}).sequence_length == width


@given(num_pairs=st.integers(1, 300), vocab_size=st.integers(4_000_000, 40_000_000), world_size=st.integers(1, 9))
@settings(max_examples=200, deadline=None)
def test_the_busiest_rank_computes_what_the_reference_pass_gives_it(num_pairs, vocab_size, world_size) -> None:
    """Against the pass loop of `dpo.reference_logprobs`, counted: passes of 1 to 8 pairs here."""
    chunk = reference_chunk(1, vocab_size)
    counted = [sum(len(range(first, min(first + chunk, num_pairs)))
                   for first in range(rank * chunk, num_pairs, world_size * chunk)) for rank in range(world_size)]
    assert sum(counted) == num_pairs
    assert busiest_rank_pairs(num_pairs, 1, vocab_size, world_size) == max(counted)


@pytest.mark.parametrize("num_pairs, busiest", [(10, 10), (546 * 8, 546), (546 * 8 + 1, 547), (546 * 9, 2 * 546),
                                                (546 * 16 + 3, 2 * 546 + 3)])
def test_dpo_trains_two_answers_a_pair_and_computes_the_reference_once_on_the_workers_ranks(
        num_pairs: int, busiest: int) -> None:
    """The reference pass: passes of 546 pairs (their logits within the budget), the ranks taking
    one in turn, so the stage waits for the rank with the most pairs; none of it on the host."""
    planned = one(DpoStep(kind="dpo", batch_size=8), {"dpo": shape(num_pairs, 30)})
    per_position, pair = flops_per_token(TINY, 30), 2 * 30 * flops_per_token(TINY, 30) / 3
    assert reference_chunk(30, TINY.vocab_size) == 546 and planned.num_ranks == 8
    steps = num_pairs // 8  # one epoch, a remainder left out
    training = steps * 8 * 2 * 30 * per_position
    assert planned.num_steps == steps
    assert planned.worker_flops == pytest.approx(training + num_pairs * pair)
    assert (planned.host_flops, planned.host_forwards, planned.host_seconds) == (0, 0, 0)
    rate = gpu_spec("H100-SXM").peak_fp32_flops * matmul_efficiency(TINY)
    assert planned.worker_seconds == pytest.approx(post._worker_seconds(training, TINY, hardware(), 8, steps)
                                                   + busiest * pair / rate)


@pytest.mark.parametrize("max_draws", [1, 3, 10, 100])
def test_rlvr_trains_on_one_rank_and_generates_its_draw_bound_on_one_host_core_through_the_kv_cache(max_draws) -> None:
    step = RlvrStep(kind="rlvr", num_steps=3, groups_per_step=2, group_size=4, max_draws_per_group=max_draws)
    planned = one(step, hw=hardware(nodes=2))
    prompt, new = post.battery_prompt_positions(), step.max_new_tokens
    trained, per_position = 3 * 2, flops_per_token(TINY, prompt + new)
    # Every group the stage may draw is generated, and a full queue of 2 and the one in hand past
    # them when training stops; only the kept ones train.
    assert post.priced_groups(step) == trained * max_draws
    groups = trained * max_draws + 2 + 1
    assert post.generated_groups(step) == groups
    assert (planned.num_ranks, planned.sequence_length) == (1, prompt + new)
    assert planned.worker_flops == pytest.approx(trained * 4 * (prompt + new) * per_position * 5 / 3)
    # A group's prompt is read once; then each of its 4 completions is fed its tokens but the last, one at a time.
    assert planned.host_flops == pytest.approx(groups * (prompt + 4 * (new - 1)) * per_position / 3)
    # A sampling's forwards: the prompt's, then one a token but the last; each a fixed cost a block besides its FLOPs.
    assert planned.host_forwards == groups * new
    assert planned.host_seconds == pytest.approx(planned.host_flops / (ONE_CORE * matmul_efficiency(TINY))
                                                 + groups * new * TINY.num_layers * post.HOST_SECONDS_PER_BLOCK_FORWARD)
    # The other 15 GPUs of the booking wait and are paid for.
    assert planned.cost_cents == cost_cents(16, planned.wall_seconds, 250)


@pytest.mark.parametrize("batch, per_node, ranks", [(8, 8, 8), (6, 8, 6), (12, 8, 6), (1, 8, 1)])
def test_sft_and_dpo_take_the_ranks_the_stage_takes(batch: int, per_node: int, ranks: int) -> None:
    planned = one(sft(batch_size=batch), {"sft": shape(64)}, hw=hardware(per_node=per_node))
    assert planned.num_ranks == ranks
    if ranks == 1:  # one rank has no collectives: compute alone, at the fp32 peak
        assert planned.worker_seconds == planned.worker_flops / (gpu_spec("H100-SXM").peak_fp32_flops * matmul_efficiency(TINY))


def test_fsdp_collectives_count_where_they_exceed_the_compute() -> None:
    """A large model on few positions: the fp32 all-gathers and reduce-scatter (12 bytes a parameter
    a step) outlast the compute, so they set the step."""
    model = config_by_name("llama3-8b")
    planned = one(sft(batch_size=8), {"sft": shape(8, 2)}, hw=hardware(), config=model)
    compute = planned.worker_flops / (8 * gpu_spec("H100-SXM").peak_fp32_flops * matmul_efficiency(model))
    assert planned.worker_seconds > compute


def test_the_fp32_rate_is_the_datasheets_not_the_bf16_tensor_cores() -> None:
    fast = one(sft(batch_size=1), {"sft": shape(64)}, hw=hardware("H100-SXM", per_node=1))
    slow = one(sft(batch_size=1), {"sft": shape(64)}, hw=hardware("A100-80GB", per_node=1))
    assert slow.worker_seconds / fast.worker_seconds == pytest.approx(67 / 19.5)


def test_the_plan_covers_the_recipe_in_its_order_and_its_total_is_the_stages_sum() -> None:
    recipe = [sft(), DpoStep(kind="dpo"), RlvrStep(kind="rlvr")]
    plans = post.plan_post_training(recipe, TINY, hardware(), {"sft": shape(32), "dpo": shape(16)}, BATTERY)
    assert [p.stage for p in plans] == ["sft", "dpo", "rlvr"]
    assert post.total_wall_seconds(plans) == math.fsum(p.worker_seconds + p.host_seconds + p.evaluation_seconds
                                                       for p in plans)
    assert post.plan_post_training([], TINY, hardware(), {}, BATTERY) == ()


def test_the_battery_is_evaluated_before_the_first_stage_and_after_every_stage() -> None:
    """Per prompt: sampled and greedy rewards (EVAL_SAMPLES_PER_PROMPT + 1 completions) after each
    stage and, for the first, before it; and after each, EVAL_SAMPLES_PER_PROMPT more for the KL,
    each then a forward of the policy and of the reference."""
    battery = PostTrainingEval(num_prompts=10, max_new_tokens=5)
    prompt, new, samples = post.battery_prompt_positions(), 5, EVAL_SAMPLES_PER_PROMPT
    per_position = flops_per_token(TINY, prompt + new)
    # Through the KV cache: a prompt read once a sampling, then every completion's tokens but its last.
    sampled, greedy = (prompt + samples * (new - 1)) * per_position / 3, (prompt + new - 1) * per_position / 3
    kl = sampled + 2 * samples * (prompt + new) * per_position / 3
    first, later = post.plan_post_training([sft(), RlvrStep(kind="rlvr")], TINY, hardware(), {"sft": shape(32)}, battery)
    assert first.evaluation_flops == pytest.approx(10 * (2 * (sampled + greedy) + kl))
    assert later.evaluation_flops == pytest.approx(10 * (sampled + greedy + kl))
    # A batch's sampled and greedy decoding 5 forwards each (twice for the first stage), the KL's sampling 5 and its
    # two scoring forwards; the 10 prompts in at most 8 batches (below).
    assert (first.evaluation_forwards, later.evaluation_forwards) == (8 * (2 * 2 * 5 + 5 + 2), 8 * (2 * 5 + 5 + 2))
    assert first.evaluation_seconds == pytest.approx(first.evaluation_flops / (ONE_CORE * matmul_efficiency(TINY))
                                                     + 8 * 27 * TINY.num_layers * post.HOST_SECONDS_PER_BLOCK_FORWARD)
    assert first.wall_seconds == first.worker_seconds + first.host_seconds + first.evaluation_seconds
    double = one(sft(), {"sft": shape(32)}, battery=PostTrainingEval(num_prompts=20, max_new_tokens=5))
    assert double.evaluation_flops == pytest.approx(2 * one(sft(), {"sft": shape(32)}, battery=battery).evaluation_flops)


@pytest.mark.parametrize("times, underpriced",
                         [(0.5, False), (1.0, False), (1.25, False), (1.2501, True), (1.25004, True), (3.0, True)])
def test_an_evaluation_is_flagged_only_when_it_took_over_a_quarter_longer_than_planned(times, underpriced) -> None:
    """The plan is an upper bound for the battery: a faster evaluation is not a fault of the price."""
    planned = post.evaluation_seconds(TINY, BATTERY, first=False)
    figures = post.evaluation_calibration(TINY, BATTERY, first=False, cpu_s=planned * times, wall_s=99.0)
    assert figures["ratio"] == round(times, 4) and figures["underpriced"] is underpriced  # CPU seconds judged
    assert figures["planned_s"] == round(planned, 3) and figures["measured_wall_s"] == 99.0
    # The recipe's first stage is evaluated before it too: priced for both.
    assert post.evaluation_seconds(TINY, BATTERY, first=True) > planned
    later = post.plan_post_training([sft(), RlvrStep(kind="rlvr")], TINY, hardware(), {"sft": shape(32)}, BATTERY)[1]
    assert later.evaluation_seconds == pytest.approx(planned)


@pytest.mark.parametrize("steps, draws, drawn, overdrawn", [
    (4, 1, 400, False), (4, 1, 401, True), (4, 10, 1, False), (4, 10, 4_000, False), (4, 10, 4_001, True),
    (20_001, 10, 20_001_000, False), (20_001, 10, 20_001_001, True)])  # a ratio that rounds to 1.0
def test_rlvr_is_flagged_only_when_it_drew_more_groups_than_priced(steps, draws, drawn, overdrawn) -> None:
    """The plan prices the draw bound, steps x groups per step x max_draws_per_group, which an
    attempt never passes (a restarted one draws its steps again)."""
    step = RlvrStep(kind="rlvr", num_steps=steps, groups_per_step=100, max_draws_per_group=draws)
    figures = post.generation_calibration(step, drawn)
    planned = steps * 100 * draws
    assert figures == {"planned_groups": planned, "drawn_groups": drawn, "ratio": round(drawn / planned, 4),
                       "overdrawn": overdrawn}


@pytest.mark.parametrize("prompts, batches", [(2, 2), (8, 8), (9, 8), (32, 8), (33, 9), (200, 14), (999, 39)])
def test_the_batteries_batches_are_bounded_by_its_prompts_and_their_possible_lengths(prompts: int, batches: int) -> None:
    """Prompts of one length share a batch of up to EVAL_BATCH_PROMPTS; a prompt holds 2 to 9
    positions (bos and 1 to 8 bytes' tokens), so the lengths add at most 7 partly filled batches."""
    assert post.battery_prompt_positions() == 9 and EVAL_BATCH_PROMPTS == 32
    battery = PostTrainingEval(num_prompts=prompts, max_new_tokens=3, held_out_fraction=0.999)  # holds 999 out
    assert post.evaluation_forwards(battery, first=False) == batches * (2 * 3 + 3 + 2)


@pytest.mark.parametrize("new, refused", [(TINY.max_seq_len - 2, False), (TINY.max_seq_len - 1, False),
                                          (TINY.max_seq_len, True)])
def test_completions_the_model_cannot_hold_are_refused_as_the_stage_would(new: int, refused: bool) -> None:
    """A prompt holds bos and a token at least: max_new_tokens + 1 positions must fit."""
    for step, battery in ((RlvrStep(kind="rlvr", max_new_tokens=new, overlong_cache=1), BATTERY),
                          (sft(), PostTrainingEval(max_new_tokens=new))):
        if not refused:
            one(step, {"sft": shape(32)}, battery=battery)
            continue
        with pytest.raises(ItoError) as raised:
            one(step, {"sft": shape(32)}, battery=battery)
        assert raised.value.code is ErrorCode.POSTTRAINING_DATA_INVALID
        assert f"need at least {new + 1} positions; the model holds {TINY.max_seq_len}" in raised.value.message


# --- the shape of a pair file, and what the stage then runs -----------------------------------


def bound(kind: str, path: Path, lines: list[dict], **fields):
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    path.write_bytes(data)
    reference = {"uri": f"file://{path}", "sha256": hashlib.sha256(data).hexdigest(), "license": "CC0-1.0",
                 "format": "jsonl"}
    return (SftStep if kind == "sft" else DpoStep)(kind=kind, data=reference, batch_size=1, **fields)


def test_a_pairs_positions_are_bos_and_its_prompt_and_longest_answer_in_utf8_bytes(tmp_path: Path) -> None:
    instructions = bound("sft", tmp_path / "sft.jsonl", [{"pair_id": "a", "prompt": "é", "response": "ab"},
                                                         {"pair_id": "b", "prompt": "x", "response": "y"}])
    preferences = bound("dpo", tmp_path / "dpo.jsonl", [{"pair_id": "a", "prompt": "p", "chosen": "c", "rejected": "€€"}])
    shapes = post.read_pair_shapes([instructions, preferences, RlvrStep(kind="rlvr")], tmp_path)
    assert shapes == {"sft": post.PairShape(num_pairs=2, longest_positions=1 + 2 + 2),
                      "dpo": post.PairShape(num_pairs=1, longest_positions=1 + 1 + 6)}


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_a_byte_level_bpe_never_needs_more_positions_than_utf8_bytes(text: str) -> None:
    tokenizer = _bpe()
    assert len(tokenizer.encode(text, add_special_tokens=False).ids) <= len(text.encode("utf-8", "surrogatepass"))


_TOKENIZER = []


def _bpe():
    if not _TOKENIZER:
        texts = [line for line in (PAIR_FIXTURES / "sft_pairs.jsonl").read_text().splitlines()[:200]]
        _TOKENIZER.append(train_tokenizer(texts, TokenizerConfig(vocab_size=400)))
    return _TOKENIZER[0]


def bound_fixture(kind: str, **fields):
    data = (PAIR_FIXTURES / f"{kind}_pairs.jsonl").read_bytes()
    reference = {"uri": f"dataroot://{kind}_pairs.jsonl", "sha256": hashlib.sha256(data).hexdigest(),
                 "license": "CC0-1.0", "format": "jsonl"}
    return (SftStep if kind == "sft" else DpoStep)(kind=kind, data=reference, **fields)


def test_the_planned_steps_and_widths_are_the_ones_the_stages_draw() -> None:
    codec = CharVocab()
    instructions = read_instruction_pairs(PAIR_FIXTURES / "sft_pairs.jsonl")
    preferences = read_preference_pairs(PAIR_FIXTURES / "dpo_pairs.jsonl")
    shapes = post.read_pair_shapes([bound_fixture("sft", batch_size=24, num_epochs=2), bound_fixture("dpo", batch_size=24)],
                                   PAIR_FIXTURES)
    step = sft(batch_size=24, num_epochs=2)
    planned = one(step, shapes)
    batches, steps = sft_batches(codec, instructions, SftConfig.from_step(step))
    assert planned.num_steps == steps and batches.plan.sequence_length <= planned.sequence_length
    dpo = DpoStep(kind="dpo", batch_size=24)
    planned = one(dpo, shapes)
    batches, steps = dpo_batches(codec, preferences, DpoConfig.from_step(dpo))
    assert planned.num_steps == steps and batches.plan.sequence_length <= planned.sequence_length
