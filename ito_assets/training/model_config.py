"""The model's shape apart from its torch module (model.py): the named configurations
(`CONFIGS`) we train or plan for, and the exact closed-form parameter and FLOP counts of
`DecoderLM`, checked against the module in the tests. Free of torch, so the planner, the data
decision's economics and the code location read shapes without importing it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

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
    # Position interpolation (Chen et al. 2023): positions divided by this factor; 1 = none.
    rope_position_scale: float = 1.0
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
        _require(self.rope_position_scale >= 1, "rope_position_scale", "must be >= 1")

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
