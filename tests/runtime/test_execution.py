"""The worker applies each field of its layout in one process: micro-batches whose gradients
accumulate to the whole batch's, bf16 autocast over fp32 weights, activation checkpointing that
keeps less for the backward pass, torch.compile of the blocks, and a named fallback for what the
device or the toolchain cannot run."""

from __future__ import annotations

import contextlib

import pytest
import torch

from ito_assets.runtime.worker import execution
from ito_assets.runtime.worker.step import train_step
from ito_assets.training.layout import Layout
from ito_assets.training.model import build_model, config_by_name
from ito_assets.training.trainer import TrainConfig, build_optimizer

CPU = torch.device("cpu")
CONFIG = TrainConfig(num_steps=4, batch_size=8, sequence_length=32, learning_rate=1e-3)


def _batch(rows: int = 8, length: int = 32, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, 512, (rows, length + 1), generator=torch.Generator().manual_seed(seed))
    return tokens[:, :-1], tokens[:, 1:]


def _prepared(layout: Layout):
    model = build_model(config_by_name("micro"), seed=0)
    return model, execution.prepare(model, layout, (), device=CPU, world_size=1)


def _gradients(layout: Layout) -> tuple[float, dict[str, torch.Tensor]]:
    model, run = _prepared(layout)
    optimizer = build_optimizer(model, CONFIG)
    grads = {}
    x, y = _batch()
    loss, _, _, _ = train_step(run, model, optimizer, x, y, 1, CONFIG,
                            before_update=lambda: grads.update({n: p.grad.clone() for n, p in model.named_parameters()}))
    return loss, grads


@pytest.mark.parametrize("micro", [1, 2, 4])
def test_micro_batches_accumulate_the_whole_batchs_gradient(micro):
    whole_loss, whole = _gradients(Layout(precision="fp32", compile=False, micro_batch_size=8))
    loss, accumulated = _gradients(Layout(precision="fp32", compile=False, micro_batch_size=micro))
    assert loss == pytest.approx(whole_loss, abs=1e-6)
    for name in whole:  # fp32: the same sums in another order
        torch.testing.assert_close(accumulated[name], whole[name], atol=1e-6, rtol=1e-5, msg=name)


def test_rows_that_do_not_split_into_micro_batches_are_refused():
    model, run = _prepared(Layout(precision="fp32", compile=False, micro_batch_size=3))
    with pytest.raises(ValueError, match="do not split into micro-batches of 3"):
        train_step(run, model, build_optimizer(model, CONFIG), *_batch(), 1, CONFIG)


def test_bf16_computes_in_bf16_and_keeps_fp32_weights():
    model, run = _prepared(Layout(compile=False, micro_batch_size=8))
    seen = []
    model.blocks[0].mlp.up.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    train_step(run, model, build_optimizer(model, CONFIG), *_batch(), 1, CONFIG)
    assert seen == [torch.bfloat16]
    assert all(p.dtype == torch.float32 for p in model.parameters())
    _, fp32 = _prepared(Layout(precision="fp32", compile=False))
    assert isinstance(fp32.autocast(), contextlib.nullcontext)


def _bytes_kept_for_backward(layout: Layout) -> int:
    """Bytes of the tensors autograd keeps from the forward pass for the backward pass."""
    model, run = _prepared(layout)
    kept = []

    def pack(tensor):
        kept.append(tensor.untyped_storage().nbytes())
        return tensor

    x, y = _batch(rows=8, length=128)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run.parallel(x, y).backward()
    return sum(kept)


def test_activation_checkpointing_keeps_less_for_the_backward_pass():
    plain = _bytes_kept_for_backward(Layout(precision="fp32", compile=False, micro_batch_size=8))
    recomputed = _bytes_kept_for_backward(Layout(precision="fp32", compile=False, micro_batch_size=8,
                                                 checkpointing="full"))
    assert recomputed < plain / 2, (recomputed, plain)


def test_activation_checkpointing_changes_no_gradient():
    _, plain = _gradients(Layout(precision="fp32", compile=False, micro_batch_size=8))
    _, recomputed = _gradients(Layout(precision="fp32", compile=False, micro_batch_size=8, checkpointing="full"))
    for name in plain:
        torch.testing.assert_close(recomputed[name], plain[name], atol=0, rtol=0, msg=name)


def test_fp8_falls_back_to_bf16_with_its_reason():
    ran, fallbacks = execution.device_fallbacks(Layout(precision="fp8"), CPU)
    assert ran.precision.value == "bf16"
    assert [f.to_dict() for f in fallbacks] == [{"field": "precision", "planned": "fp8", "ran": "bf16",
                                                "reason": "the worker has no fp8 conversion; bf16 instead"}]
    assert execution.device_fallbacks(Layout(), CPU) == (Layout(), [])


def test_a_toolchain_that_cannot_compile_runs_eager_and_says_why(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no C compiler on this host\nsecond line")

    monkeypatch.setattr(torch, "compile", broken)
    model, run = _prepared(Layout(precision="fp32", micro_batch_size=8))
    assert not run.layout.compile
    assert [f.to_dict() for f in run.fallbacks] == [{
        "field": "compile", "planned": True, "ran": False,
        "reason": "torch.compile failed on this host: RuntimeError: no C compiler on this host"}]
    assert all(block.body == block.residual for block in model.blocks)
    loss, _, _, _ = train_step(run, model, build_optimizer(model, CONFIG), *_batch(), 1, CONFIG)
    assert loss > 0


def test_a_compiling_layout_compiles_every_block_with_no_fallback(monkeypatch):
    # Only the wrapping, on a host whose toolchain compiles: the probe (one small block compiled,
    # about a minute of inductor's C++ builds on two cores with a cold cache) and the compile at
    # the first step run in `make test-long`, below.
    monkeypatch.setattr(execution, "compile_problem", lambda device: None)
    model, run = _prepared(Layout(precision="fp32", micro_batch_size=8))
    assert run.layout.compile and run.fallbacks == ()
    assert all(block.body != block.residual for block in model.blocks)


@pytest.mark.slow
@pytest.mark.long
def test_this_hosts_toolchain_compiles_a_block():
    assert execution.compile_problem(CPU) is None


@pytest.mark.slow
@pytest.mark.long
def test_compiled_blocks_train_like_eager_ones():
    eager_loss, eager = _gradients(Layout(precision="fp32", compile=False, micro_batch_size=8))
    model, run = _prepared(Layout(precision="fp32", micro_batch_size=8))
    assert run.layout.compile and run.fallbacks == ()
    assert all(block.body != block.residual for block in model.blocks)
    grads = {}
    loss, _, _, _ = train_step(run, model, build_optimizer(model, CONFIG), *_batch(), 1, CONFIG,
                            before_update=lambda: grads.update({n: p.grad.clone() for n, p in model.named_parameters()}))
    assert loss == pytest.approx(eager_loss, abs=1e-5)
    for name in eager:  # inductor fuses and reorders: close, not equal
        torch.testing.assert_close(grads[name], eager[name], atol=1e-5, rtol=1e-4, msg=name)
    torch._dynamo.reset()
