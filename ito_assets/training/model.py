"""A decoder-only language model: pre-norm RMSNorm, rotary positions, SwiGLU or GELU MLP.

One file, one model, the shape of every tensor in a comment. B = batch, T = sequence length,
D = d_model, H = heads, Hk = key/value heads (grouped-query attention when Hk < H), E = head
dimension (D / H), F = MLP hidden width, V = vocabulary.

The shapes (`ModelConfig`, the named `CONFIGS`) and their exact parameter and FLOP counts are in
model_config.py, free of torch; the tests check the counts against this module.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

# config_by_name is re-exported: most callers name a configuration and build it in one breath.
from ito_assets.training.model_config import ModelConfig, config_by_name  # noqa: F401


# --- the module ---------------------------------------------------------------------------------


def rotary_tables(head_dim: int, length: int, theta: float, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables of shape (T, E/2) for rotary positions (Su et al. 2021), positions divided
    by `scale` (position interpolation, Chen et al. 2023)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))  # (E/2,)
    angles = torch.outer(torch.arange(length, dtype=torch.float32) / scale, inv_freq)  # (T, E/2)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, H, T, E) rotated pairwise (even, odd) by position; cos/sin: (T, E/2)."""
    even, odd = x[..., 0::2].float(), x[..., 1::2].float()  # (B, H, T, E/2) each
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)  # (B, H, T, E/2, 2)
    return rotated.flatten(-2).type_as(x)  # (B, H, T, E)


class LayerCache:
    """One block's keys and values of the positions decoded so far, in buffers allocated at the
    first write for `capacity` positions (a write past them is refused, never grown silently)."""

    def __init__(self, capacity: int):
        self.capacity, self.length = capacity, 0
        self.keys: torch.Tensor | None = None  # (B, Hk, capacity, E)
        self.values: torch.Tensor | None = None

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v (B, Hk, T, E) of the new positions -> the keys and values of every position so far."""
        end = self.length + k.shape[2]
        if end > self.capacity:
            raise ValueError(f"the cache holds {self.capacity} positions; {end} asked")
        if self.keys is not None and k.shape[0] != self.keys.shape[0]:
            raise ValueError(f"the cache holds {self.keys.shape[0]} rows; {k.shape[0]} fed")
        if self.keys is None:
            self.keys = k.new_empty(k.shape[0], k.shape[1], self.capacity, k.shape[3])
            self.values = v.new_empty(self.keys.shape)
        self.keys[:, :, self.length : end] = k
        self.values[:, :, self.length : end] = v
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]  # (B, Hk, S, E)

    def repeat_rows(self, repeats: int) -> None:
        if self.keys is not None:
            self.keys = self.keys.repeat_interleave(repeats, dim=0)
            self.values = self.values.repeat_interleave(repeats, dim=0)


class KVCache:
    """What a decoding step reads instead of recomputing: every block's keys and values of the
    positions already fed (Pope et al. 2022, "Efficiently Scaling Transformer Inference"), so that
    a new token is a forward over itself alone. Prefill a prompt once, then `repeat_rows` to
    decode several samples of it."""

    def __init__(self, num_layers: int, capacity: int):
        self.layers = [LayerCache(capacity) for _ in range(num_layers)]

    @property
    def length(self) -> int:
        return self.layers[0].length

    def truncate(self, length: int) -> None:
        """Forget the positions from `length` on (a forward that failed part-way through its blocks)."""
        for layer in self.layers:
            layer.length = min(layer.length, length)

    def repeat_rows(self, repeats: int) -> None:
        """Row b becomes rows b * repeats ... b * repeats + repeats - 1 (repeat_interleave's order)."""
        for layer in self.layers:
            layer.repeat_rows(repeats)


def _cached_attention_mask(start: int, t: int, device: torch.device) -> torch.Tensor:
    """New positions start..start+t-1 attend to every earlier one and to themselves causally."""
    return torch.ones(t, start + t, dtype=torch.bool, device=device).tril(diagonal=start)  # (T, S)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.num_heads, self.kv_heads, self.head_dim = config.num_heads, config.kv_heads, config.head_dim
        self.q = nn.Linear(config.d_model, config.num_heads * config.head_dim, bias=False)
        self.k = nn.Linear(config.d_model, config.kv_heads * config.head_dim, bias=False)
        self.v = nn.Linear(config.d_model, config.kv_heads * config.head_dim, bias=False)
        self.o = nn.Linear(config.num_heads * config.head_dim, config.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: LayerCache | None = None) -> torch.Tensor:
        b, t, _ = x.shape  # x: (B, T, D)
        # -1 heads, not H: under tensor parallelism each rank holds H / tp heads of q, k and v.
        q = self.q(x).view(b, t, -1, self.head_dim).transpose(1, 2)  # (B, H, T, E)
        k = self.k(x).view(b, t, -1, self.head_dim).transpose(1, 2)  # (B, Hk, T, E)
        v = self.v(x).view(b, t, -1, self.head_dim).transpose(1, 2)  # (B, Hk, T, E)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        gqa = self.kv_heads != self.num_heads
        if cache is None:
            # Fused causal attention (FlashAttention on GPU): the (T, T) scores are never stored.
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:
            start = cache.length
            k, v = cache.extend(k, v)  # (B, Hk, S, E): the positions before these, and these
            # A prompt (nothing cached yet) is causal as in training; one new token sees every position.
            mask = None if start == 0 or t == 1 else _cached_attention_mask(start, t, x.device)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=start == 0 and t > 1, enable_gqa=gqa)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))  # (B, H, T, E) -> (B, T, D)


class Mlp(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.kind = config.mlp
        self.up = nn.Linear(config.d_model, config.d_ff, bias=False)
        # SwiGLU (Shazeer 2020): a second input projection gates the first through SiLU.
        self.gate = nn.Linear(config.d_model, config.d_ff, bias=False) if config.mlp == "swiglu" else None
        self.down = nn.Linear(config.d_ff, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, T, D)
        hidden = F.silu(self.gate(x)) * self.up(x) if self.gate is not None else F.gelu(self.up(x))  # (B, T, F)
        return self.down(hidden)


class Block(nn.Module):
    """Pre-norm residual block: x + Attn(Norm(x)), then x + Mlp(Norm(x)).

    `body` is what runs: `residual`, or its torch.compile'd form; with `recompute` set, only the
    block's input is kept for the backward pass and the rest is recomputed (activation
    checkpointing). Both live inside `forward`, so that FSDP2's hooks on the block stay outside
    them and the state-dict keys stay the same whatever the execution (torchtitan's order)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attention_norm = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.attention = Attention(config)
        self.mlp_norm = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.mlp = Mlp(config)
        self.recompute = False
        self.body = self.residual

    def residual(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 cache: LayerCache | None = None) -> torch.Tensor:
        # The cache by keyword: tensor parallelism's input plans count the positional inputs.
        x = x + self.attention(self.attention_norm(x), cos, sin, cache=cache)  # (B, T, D)
        return x + self.mlp(self.mlp_norm(x))  # (B, T, D)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: LayerCache | None = None) -> torch.Tensor:
        if cache is not None:  # decoding: eager, the compiled body is specialised to training's shapes
            return self.residual(x, cos, sin, cache=cache)
        if self.recompute and torch.is_grad_enabled():
            return checkpoint(self.body, x, cos, sin, use_reentrant=False)
        return self.body(x, cos, sin)


class DecoderLM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.norm = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.head.weight = self.embedding.weight  # (V, D), shared (Press & Wolf 2017)
        cos, sin = rotary_tables(config.head_dim, config.max_seq_len, config.rope_theta, config.rope_position_scale)
        self.register_buffer("rope_cos", cos, persistent=False)  # (max T, E/2)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init_weights)
        # GPT-2 (Radford et al. 2019): residual output projections scaled by 1/sqrt(2 L).
        for block in self.blocks:
            for projection in (block.attention.o, block.mlp.down):
                nn.init.normal_(projection.weight, mean=0.0, std=0.02 / math.sqrt(2 * config.num_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # N(0, 0.02): GPT-2 and OLMo-1 initialisation for linear and embedding weights.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, tokens: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """tokens: (B, T) int64 -> logits (B, T, V). With a cache, `tokens` are the positions after
        those it holds, and their keys and values are added to it."""
        start = 0 if cache is None else cache.length
        end = start + tokens.shape[1]
        if end > self.config.max_seq_len:
            raise ValueError("sequence_length exceeds the model's max_seq_len")
        if cache is not None and torch.is_grad_enabled():
            # The cache is written in place: a backward through it would read overwritten keys.
            raise ValueError("decoding through a KV cache runs without gradients (torch.no_grad)")
        x = self.embedding(tokens)  # (B, T, D)
        cos, sin = self.rope_cos[start:end], self.rope_sin[start:end]  # (T, E/2)
        try:
            for index, block in enumerate(self.blocks):
                x = block(x, cos, sin, cache=None if cache is None else cache.layers[index])
            return self.head(self.norm(x))  # (B, T, V)
        except BaseException:
            if cache is not None:  # the blocks before a failure hold these positions, the rest do not
                cache.truncate(start)
            raise

    def new_cache(self, capacity: int) -> KVCache:
        """An empty cache for up to `capacity` positions (at most the model's max_seq_len)."""
        return KVCache(len(self.blocks), min(capacity, self.config.max_seq_len))

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy; tokens and targets (B, T). Logits upcast to fp32."""
        logits = self(tokens)  # (B, T, V)
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())  # a tied weight is one Parameter


def build_model(config: ModelConfig, *, seed: int, device: str | torch.device = "cpu") -> DecoderLM:
    """The same seed gives the same initial weights on the same device and torch version."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = DecoderLM(config)
    finally:
        torch.random.set_rng_state(generator_state)
    return model.to(device)
