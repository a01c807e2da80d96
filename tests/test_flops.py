"""Model FLOPs per token against torch's own count (FlopCounterMode) of a real forward and
backward pass, on three shapes: tied and untied output projections, and grouped-query
attention with Llama-style config names. Attention runs on SDPA's math kernel, whose
matmuls FlopCounterMode sees (the CPU flash kernel has no FLOP formula in torch).

FlopCounterMode counts matmuls only; layer norms, softmax and the embedding lookup are
left out of both counts, as the PaLM convention leaves them out.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.parallel import DistributedDataParallel
from torch.utils.flop_counter import FlopCounterMode

from burnrate.trainer.flops import model_flops_per_token, palm_flops_per_token
from burnrate.trainer.model import GPT, GPTConfig

BATCH, SEQ = 2, 64


@dataclass
class LlamaConfig:
    """The names Hugging Face's Llama config uses."""

    vocab_size: int = 320
    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    intermediate_size: int = 344


class GqaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.hidden_size // cfg.num_attention_heads
        self.q = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)
        self.kv = nn.Linear(cfg.hidden_size, 2 * self.kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, t, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class GqaBlock(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.RMSNorm(cfg.hidden_size), nn.RMSNorm(cfg.hidden_size)
        self.attn = GqaAttention(cfg)
        self.up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        gate, up = self.up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(GqaBlock(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def gpt(tied: bool) -> GPT:
    model = GPT(GPTConfig(vocab_size=320, block_size=SEQ, n_layer=2, n_head=4, n_embd=128))
    if not tied:
        model.lm_head.weight = nn.Parameter(model.wte.weight.detach().clone())
    return model


def counted_flops_per_token(model: nn.Module, vocab: int) -> float:
    idx = torch.randint(0, vocab, (BATCH, SEQ))
    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH), counter:
        out = model(idx, idx)
        loss = out[1] if isinstance(out, tuple) else out
        loss.backward()
    return counter.get_total_flops() / (BATCH * SEQ)


@pytest.mark.parametrize("shape", ["tied", "untied", "gqa"])
def test_flops_per_token_match_what_torch_counts(shape):
    torch.manual_seed(0)
    model = Llama(LlamaConfig()) if shape == "gqa" else gpt(tied=shape == "tied")
    counted = counted_flops_per_token(model, 320)
    ours = model_flops_per_token(model, SEQ)
    assert ours == pytest.approx(counted, rel=0.03)


def test_the_formula_differs_from_torchs_count_by_the_norm_gains_alone():
    """Exactly: the formula charges the norm gains (part of N) 6 FLOPs each per token, but
    they are elementwise and FlopCounterMode counts no elementwise work. Everything else,
    the tied output layer and attention (12·L·H·Q·T: QKᵀ and AV, forward and backward, no
    discount for the causal mask), is counted alike on both sides."""
    model = gpt(tied=True)
    norm_gains = sum(p.numel() for name, p in model.named_parameters() if "ln" in name)
    assert counted_flops_per_token(model, 320) == model_flops_per_token(model, SEQ) - 6 * norm_gains
    cfg = model.config
    n = model.num_params() + cfg.vocab_size * cfg.n_embd     # the output layer is a matmul, tied or not
    assert model_flops_per_token(model, SEQ) == palm_flops_per_token(n, cfg.n_layer, cfg.n_head, cfg.head_dim, SEQ)


def test_the_output_projection_counts_whether_tied_or_not():
    tied, untied = gpt(tied=True), gpt(tied=False)
    assert model_flops_per_token(tied, SEQ) == model_flops_per_token(untied, SEQ)


def test_gpt2_124m_counts_as_nanogpt_does():
    """nanoGPT's and torchtitan's figure for GPT-2 124M at T=1024: 6·N + 12·L·H·Q·T with N
    every parameter but the position table, ~855 MFLOP per token (with a vocabulary of
    50304)."""
    from burnrate.trainer.model import MODELS

    model = GPT(MODELS["gpt2-124m"])
    n = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    assert model_flops_per_token(model, 1024) == 6 * n + 12 * 12 * 12 * 64 * 1024
    assert model_flops_per_token(model, 1024) == pytest.approx(855e6, rel=0.001)


def test_wrappers_are_looked_through(tmp_path):
    model = gpt(tied=True)
    plain = model_flops_per_token(model, SEQ)
    assert model_flops_per_token(torch.compile(model), SEQ) == plain   # compiles only when called
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1)
    try:
        wrapped = DistributedDataParallel(model)
        assert model_flops_per_token(wrapped, SEQ) == plain
        assert model_flops_per_token(torch.compile(wrapped), SEQ) == plain
    finally:
        dist.destroy_process_group()
