"""Chapter 04's experiment, the same code for the notebook and ``python -m gpumem run attention``.

Per sequence length and method (naive, SDPA, tiled), one forward and backward of the attention
core on real CPU tensors (``gpumem.memory.attention_measure.measure``): peak bytes of each pass,
bytes saved for backward, and beside them chapter 01's formula for the saved bytes
(``gpumem.memory.activations.layer_terms``, the attention core's terms). Then the ratios when s
doubles, the SDPA backend that ran and why, and the tiled kernel's largest difference from SDPA.
With ``device="cuda"``: SDPA's math, memory-efficient, flash and cuDNN backends on the GPU.
``gqa_saved`` measures what each kernel keeps with grouped-query attention (fewer key/value heads).

Attention memory is per rank, so the experiment runs in one process whatever ``ranks`` says.
"""

import torch

from gpumem.errors import UsageError
from gpumem.memory import activations, attention_measure as am
from gpumem.memory.models import ModelConfig

from .options import DEFAULT_SEQS

WHY_CPU = ("On a CPU PyTorch has one fused kernel, _scaled_dot_product_flash_attention_for_cpu, and picks "
           "it whenever it applies: no dropout (any dropout_p > 0 selects math, in training or not) and no "
           "attention mask that needs a gradient. The memory-efficient and cuDNN kernels, and the CUDA "
           "flash kernel, exist only for CUDA devices; forcing them here raises 'No viable backend'. The "
           "math backend (plain matmul, softmax, matmul) runs when forced with "
           "sdpa_kernel(SDPBackend.MATH), or with dropout.")


def shape_config(heads: int, kv_heads: int, head_dim: int) -> ModelConfig:
    """A one-layer config with the measured attention's shape, for chapter 01's formula."""
    return ModelConfig(f"attention {heads}x{head_dim}", 1, heads * head_dim, heads, kv_heads, 1, 1)


def formula_saved(method: str, seq: int, heads: int, kv_heads: int, head_dim: int, causal: bool,
                  batch: int = 1, elem: int = 4) -> int:
    """Chapter 01's count of what the attention core saves: naive q, expanded k and v, the
    probabilities (and the causal mask); flash (SDPA, tiled) q, k, v, the output and the logsumexp."""
    terms = activations.layer_parts(shape_config(heads, kv_heads, head_dim), seq, batch,
                                    "naive" if method == "naive" else "flash", elem)
    keep = {"naive": ("q, expanded k and v", "probabilities") + (("causal mask (bool)",) if causal else ()),
            "flash": ("q, k, v", "output = W_o input", "logsumexp (fp32)")}["naive" if method == "naive" else "flash"]
    return sum(terms[k] for k in keep)


def ratios(rows: list[dict], key: str) -> dict[str, list[list]]:
    """Per method: [s, 2s, value(2s) / value(s)] for every doubling in the measured lengths."""
    out: dict[str, list] = {}
    by = {(r["method"], r["seq"]): r[key] for r in rows}
    for (method, s), value in by.items():
        if (method, 2 * s) in by and value:
            out.setdefault(method, []).append([s, 2 * s, by[(method, 2 * s)] / value])
    return out


def attention(ranks: int = 1, device: str = "cpu", progress: bool = True, model: str | None = None,
              seqs=DEFAULT_SEQS, heads: int = 2, kv_heads: int | None = None, head_dim: int = 64,
              block: int = 256, causal: bool = False, methods=am.METHODS) -> dict:
    """Measured bytes per sequence length and method, with the formula, ratios, backend and differences."""
    if model is not None:
        raise UsageError(f"run attention measures the attention core alone and takes no --model (got {model!r}); "
                         "accepted: --heads, --kv-heads, --head-dim, --seqs")
    kv_heads = kv_heads or heads
    if heads % kv_heads:
        raise UsageError(f"--kv-heads {kv_heads} must divide --heads {heads}; accepted: a divisor of {heads}")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("--device cuda needs a CUDA GPU; none is visible here (accepted: --device cpu)")
        return am.cuda_backends(seq=max(seqs), heads=heads, head_dim=head_dim, causal=causal)
    shape = dict(heads=heads, kv_heads=kv_heads, head_dim=head_dim, causal=causal, block=block)
    rows = am.sweep(seqs, methods, progress=progress, **shape)
    for r in rows:
        r["formula_saved"] = formula_saved(r["method"], r["seq"], heads, kv_heads, head_dim, causal)
    q, k, v, _ = am.inputs(min(seqs), heads, kv_heads, head_dim)
    diff_seq = min(max(seqs), 1000)
    return {"device": "cpu", "shape": shape | {"batch": 1, "dtype": "float32"}, "seqs": list(seqs),
            "methods": list(methods), "rows": rows,
            "ratios": {key: ratios(rows, key) for key in ("peak_forward", "peak_backward", "saved", "saved_made")},
            "sdpa_backend": am.backend_of(am.sdpa_attention, q, k, v), "why": WHY_CPU,
            "max_difference": am.max_difference(diff_seq, heads, kv_heads, head_dim, causal, min(block, 128))
            | {"seq": diff_seq, "dtype": "float32"}}


def _expanded_sdpa_saved(seq: int, heads: int, kv_heads: int, head_dim: int) -> dict:
    """What SDPA saves when K and V are first copied to every query head (``repeat_interleave``,
    as code written before ``enable_gqa`` does): bytes by storage and the saved shapes."""
    q, k, v, _ = am.inputs(seq, heads, kv_heads, head_dim)
    rep = heads // kv_heads
    saved = am.SavedTensors()
    with saved.hooks():
        torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1))
    return {"saved": saved.bytes(), "saved_tensors": [[list(t.shape), str(t.dtype).removeprefix("torch.")]
                                                      for t in saved.packed]}


def gqa_saved(seq: int = 1024, heads: int = 8, kv_heads: int = 2, head_dim: int = 64) -> dict:
    """Bytes saved for backward with grouped-query attention (``heads`` query heads over ``kv_heads``
    key/value heads, fp32, CPU), measured with saved-tensor hooks: SDPA with ``enable_gqa=True``,
    SDPA on K and V repeated to every query head, the tiled kernel and the naive one; beside each,
    chapter 01's formula and the number of heads the saved K and V carry."""
    if heads % kv_heads:
        raise UsageError(f"kv_heads {kv_heads} must divide heads {heads}; accepted: a divisor of {heads}")
    rows = {"sdpa, enable_gqa=True": (am.measure("sdpa", seq, heads, kv_heads, head_dim), "sdpa", kv_heads),
            f"sdpa, K and V repeated to {heads} heads": (_expanded_sdpa_saved(seq, heads, kv_heads, head_dim),
                                                         "sdpa", heads),
            "tiled (this chapter)": (am.measure("tiled", seq, heads, kv_heads, head_dim), "tiled", kv_heads),
            "naive (repeat_kv, matmuls)": (am.measure("naive", seq, heads, kv_heads, head_dim), "naive", kv_heads)}
    out = {}
    for name, (r, method, kv_formula) in rows.items():
        unexpanded = any(shape == [1, kv_heads, seq, head_dim] for shape, _ in r["saved_tensors"])
        out[name] = {"saved": r["saved"], "formula_saved": formula_saved(method, seq, heads, kv_formula, head_dim, False),
                     "kv_heads_saved": kv_heads if unexpanded else heads,
                     "saved_tensors": r["saved_tensors"]}
    return {"seq": seq, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "dtype": "float32", "rows": out}


GPU_SHAPE = dict(seq=8192, heads=16, head_dim=128)   # the GPU check's SDPA call: causal, bf16, batch 1


def gpu_reading(directory=None) -> str:
    """Each committed GPU run of SDPA's backends at :data:`GPU_SHAPE`: peak above the inputs and
    the FLOP rate of a forward + backward, counted as the chapter counts them (``attention_flops``:
    the math backend computes every score, the fused ones skip the causal tiles above the
    diagonal), as a share of the table's dense bf16 peak."""
    from gpumem.course import gpu_results
    from gpumem.memory import gpus
    from gpumem.memory.attention_flops import attention_flops
    lines = []
    for run, got in gpu_results.values("04", directory):
        gpu = gpus.of_device(run["gpu"])
        if gpu is None or f"ch04.sdpa_math_seconds_s{GPU_SHAPE['seq']}" not in got:
            continue
        lines.append(f"{run['gpu']} ({run['date']}): causal s {GPU_SHAPE['seq']:,}, {GPU_SHAPE['heads']} heads "
                     f"of {GPU_SHAPE['head_dim']}, bf16, forward + backward")
        for name in ("math", "memory_efficient", "flash", "cudnn"):
            key = f"ch04.sdpa_{name}_{{}}_s{GPU_SHAPE['seq']}"
            if key.format("seconds") not in got:
                continue
            f = attention_flops("naive" if name == "math" else "tiled", causal=True, **GPU_SHAPE)
            rate = (f["forward"] + f["backward"]) / got[key.format("seconds")]
            lines.append(f"  {name:16s} {got[key.format('peak_bytes')] / 1e9:6.2f} GB  "
                         f"{got[key.format('seconds')] * 1e3:6.2f} ms  {rate / 1e12:5.0f} TFLOP/s  "
                         f"{rate / gpu.bf16_flops:.0%} of {gpu.bf16_flops / 1e12:.0f}")
    return "\n".join(lines) or "no GPU run of chapter 04 is committed"
