"""Mixed-precision AdamW with fp32 master weights, as ZeRO's recipe keeps them.

The model holds bf16 parameters and receives bf16 gradients; the optimizer keeps an fp32 master
copy of every parameter and fp32 Adam moments (4 + 4 + 4 = 12 bytes per parameter), updates the
master in fp32 and copies it back into the bf16 parameter. With ``fp32_grads=True`` the bf16
gradients are first converted into fp32 gradients that live until the end of the step, which is
DeepSpeed's accounting (18 bytes per parameter instead of 16).

The update is torch's AdamW (decoupled weight decay), written out for one tensor at a time; a
test checks it against ``torch.optim.AdamW`` on fp32 parameters.

Which AdamW a trace runs (:func:`make_optimizer`): the ``mixed`` recipes use this class, one
tensor at a time; ``pure-bf16`` and ``fp32`` use ``torch.optim.AdamW`` with the chosen code path:
``for-loop`` (``foreach=False``), ``foreach`` (``foreach=True``, torch's default on CUDA) or
``fused`` (``fused=True``). The paths differ only in workspace during ``step()``: the for-loop
allocates temporaries the size of one tensor at a time, foreach a full copy of ``exp_avg_sq``
(its ``_foreach_sqrt``) for every tensor at once, fused none.
"""

import math

import torch

from ..errors import UsageError, one_of
from .policies import ADAMW_IMPLS


def adamw_update(param, grad, m, v, t: int, lr, betas, eps, weight_decay) -> None:
    """One AdamW update in place, for one tensor (torch.optim.AdamW's math: decoupled weight
    decay, bias-corrected moments). ZeRO's sharded optimizer uses it too."""
    b1, b2 = betas
    param.mul_(1 - lr * weight_decay)
    m.lerp_(grad, 1 - b1)
    v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
    denom = (v.sqrt() / math.sqrt(1 - b2 ** t)).add_(eps)
    param.addcdiv_(m, denom, value=-lr / (1 - b1 ** t))


class MasterWeightAdamW(torch.optim.Optimizer):
    """AdamW for bf16 parameters that keeps fp32 master weights and moments (optionally fp32 grads)."""
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 fp32_grads: bool = False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.fp32_grads = fp32_grads
        self.on_fp32_grad = None   # a tracer may set a callback to categorise the fp32 grads

    def init_state(self) -> None:
        """Create master weights and moments now (a training loop would hold them already)."""
        for group in self.param_groups:
            for p in group["params"]:
                if not self.state[p]:
                    master = p.detach().to(torch.float32)
                    self.state[p] = {"step": 0, "master": master,
                                     "exp_avg": torch.zeros_like(master),
                                     "exp_avg_sq": torch.zeros_like(master)}

    @torch.no_grad()
    def step(self, closure=None):
        self.init_state()
        params = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
        grads32 = {}
        if self.fp32_grads:  # DeepSpeed-style: all fp32 grads exist before the update
            for p in params:
                grads32[p] = p.grad.to(torch.float32)
                p.grad = None
                if self.on_fp32_grad is not None:
                    self.on_fp32_grad(grads32[p])
        for group in self.param_groups:
            for p in group["params"]:
                if p not in grads32 and p.grad is None:
                    continue
                grad = grads32.pop(p) if self.fp32_grads else p.grad.to(torch.float32)
                st = self.state[p]
                st["step"] += 1
                master = st["master"]
                adamw_update(master, grad, st["exp_avg"], st["exp_avg_sq"], st["step"], group["lr"],
                             group["betas"], group["eps"], group["weight_decay"])
                p.copy_(master)
                del grad
        return None


def make_optimizer(model, recipe: str, adamw: str = "for-loop"):
    """AdamW for the recipe, with its states created (steady state, as in a training loop)."""
    one_of(adamw, ADAMW_IMPLS, "AdamW implementation")
    if recipe in ("mixed", "mixed-ds"):
        if adamw != "for-loop":
            raise UsageError(f"AdamW implementation {adamw!r} applies to the pure-bf16 and fp32 "
                             "recipes (torch.optim.AdamW); mixed and mixed-ds accept: for-loop")
        opt = MasterWeightAdamW(model.parameters(), fp32_grads=recipe == "mixed-ds")
        opt.init_state()
        return opt
    opt = torch.optim.AdamW(model.parameters(), foreach=adamw == "foreach", fused=adamw == "fused" or None)
    for p in model.parameters():          # one step on zero gradients creates torch's states
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return opt
