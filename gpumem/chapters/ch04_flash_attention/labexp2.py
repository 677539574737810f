"""Lab 04's exp2 rule for the backward (parts 1 and 2): the probabilities are rebuilt the way
FlashAttention-2's kernels rebuild them, with exp2 and log2(e) folded into the softmax scale.

FlashAttention-2 never calls ``exp``: ``flash_api.cpp`` (``set_params_fprop``) sets
``params.scale_softmax_log2 = softmax_scale * M_LOG2E`` and ``softmax.h``'s ``scale_apply_exp2``
computes ``exp2f(S * scale_softmax_log2 - lse * M_LOG2E)``: one multiply-add per score before
exp2, which the GPU's special-function unit evaluates natively (Dao-AILab/flash-attention,
csrc/flash_attn/src; the backward, ``flash_bwd_kernel.h``, calls the same ``scale_apply_exp2``).
Since exp2(x log2 e) = exp(x), the numbers cannot tell the two apart; the ops can. Chapter 04's
``tiled_backward`` takes ``torch.exp`` of ``S * scale - lse``, so a copy of it, however renamed or
rewritten mechanically, fails here on its first exponential.

:class:`Exp2Rule` watches the ops :class:`.labguard.Watch` dispatches: the first exponential in
the natural base (``exp``, ``expm1``, a softmax or logsumexp, ``sigmoid``, ``pow`` of a base other
than 2) is named; an ``exp2`` (or ``pow(2, x)``) counts once some op of the call multiplied (or
divided) by the Python number scale * log2(e) (or by its inverse): the fold. ``wrong()`` says
which is missing, '' when both hold.
"""

import math

LOG2E = math.log2(math.e)
# exponentials in the natural base: what chapter 04's code (and a softmax) takes
_PLAIN = {"exp", "exp_", "expm1", "expm1_", "_softmax", "_log_softmax", "logsumexp", "sigmoid", "sigmoid_",
          "_safe_softmax"}
_FOLDS = {"mul", "mul_", "div", "div_", "baddbmm", "addmm", "addcmul", "addcmul_", "addbmm", "add", "sub",
          "add_", "sub_", "bmm", "mm"}
_RTOL = 1e-9                      # a Python float of scale * log2 e, however it was spelled


class Exp2Rule:
    """The exp2 rule for one call on head dimension ``d`` (scale 1/sqrt(d))."""

    def __init__(self, d: int):
        self.folded_scale = d ** -0.5 * LOG2E
        self.plain, self.exp2, self.folded = "", False, False

    def _is_fold(self, x) -> bool:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or x == 0:
            return False
        c = self.folded_scale
        return abs(x - c) <= _RTOL * c or abs(x * c - 1.0) <= _RTOL

    def note(self, op: str, args, kwargs) -> None:
        """Record one dispatched op (``op``: its name without namespace and overload)."""
        if op in ("pow", "pow_") and args and isinstance(args[0], (int, float)):
            if args[0] == 2:
                self.exp2 = True
            elif not self.plain:
                self.plain = f"pow({args[0]:g}, x)"
        elif op in ("exp2", "exp2_"):
            self.exp2 = True
        elif op in _PLAIN and not self.plain:
            self.plain = op.strip("_")
        if op in _FOLDS and any(self._is_fold(x) for x in (*args, *(kwargs or {}).values())):
            self.folded = True

    def wrong(self) -> str:
        """'' or the first part of the rule the call broke."""
        if self.plain:
            return (f"it rebuilt P with {self.plain}, the natural base, as chapter 04's backward does: "
                    f"FlashAttention-2's kernels take exp2 with log2(e) folded into the softmax scale "
                    f"(scale_softmax_log2 = scale * log2 e); use torch.exp2, no exp")
        if self.exp2 and not self.folded:
            return (f"it took exp2 but never multiplied by scale * log2(e) = {self.folded_scale:.6g} in one "
                    f"step: fold log2(e) into the softmax scale (one multiply of the scores), and scale the "
                    f"lse by log2(e)")
        return ""
