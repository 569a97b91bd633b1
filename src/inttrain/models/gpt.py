"""gpt-small: a small decoder-only, character-level transformer.

Pre-LayerNorm GPT blocks. Every projection (fused QKV, attention output, both
MLP layers, LM head) is an ``nn.Linear`` so ``inttrain.prepare_`` moves all the
GEMMs onto the integer path; attention itself uses
``F.scaled_dot_product_attention`` (causal).

The LM head is *not* tied to the token embedding: swapping the head for an
integer layer would otherwise silently untie or alias the shared weight.

Benchmark config: d_model 512, 4 layers, 8 heads, seq_len 256, batch 16.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["GPTConfig", "GPT", "gpt_small"]


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 256  # bytes / characters
    seq_len: int = 256
    d_model: int = 512
    n_layers: int = 4
    n_heads: int = 8
    mlp_ratio: int = 4
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if min(self.vocab_size, self.seq_len, self.d_model, self.n_layers, self.n_heads, self.mlp_ratio) < 1:
            raise ValueError(f"gpt-small: all sizes must be >= 1, got {self}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"gpt-small: d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = cfg.dropout

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        # [B, T, D] -> [B, H, T, D/H]
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLPBlock(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model)
        self.proj = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLPBlock(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.mlp(self.ln2(x)))


class GPT(nn.Module):
    """Token ids [B, T] (T <= seq_len) -> next-token logits [B, T, vocab_size]."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init_weights)
        # GPT-2: scale the residual-stream output projections by 1/sqrt(2 * n_layers).
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / (2 * cfg.n_layers) ** 0.5)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx: Tensor) -> Tensor:
        t = idx.shape[1]
        if t > self.cfg.seq_len:
            raise ValueError(f"gpt-small: sequence length {t} exceeds seq_len {self.cfg.seq_len}")
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def gpt_small(
    vocab_size: int = 256,
    seq_len: int = 256,
    d_model: int = 512,
    n_layers: int = 4,
    n_heads: int = 8,
    **kwargs: object,
) -> GPT:
    """Build the benchmark gpt-small (defaults) or a resized variant."""
    return GPT(GPTConfig(vocab_size, seq_len, d_model, n_layers, n_heads, **kwargs))  # type: ignore[arg-type]
