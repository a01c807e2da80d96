"""Model FLOPs per token against torch's own count (FlopCounterMode) of a real forward and
backward pass: tied and untied output projections, grouped-query attention with
Llama-style config names, Hugging Face's GPT-2 (biases and LayerNorm biases included) and
a model held inside another module without a config of its own, as a LightningModule holds
it. Attention runs on SDPA's math kernel, whose matmuls FlopCounterMode sees (the CPU
flash kernel has no FLOP formula in torch).

FlopCounterMode counts matmuls only; norms, biases, softmax and the embedding lookup are
left out of both counts, as the PaLM convention leaves them out, so the two agree exactly.
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


class Held(nn.Module):
    """Hugging Face's GPT-2 inside a module with no `config` of its own, as a
    LightningModule holds a model."""

    def __init__(self) -> None:
        super().__init__()
        transformers = pytest.importorskip("transformers")
        config = transformers.GPT2Config(vocab_size=320, n_positions=SEQ, n_embd=128, n_layer=2, n_head=4)
        self.model = transformers.GPT2LMHeadModel(config)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=idx, labels=targets).loss


def counted_flops_per_token(model: nn.Module, vocab: int, seq: int = SEQ) -> float:
    """torch's count of the matmul FLOPs in one forward and backward pass, per token."""
    idx = torch.randint(0, vocab, (BATCH, seq))
    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH), counter:
        out = model(idx, idx)
        loss = out[1] if isinstance(out, tuple) else out
        loss.backward()
    return counter.get_total_flops() / (BATCH * seq)


@pytest.mark.parametrize("shape", ["tied", "untied", "gqa", "held-hf-gpt2"])
def test_flops_per_token_are_the_matmuls_torch_counts(shape):
    torch.manual_seed(0)
    model = {"gqa": Llama(LlamaConfig()), "held-hf-gpt2": Held()}.get(shape) or gpt(tied=shape == "tied")
    counted = counted_flops_per_token(model, 320)
    ours = model_flops_per_token(model, SEQ)
    assert ours == pytest.approx(counted, rel=1e-9)


def test_n_is_the_matmul_weights_alone():
    """N holds every weight a matmul uses, the tied output layer included, and no norm gain
    or bias: they are elementwise, and FlopCounterMode counts no elementwise work."""
    model = Held()
    inner = model.model
    cfg = inner.config
    vectors = sum(p.numel() for p in inner.parameters() if p.dim() == 1)
    assert vectors > 0     # LayerNorm gains and biases, and the linear layers' biases
    tables = inner.transformer.wte.weight.numel() + inner.transformer.wpe.weight.numel()
    n = sum(p.numel() for p in inner.parameters()) - vectors - tables + cfg.vocab_size * cfg.n_embd
    head_dim = cfg.n_embd // cfg.n_head
    assert model_flops_per_token(model, SEQ) == palm_flops_per_token(n, cfg.n_layer, cfg.n_head, head_dim, SEQ)
    assert model_flops_per_token(model, SEQ) == model_flops_per_token(inner, SEQ)


def test_the_output_projection_counts_whether_tied_or_not():
    tied, untied = gpt(tied=True), gpt(tied=False)
    assert model_flops_per_token(tied, SEQ) == model_flops_per_token(untied, SEQ)


def test_gpt2_124m_counts_as_nanogpt_does():
    """nanoGPT's and torchtitan's figure for GPT-2 124M at T=1024, ~855 MFLOP per token
    (with a vocabulary of 50304): 6·N + 12·L·H·Q·T with N every parameter but the position
    table; they also count the 19,200 LayerNorm gains in N, 0.01 % of the figure."""
    from burnrate.trainer.model import MODELS

    model = GPT(MODELS["gpt2-124m"])
    gains = sum(p.numel() for p in model.parameters() if p.dim() == 1)
    n = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    assert model_flops_per_token(model, 1024) == 6 * (n - gains) + 12 * 12 * 12 * 64 * 1024
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
