"""Chapter 04 in the frameworks: SDPA's backends and how to force one, the ``flash_attn`` package,
Hugging Face's ``attn_implementation``, and which GPUs run which kernel.

Sources (read, not run, except PyTorch's SDPA on CPU): PyTorch 2.13 ``torch.nn.attention``
(``sdpa_kernel``, ``SDPBackend``) and ``torch.backends.cuda`` (``enable_flash_sdp``,
``enable_mem_efficient_sdp``, ``enable_math_sdp``); Dao-AILab/flash-attention's README
(FlashAttention-2 needs Ampere, Ada or Hopper, i.e. sm80 and newer; Turing support "coming
soon" for 1.x only; FlashAttention-3 targets Hopper) and ``flash_attn/flash_attn_interface.py``;
Hugging Face Transformers' ``attn_implementation`` ("eager", "sdpa", "flash_attention_2",
"flash_attention_3", "flex_attention"); flash_attn 2.1's changelog (causal masks aligned to the
bottom-right corner when s_q != s_k). GPU generations from ``gpumem.memory.gpus``.
"""

import textwrap

from gpumem.memory import gpus

SWITCHES = [
    ("PyTorch SDPA", "F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True) picks a backend "
                     "itself: flash, memory-efficient, cuDNN or math on CUDA; on a CPU its own flash kernel or math"),
    ("force one", "with torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION): ... (a list allows several; "
                  "none viable raises 'No viable backend'); older code: torch.backends.cuda.enable_math_sdp(False)"),
    ("math backend", "matmul, softmax, matmul in PyTorch ops: keeps the s x s probabilities, like naive code"),
    ("memory-efficient", "Rabe & Staats / xFormers kernel: O(s) memory, fp32 too, any head dim up to its limit, "
                         "supports an additive attn_mask"),
    ("flash (CUDA)", "FlashAttention-2 inside PyTorch: fp16/bf16 only, head dim <= 256, sm80+ only (no flash "
                     "backend at all on older GPUs)"),
    ("cuDNN (CUDA)", "NVIDIA's cuDNN fused attention (SDPBackend.CUDNN_ATTENTION): recent GPUs, fp16/bf16"),
    ("flash_attn package", "pip install flash-attn (compiles CUDA); flash_attn_func(q, k, v, causal=True) takes "
                           "(b, s, heads, d) and GQA directly; returns softmax_lse when asked; from 2.1 its causal mask "
                           "is aligned bottom-right when s_q != s_k"),
    ("causal alignment", "SDPA's is_causal, this chapter's tiled kernel and the lab align top-left (query i sees "
                         "keys j <= i); for bottom-right in SDPA pass attn_mask="
                         "torch.nn.attention.bias.causal_lower_right(s_q, s_k)"),
    ("HF Transformers", "from_pretrained(..., attn_implementation='eager' | 'sdpa' | 'flash_attention_2' | "
                        "'flash_attention_3'); 'eager' materialises fp32 softmax probabilities plus a bf16 copy "
                        "(6 B a score, chapter 01), 'sdpa' is the default where it applies"),
    ("DeepSpeed / Megatron", "call the same kernels: Megatron-Core uses Transformer Engine's fused attention "
                             "(cuDNN or flash) with --attention-backend; DeepSpeed leaves attention to the model code"),
]


def frameworks_table() -> str:
    """How attention kernels are chosen in PyTorch, flash_attn, Hugging Face and the training stacks."""
    lines = []
    for name, how in SWITCHES:
        head = f"{name:22s}"
        lines += textwrap.wrap(how, 98, initial_indent=head, subsequent_indent=" " * 24,
                               break_on_hyphens=False, break_long_words=False)
    return "\n".join(lines)


def gpu_table() -> str:
    """Which of the course's GPUs run FlashAttention-2 (sm80 and newer) and bf16."""
    lines = [f"{'GPU':18s}{'FlashAttention-2':>18s}{'bf16':>6s}  what SDPA's fused path is there"]
    for g in gpus.REGISTRY.values():
        fused = ("flash (FA2), memory-efficient, cuDNN" if g.flash_attention_2
                 else "memory-efficient only (fp16 / fp32); no FA2 on Turing")
        lines.append(f"{g.label:18s}{'yes' if g.flash_attention_2 else 'no':>18s}"
                     f"{'yes' if g.bf16_flops else 'no':>6s}  {fused}")
    return "\n".join(lines)
