"""Attention's memory measured on real CPU tensors: naive, PyTorch's SDPA and the tiled kernel.

For one forward and backward of the attention core alone (q, k, v made beforehand, as a layer's
projections would), :func:`measure` reports

* ``peak_forward`` / ``peak_backward``: the most bytes alive at any moment of each pass, counting
  every tensor the call made (the tracker of ``gpumem.memory.tracing``, PyTorch's ``MemTracker``,
  which sees each tensor an operator returns; the inputs and the output's gradient are held
  before the call and not counted);
* ``saved``: what autograd keeps for backward, read independently of that tracker with
  ``torch.autograd.graph.saved_tensors_hooks`` (every tensor packed by a node, deduplicated by
  storage), split into the inputs q, k, v and what the forward made;
* the SDPA backend that ran, read from the ATen operator that executed
  (:func:`backend_of`), and wall time of an untracked run (:func:`wall_seconds`).

A tracker of returned tensors cannot see scratch memory a fused kernel allocates and frees inside
itself: PyTorch's CPU flash kernel keeps one fp32 buffer per thread of a few blocks
(:func:`cpu_flash_scratch_bytes`, about 578 KiB per thread at head dim 64 once s >= 768),
constant in s. :func:`cuda_backends` is the GPU path, with ``torch.cuda.max_memory_allocated``.
"""

import contextlib
import os
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

from ..errors import one_of, positive_int
from . import tracing
from .flash_tiled import tiled_attention
from .llama import repeat_kv

METHODS = ("naive", "sdpa", "tiled")
# ATen operator -> the SDPA backend it belongs to
BACKEND_OPS = {"_scaled_dot_product_flash_attention_for_cpu": "flash (CPU kernel)",
               "_scaled_dot_product_flash_attention": "flash",
               "_scaled_dot_product_efficient_attention": "memory-efficient",
               "_scaled_dot_product_cudnn_attention": "cuDNN",
               "_scaled_dot_product_attention_math": "math"}


def cpu_flash_scratch_bytes(seq: int, head_dim: int) -> int:
    """Bytes of the per-thread scratch buffer of PyTorch's CPU flash kernel (forward), invisible to
    the tracker: fp32 scores of one q_split x kv_split tile, the row max and sum, and a q_split x d
    output accumulator. Split sizes as in ATen's ``cpu/FlashAttentionKernel.cpp``: q_split 256
    rows from s >= 768 (64 from 192, else 32), kv_split 512 keys, each capped at s."""
    seq, head_dim = positive_int(seq, "sequence length"), positive_int(head_dim, "head dim")
    q_split = min(seq, 256 if seq >= 768 else 64 if seq >= 192 else 32)
    kv_split = min(seq, 512)
    return 4 * (q_split * kv_split + 2 * q_split + q_split * head_dim)


def naive_attention(q, k, v, causal: bool = False):
    """softmax(q k^T / sqrt(d)) v with the scores and probabilities materialised (b, a, s, s);
    K and V copied to every query head for GQA, as from-scratch code does."""
    n_rep = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)                   # (b, a, s_k, d)
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5          # (b, a, s_q, s_k)
    if causal:
        future = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return scores.softmax(dim=-1) @ v                                 # (b, a, s_q, d)


def sdpa_attention(q, k, v, causal: bool = False):
    """PyTorch's ``scaled_dot_product_attention``, whichever backend it picks here."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=k.shape[1] != q.shape[1])


def run(method: str, q, k, v, causal: bool = False, block: int = 256, block_q: int | None = None):
    """The output of ``method`` (naive, sdpa or tiled) on q (b, a, s, d), k, v (b, kv, s, d);
    tiled uses key blocks of ``block`` and query blocks of ``block_q`` (None: all rows at once)."""
    one_of(method, METHODS, "attention method")
    if method == "tiled":
        return tiled_attention(q, k, v, causal, block, block_q=block_q)
    return (naive_attention if method == "naive" else sdpa_attention)(q, k, v, causal)


class _Ops(TorchDispatchMode):
    """Records the name of every ATen operator that runs."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def backend_of(fn, *args) -> str:
    """Which SDPA backend ``fn(*args)`` ran, read from the operator that executed."""
    with _Ops() as rec:
        fn(*args)
    found = [BACKEND_OPS[op] for op in rec.ops if op in BACKEND_OPS]
    if found:
        return found[0]
    return "math (decomposed: bmm, softmax, bmm)" if "_safe_softmax" in rec.ops or "bmm" in rec.ops else "none"


def inputs(seq: int, heads: int = 2, kv_heads: int | None = None, head_dim: int = 64, batch: int = 1,
           dtype=torch.float32, seed: int = 0, s_k: int | None = None, device: str = "cpu"):
    """q (b, a, s, d), k, v (b, kv, s_k, d) needing gradients, and an output gradient, seeded."""
    kv_heads = kv_heads or heads
    g = torch.Generator(device=device).manual_seed(seed)
    s_k = s_k or seq

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype, device=device)
    q, k, v = rand(batch, heads, seq, head_dim), rand(batch, kv_heads, s_k, head_dim), rand(batch, kv_heads, s_k, head_dim)
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), rand(batch, heads, seq, head_dim)


class SavedTensors:
    """``saved_tensors_hooks`` that record every tensor autograd packs, deduplicated by storage."""

    def __init__(self):
        self.packed: list[torch.Tensor] = []
        self.storages: dict[int, int] = {}      # data pointer -> bytes of its storage

    def _pack(self, t):
        self.packed.append(t)
        st = t.untyped_storage()
        self.storages[st.data_ptr()] = st.nbytes()
        return t

    def hooks(self):
        """The context manager to run the forward in."""
        return torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def bytes(self, exclude=()) -> int:
        """Bytes of the distinct storages saved, leaving out those of ``exclude`` (the inputs)."""
        skip = {t.untyped_storage().data_ptr() for t in exclude}
        return sum(n for ptr, n in self.storages.items() if ptr not in skip)


class _Peaks(tracing.PeakTracker):
    """The course's tracker, with the bytes alive now and a peak that can be restarted."""

    def held(self) -> int:
        return sum(d.get("Total", 0) for d in self.get_tracker_snapshot("current").values())

    def restart_peak(self) -> None:
        self.total = (self.held(), tracing.Moment("", ""), {})


def measure(method: str, seq: int, heads: int = 2, kv_heads: int | None = None, head_dim: int = 64,
            batch: int = 1, causal: bool = False, block: int = 256, block_q: int | None = None,
            dtype=torch.float32, seed: int = 0) -> dict:
    """One forward and backward of ``method`` at ``seq`` on the CPU: peaks, saved bytes, shapes."""
    one_of(method, METHODS, "attention method")
    seq, heads, head_dim = (positive_int(seq, "sequence length"), positive_int(heads, "heads"),
                            positive_int(head_dim, "head dim"))
    q, k, v, dout = inputs(seq, heads, kv_heads, head_dim, batch, dtype, seed)
    held = [q, k, v, dout]
    before = sum(t.untyped_storage().nbytes() for t in held)
    saved = SavedTensors()
    tracker = _Peaks()
    with tracker:
        for t in held:                        # counted from the start, so that views of them are not new
            tracker.retag(t, "params")
        with saved.hooks():
            out = run(method, q, k, v, causal, block, block_q)
        peak_fwd, after_fwd = tracker.total[0] - before, tracker.held() - before
        tracker.restart_peak()
        out.backward(dout)
        peak_bwd = tracker.total[0] - before
    return {"method": method, "seq": seq, "heads": heads, "kv_heads": kv_heads or heads, "head_dim": head_dim,
            "batch": batch, "causal": causal, "dtype": str(dtype).removeprefix("torch."),
            "block": block if method == "tiled" else None, "block_q": block_q if method == "tiled" else None,
            "inputs_bytes": before,
            "peak_forward": peak_fwd, "held_after_forward": after_fwd, "peak_backward": peak_bwd,
            "saved": saved.bytes(), "saved_made": saved.bytes(exclude=(q, k, v)),
            "saved_tensors": [[list(t.shape), str(t.dtype).removeprefix("torch.")] for t in saved.packed]}


def sweep(seqs=(256, 512, 1024, 2048, 4096, 8192), methods=METHODS, progress: bool = False, **kwargs) -> list[dict]:
    """:func:`measure` for every method at every sequence length (a tqdm bar when ``progress``)."""
    from tqdm.auto import tqdm
    jobs = [(m, s) for s in seqs for m in methods]
    quiet = not progress or bool(os.environ.get("TQDM_DISABLE"))   # tqdm.notebook ignores the variable
    bar = {"disable": True} if quiet else {"leave": False}
    return [measure(m, s, **kwargs) for m, s in tqdm(jobs, desc="attention", **bar)]


def max_difference(seq: int = 1000, heads: int = 4, kv_heads: int = 2, head_dim: int = 64, causal: bool = True,
                   block: int = 128, block_q: int | None = 128, dtype=torch.float32, seed: int = 1) -> dict:
    """Largest |tiled - SDPA| of the output and of each gradient on one case."""
    q, k, v, dout = inputs(seq, heads, kv_heads, head_dim, 1, dtype, seed)
    res = {}
    for name in ("tiled", "sdpa"):
        out = run(name, q, k, v, causal, block, block_q)
        res[name] = (out, *torch.autograd.grad(out, (q, k, v), dout))
    return {key: float((a.detach().double() - b.detach().double()).abs().max())
            for key, a, b in zip(("out", "dq", "dk", "dv"), res["tiled"], res["sdpa"])}


def wall_seconds(method: str, seq: int, repeats: int = 1, **kwargs) -> dict:
    """Seconds of the forward and of the backward, untracked (best of ``repeats``)."""
    causal, block, block_q = kwargs.pop("causal", False), kwargs.pop("block", 256), kwargs.pop("block_q", None)
    best = {"forward": float("inf"), "backward": float("inf")}
    for _ in range(repeats):
        q, k, v, dout = inputs(seq, **kwargs)
        t0 = time.perf_counter()
        out = run(method, q, k, v, causal, block, block_q)
        t1 = time.perf_counter()
        out.backward(dout)
        t2 = time.perf_counter()
        best = {"forward": min(best["forward"], t1 - t0), "backward": min(best["backward"], t2 - t1)}
    return best


CUDA_BACKENDS = {"math": SDPBackend.MATH, "memory-efficient": SDPBackend.EFFICIENT_ATTENTION,
                 "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


def cuda_backends(seq: int = 8192, heads: int = 16, head_dim: int = 128, batch: int = 1,
                  dtype=torch.bfloat16, causal: bool = True, repeats: int = 3) -> dict:
    """Each SDPA backend forced on the CUDA device: peak bytes above the inputs
    (``torch.cuda.max_memory_allocated``) and seconds per forward + backward (best of ``repeats``).
    A backend the GPU or dtype cannot run reports its error instead."""
    if not torch.cuda.is_available():
        raise RuntimeError("cuda_backends needs a CUDA GPU")
    out = {"device": torch.cuda.get_device_name(), "seq": seq, "heads": heads, "head_dim": head_dim,
           "dtype": str(dtype).removeprefix("torch."), "backends": {}}
    for name, backend in CUDA_BACKENDS.items():
        q, k, v, dout = inputs(seq, heads, None, head_dim, batch, dtype, 0, device="cuda")
        try:
            with sdpa_kernel(backend):
                torch.cuda.synchronize()
                held = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                best = float("inf")
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(dout)
                    torch.cuda.synchronize()
                    best = min(best, time.perf_counter() - t0)
                    q.grad = k.grad = v.grad = None
                peak = torch.cuda.max_memory_allocated() - held
            out["backends"][name] = {"peak_above_inputs": peak, "seconds": best}
        except RuntimeError as err:
            out["backends"][name] = {"error": str(err).splitlines()[0]}
        del q, k, v, dout
        torch.cuda.empty_cache()
    return out


@contextlib.contextmanager
def forced(backend: str):
    """``sdpa_kernel`` for a backend named as in :data:`CUDA_BACKENDS` (for the notebook)."""
    with sdpa_kernel(CUDA_BACKENDS[one_of(backend, tuple(CUDA_BACKENDS), "SDPA backend")]):
        yield
