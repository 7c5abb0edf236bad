"""A decoder-only language model: pre-norm RMSNorm, rotary positions, SwiGLU or GELU MLP.

One file, one model, the shape of every tensor in a comment. B = batch, T = sequence length,
D = d_model, H = heads, Hk = key/value heads (grouped-query attention when Hk < H), E = head
dimension (D / H), F = MLP hidden width, V = vocabulary.

Named configurations (`CONFIGS`) are the shapes we train or plan for; `parameter_count` and
`flops_per_token` are exact closed forms, checked against the torch module in the tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

MlpKind = Literal["swiglu", "gelu"]


def _require(condition: bool, name: str, rule: str) -> None:
    if not condition:
        raise ValueError(f"{name} {rule}")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    name: str
    vocab_size: int
    num_layers: int
    d_model: int
    num_heads: int
    d_ff: int
    num_kv_heads: int | None = None  # None: as many as num_heads (multi-head attention)
    mlp: MlpKind = "swiglu"
    tie_embeddings: bool = True
    max_seq_len: int = 2048
    # 10,000: the base of Su et al. (2021, RoFormer) and of Llama 1/2; Llama 3 uses 500,000.
    rope_theta: float = 10_000.0
    # 1e-5: Llama's RMSNorm epsilon (Touvron et al. 2023, params.json).
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for field_name in ("vocab_size", "num_layers", "d_model", "num_heads", "d_ff", "max_seq_len"):
            _require(getattr(self, field_name) > 0, field_name, "must be positive")
        _require(self.d_model % self.num_heads == 0, "d_model", "must be divisible by num_heads")
        _require(self.head_dim % 2 == 0, "d_model", "must give an even head dimension (rotary pairs)")
        _require(self.kv_heads > 0 and self.num_heads % self.kv_heads == 0, "num_kv_heads", "must divide num_heads")
        _require(self.mlp in ("swiglu", "gelu"), "mlp", "must be 'swiglu' or 'gelu'")
        _require(self.rope_theta > 0 and self.norm_eps > 0, "rope_theta", "and norm_eps must be positive")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def kv_heads(self) -> int:
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    def with_vocab(self, vocab_size: int) -> "ModelConfig":
        return replace(self, vocab_size=vocab_size)


# GPT-NeoX-20B's 50,277 tokens padded to a multiple of 128, OLMo's `embedding_size` (Groeneveld
# et al. 2024): the vocabulary DataDecide's models use (Magnusson et al. 2025).
OLMO_VOCAB = 50_304

CONFIGS: dict[str, ModelConfig] = {
    cfg.name: cfg
    for cfg in (
        # Unit tests: runs in milliseconds.
        ModelConfig(name="micro", vocab_size=512, num_layers=2, d_model=32, num_heads=2, d_ff=96, max_seq_len=256),
        # The embedded default's proxy on CPU: ~1M parameters at a 2,048 vocabulary, the size the
        # fixture manifests name ("tiny", 1,000,000 parameters).
        ModelConfig(name="tiny", vocab_size=2048, num_layers=4, d_model=128, num_heads=4, d_ff=384, max_seq_len=512),
        # DataDecide's 150M shape (OLMo ladder: 12 layers, d_model 768, 12 heads, MLP ratio 8 with
        # SwiGLU = hidden 3,072 per half); tied embeddings -> 151,898,880 parameters at V = 50,304.
        ModelConfig(name="proxy-150m", vocab_size=OLMO_VOCAB, num_layers=12, d_model=768, num_heads=12, d_ff=3072),
        # OLMo-1B (Groeneveld et al. 2024, table 1): 16 layers, d 2048, 16 heads, hidden 8,192, tied.
        ModelConfig(name="olmo-1b", vocab_size=OLMO_VOCAB, num_layers=16, d_model=2048, num_heads=16, d_ff=8192),
        # Llama 3 8B / 70B (Dubey et al. 2024, table 3; params.json): GQA with 8 KV heads, untied.
        ModelConfig(name="llama3-8b", vocab_size=128_256, num_layers=32, d_model=4096, num_heads=32, num_kv_heads=8,
                    d_ff=14_336, tie_embeddings=False, max_seq_len=8192, rope_theta=500_000.0),
        ModelConfig(name="llama3-70b", vocab_size=128_256, num_layers=80, d_model=8192, num_heads=64, num_kv_heads=8,
                    d_ff=28_672, tie_embeddings=False, max_seq_len=8192, rope_theta=500_000.0),
    )
}


def config_by_name(name: str, *, vocab_size: int | None = None) -> ModelConfig:
    if name not in CONFIGS:
        raise ValueError(f"model config must be one of {sorted(CONFIGS)}")
    config = CONFIGS[name]
    return config if vocab_size is None else config.with_vocab(vocab_size)


# --- exact counts -------------------------------------------------------------------------------


def layer_parameter_count(config: ModelConfig) -> int:
    """One block: q, k, v, o projections + MLP + two RMSNorm gains; no biases anywhere."""
    d, kv = config.d_model, config.kv_heads * config.head_dim
    attention = d * d + 2 * d * kv + d * d
    mlp = (3 if config.mlp == "swiglu" else 2) * d * config.d_ff
    return attention + mlp + 2 * d


def parameter_count(config: ModelConfig, *, include_embedding: bool = True) -> int:
    """Exact trainable parameter count of `DecoderLM(config)`."""
    body = config.num_layers * layer_parameter_count(config) + config.d_model  # + final norm
    if not include_embedding:
        return body
    embeddings = config.vocab_size * config.d_model * (1 if config.tie_embeddings else 2)
    return body + embeddings


def matmul_parameter_count(config: ModelConfig) -> int:
    """Parameters that take part in a matrix multiply per token: every linear weight and the
    output head (counted once even when tied), not the embedding lookup nor the norm gains."""
    return config.num_layers * (layer_parameter_count(config) - 2 * config.d_model) + config.vocab_size * config.d_model


def flops_per_token(config: ModelConfig, sequence_length: int) -> int:
    """Training FLOPs per token: 6 N + 12 L D T.

    6 N: a multiply-add per matmul parameter forward (2 N) and twice that backward (4 N), Kaplan
    et al. (2020, section 2.1). 12 L D T: attention scores and values with full (not causally
    halved) context T, PaLM (Chowdhery et al. 2022, appendix B), the convention MFU is quoted in.
    """
    _require(sequence_length > 0, "sequence_length", "must be positive")
    return 6 * matmul_parameter_count(config) + 12 * config.num_layers * config.d_model * sequence_length


# --- the module ---------------------------------------------------------------------------------


def rotary_tables(head_dim: int, length: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables of shape (T, E/2) for rotary positions (Su et al. 2021)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))  # (E/2,)
    angles = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq)  # (T, E/2)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, H, T, E) rotated pairwise (even, odd) by position; cos/sin: (T, E/2)."""
    even, odd = x[..., 0::2].float(), x[..., 1::2].float()  # (B, H, T, E/2) each
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)  # (B, H, T, E/2, 2)
    return rotated.flatten(-2).type_as(x)  # (B, H, T, E)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.num_heads, self.kv_heads, self.head_dim = config.num_heads, config.kv_heads, config.head_dim
        self.q = nn.Linear(config.d_model, config.num_heads * config.head_dim, bias=False)
        self.k = nn.Linear(config.d_model, config.kv_heads * config.head_dim, bias=False)
        self.v = nn.Linear(config.d_model, config.kv_heads * config.head_dim, bias=False)
        self.o = nn.Linear(config.num_heads * config.head_dim, config.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape  # x: (B, T, D)
        # -1 heads, not H: under tensor parallelism each rank holds H / tp heads of q, k and v.
        q = self.q(x).view(b, t, -1, self.head_dim).transpose(1, 2)  # (B, H, T, E)
        k = self.k(x).view(b, t, -1, self.head_dim).transpose(1, 2)  # (B, Hk, T, E)
        v = self.v(x).view(b, t, -1, self.head_dim).transpose(1, 2)  # (B, Hk, T, E)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        # Fused causal attention (FlashAttention on GPU): the (T, T) scores are never stored.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.num_heads)
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
    """Pre-norm residual block: x + Attn(Norm(x)), then x + Mlp(Norm(x))."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attention_norm = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.attention = Attention(config)
        self.mlp_norm = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.mlp = Mlp(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)  # (B, T, D)
        return x + self.mlp(self.mlp_norm(x))  # (B, T, D)


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
        cos, sin = rotary_tables(config.head_dim, config.max_seq_len, config.rope_theta)
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

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (B, T) int64 -> logits (B, T, V)."""
        t = tokens.shape[1]
        if t > self.config.max_seq_len:
            raise ValueError("sequence_length exceeds the model's max_seq_len")
        x = self.embedding(tokens)  # (B, T, D)
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]  # (T, E/2)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.head(self.norm(x))  # (B, T, V)

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
