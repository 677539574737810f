"""FLOPs of a training step as PyTorch counts them, split into forward, recompute and backward.

``torch.utils.flop_counter.FlopCounterMode`` counts the FLOPs of every matmul and attention
kernel that runs inside it (pointwise ops count zero). Two additions make it useful here:

* the CPU flash-attention kernels (``_scaled_dot_product_flash_attention_for_cpu`` and its
  backward) are missing from PyTorch 2.13's registry, so a CPU run would count attention as
  free; :data:`CPU_ATTENTION` registers them with PyTorch's own formulas for the CUDA kernels
  (forward: QK^T and PV, 2 matmuls; backward: S recomputed, then dV, dP, dQ, dK, 5 matmuls;
  the causal half is not subtracted, as PyTorch does not for CUDA either);
* :class:`PhaseFlops` also files each operator under a key the caller computes at that moment
  (phase and layer, say), in the order operators run: the recompute trace.

It relies on ``FlopCounterMode._count_flops``, a private method (torch pinned to 2.13.0; a test
asserts it exists).
"""

from typing import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop, sdpa_flop

_aten = torch.ops.aten
# the registry's functions are already shape-wrapped; custom_mapping wraps again, so pass the raw ones
CPU_ATTENTION = {_aten._scaled_dot_product_flash_attention_for_cpu: sdpa_flop.__wrapped__,
                 _aten._scaled_dot_product_flash_attention_for_cpu_backward: sdpa_backward_flop.__wrapped__}


# (query, key, value) positions of the fused attention kernels; grouped-query attention passes K
# and V with fewer heads than Q. PyTorch 2.13's formulas count that (h_q heads of work); 2.11's
# assert equal heads, so on a GPU with an older torch (Colab's, say) a GQA model failed to count.
_FWD = (0, 1, 2)
_BWD = (1, 2, 3)                                   # after grad_out
_GQA = {_aten._scaled_dot_product_flash_attention: _FWD, _aten._scaled_dot_product_efficient_attention: _FWD,
        _aten._scaled_dot_product_cudnn_attention: _FWD, _aten._scaled_dot_product_flash_attention_for_cpu: _FWD,
        _aten._scaled_dot_product_flash_attention_backward: _BWD,
        _aten._scaled_dot_product_efficient_attention_backward: _BWD,
        _aten._scaled_dot_product_cudnn_attention_backward: _BWD,
        _aten._scaled_dot_product_flash_attention_for_cpu_backward: _BWD}


def gqa_as_heads(func_packet, args: tuple) -> tuple:
    """``args`` with K's and V's shapes widened to Q's head count when they have fewer (the
    kernel does h_q heads of work either way); shapes, not tensors: the formulas read only
    ``.shape``, and nothing is allocated inside a memory trace."""
    where = _GQA.get(func_packet)
    if where is None:
        return args
    q, k, v = (args[i] for i in where)
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)) or k.shape[1] == q.shape[1]:
        return args
    args = list(args)
    for i, t in zip(where[1:], (k, v)):
        args[i] = torch.Size([t.shape[0], q.shape[1], t.shape[2], t.shape[3]])
    return tuple(args)


class _Global:
    """Stands in for FlopCounterMode's module tracker: every FLOP is filed under "Global" only.
    The tracker's hooks would keep re-run tensors alive (and distort a memory trace running at
    the same time); the phases and parts come from ``where()`` instead."""
    parents = ("Global",)

    def __enter__(self):
        return self

    def __exit__(self, *args):
        return False


class PhaseFlops(FlopCounterMode):
    """FlopCounterMode that also keeps, in execution order, runs of operators with the same key.

    ``where()`` is called for every operator and returns a hashable key (e.g. ``("recompute",
    "L3")``); :attr:`runs` is a list of ``[key, operators, flops]`` with consecutive equal keys
    merged, and :attr:`by_key` the FLOPs per key over the whole run.
    """

    def __init__(self, where: Callable[[], object] = lambda: None):
        super().__init__(display=False, custom_mapping=CPU_ATTENTION)
        self.mod_tracker = _Global()
        self.where = where
        self.runs: list[list] = []
        self.by_key: dict = {}

    def _count_flops(self, func_packet, out, args, kwargs):
        flops = 0
        if func_packet in self.flop_registry:
            flops = self.flop_registry[func_packet](*gqa_as_heads(func_packet, args), **kwargs, out_val=out)
            self.flop_counts["Global"][func_packet] += flops
        key = self.where()
        if self.runs and self.runs[-1][0] == key:
            self.runs[-1][1] += 1
            self.runs[-1][2] += flops
        else:
            self.runs.append([key, 1, flops])
        self.by_key[key] = self.by_key.get(key, 0) + flops
        return out


def count(fn: Callable[[], object], where: Callable[[], object] = lambda: None) -> PhaseFlops:
    """Run ``fn()`` under a :class:`PhaseFlops` and return the counter."""
    counter = PhaseFlops(where)
    with counter:
        fn()
    return counter
