"""Model FLOPs per token (the MFU numerator) and peak FLOP/s by device (the denominator).

Model FLOPs follow PaLM (Chowdhery et al. 2022, appendix B): per token, 6·N for the
forward and backward matmuls over the N weights they use (the output projection
included, tied to the token embedding or not), plus 12·L·H·Q·T for
attention scores and values (L layers, H heads, Q head size, T sequence length).
Recomputation is not counted: MFU, unlike hardware FLOPs utilization, credits only the
work the model needs.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

# torch is imported where a model or a GPU is at hand, so the monitor works in a loop
# (and an image) without it.
if TYPE_CHECKING:
    import torch
    import torch.nn as nn

# Dense bf16 tensor-core peaks (no 2:4 sparsity), FLOP/s, from NVIDIA's datasheets.
# Matched by substring against torch.cuda.get_device_name(), most specific first.
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("GH200", 989e12),
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),   # SXM5
    ("H800", 989e12),
    ("B200", 2250e12),
    ("B100", 1750e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("A10G", 70e12),
    ("A10", 125e12),
    ("RTX 4090", 165e12),
    ("RTX 3090", 71e12),
    ("V100", 125e12),   # fp16 tensor cores: V100 has no bf16
    ("T4", 65e12),      # fp16 tensor cores
)

# A rough fp32 figure per CPU thread (two 8-lane FMA units at ~3 GHz), so that a CPU run
# still reports an MFU; it is labelled `cpu-estimate` wherever it is used and should be
# overridden for real measurements.
CPU_PEAK_FLOPS_PER_THREAD = 100e9


def palm_flops_per_token(n_params: int, n_layer: int, n_head: int, head_dim: int, seq_len: int) -> float:
    """Training FLOPs per token: 6·N + 12·L·H·Q·T, N the weights matmuls use."""
    return 6.0 * n_params + 12.0 * n_layer * n_head * head_dim * seq_len


def model_flops_per_token(model: nn.Module, seq_len: int) -> float:
    """PaLM FLOPs per token for any module: the matmuls of a forward and backward pass
    (nanoGPT and torchtitan count the same, plus the norm gains). torch's FlopCounterMode
    counts these too, and also what flash attention computes again in its backward pass,
    which MFU does not credit (2.2% more for GPT-2 124M on an H200, bench/RESULTS.md).

    N is every weight a matmul uses: the parameters of two or more dimensions but the
    `nn.Embedding` tables, which are looked up rather than multiplied, plus the output
    projection when it shares the token embedding's weight (tied, it is still a matmul
    over the vocabulary). Norm gains and biases are vectors, applied elementwise, so they
    are not in N. The attention term needs the sizes, read from the model's config (its
    own `config`, or the first submodule's that has one, as a LightningModule holding a
    Hugging Face model does) with nanoGPT / GPT-2 names (n_layer, n_head, n_embd) or
    Llama-style ones (num_hidden_layers, num_attention_heads, hidden_size, head_dim); it
    counts query heads, so grouped-query attention is counted as it computes. Without a
    config only 6·N is counted. DDP, FSDP and torch.compile wrappers are looked through.
    """
    import torch.nn as nn

    model = unwrap(model)
    embedding = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters(recurse=False)}
    n = sum(p.numel() for p in model.parameters() if p.dim() >= 2 and id(p) not in embedding)
    # A tied output projection: parameters() yields the shared tensor once, as an embedding.
    n += sum(m.weight.numel() for m in model.modules()
             if not isinstance(m, nn.Embedding) and id(getattr(m, "weight", None)) in embedding)
    sizes = next(filter(None, (attention_sizes(getattr(m, "config", None)) for m in model.modules())), None)
    if sizes is None:
        return 6.0 * n
    return palm_flops_per_token(n, *sizes, seq_len)


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside DDP / FSDP (`.module`) and torch.compile (`._orig_mod`)."""
    while True:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if inner is None or inner is model:
            return model
        model = inner


def attention_sizes(cfg: object) -> tuple[int, int, int] | None:
    """(layers, query heads, head size) from a model config, or None."""
    if cfg is None:
        return None
    for layers, heads, width in (("n_layer", "n_head", "n_embd"),
                                 ("num_hidden_layers", "num_attention_heads", "hidden_size")):
        values = [getattr(cfg, a, None) for a in (layers, heads, width)]
        if all(isinstance(v, int) and v > 0 for v in values):
            head_dim = getattr(cfg, "head_dim", None)
            return values[0], values[1], head_dim if isinstance(head_dim, int) and head_dim > 0 else values[2] // values[1]
    return None


@dataclass(frozen=True)
class Peak:
    flops: float
    source: str   # "override", "table:<model>", "cpu-estimate", or "unknown-gpu"
    device: str


def peak_flops(device: torch.device | str, override: float | None = None) -> Peak:
    """The peak FLOP/s to divide by on `device`; `override` wins when given."""
    kind = device_type(device)
    if kind == "cuda":
        import torch

        name = torch.cuda.get_device_name(device)
        if override:
            return Peak(override, "override", name)
        for key, value in PEAK_BF16_FLOPS:
            if key in name:
                return Peak(value, f"table:{key}", name)
        # An unknown GPU gets no MFU rather than a made-up one.
        return Peak(0.0, "unknown-gpu", name)
    if override:
        return Peak(override, "override", kind)
    return Peak(CPU_PEAK_FLOPS_PER_THREAD * _cpu_threads(), "cpu-estimate", kind)


def device_type(device: torch.device | str) -> str:
    """"cuda" for torch.device("cuda:1") and for "cuda:1" alike."""
    return getattr(device, "type", None) or str(device).partition(":")[0]


def _cpu_threads() -> int:
    """torch's intra-op threads where torch is loaded (what its kernels use), else the CPUs
    this process may run on."""
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else len(os.sched_getaffinity(0))
