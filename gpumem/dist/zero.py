"""ZeRO from scratch, with torch.distributed primitives only (arXiv:1910.02054).

Every parameter tensor of n elements is split into N shards of ceil(n / N) elements (the last
one padded), and rank r owns shard r. Per stage, what each rank keeps and what moves:

=======  ==================================  ==============================================
stage    each rank keeps                     per step it communicates
=======  ==================================  ==============================================
0 (DDP)  params, grads, AdamW m and v        all-reduce every gradient             (2 psi)
1        params, grads, m and v of its shard  reduce-scatter grads, all-gather params (2 psi)
2        params, grad shard, m, v shard       the same; full grads are freed        (2 psi)
3        param shard, grad shard, m, v shard  all-gather each module's params before its
                                              forward and again before its backward,
                                              reduce-scatter grads                  (3 psi)
=======  ==================================  ==============================================

fp32 throughout (recipe ``fp32``: 4 + 4 + 8 bytes per parameter), so a test can compare the
result with single-process ``torch.optim.AdamW`` at float32 tolerances. Each collective is
counted in :attr:`ZeroAdamW.comm` to measure the volume (psi = parameter count).
"""

import math
from collections import Counter

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..memory.optim import adamw_update


class CommLog:
    """Elements moved per rank by each kind of collective, in the ZeRO paper's units:
    all-reduce of n elements = 2n, reduce-scatter of n = n, all-gather to n = n."""

    def __init__(self):
        self.volume = Counter()
        self.calls = Counter()

    def add(self, kind: str, n: int) -> None:
        self.calls[kind] += 1
        self.volume[kind] += 2 * n if kind == "all_reduce" else n

    def total(self) -> int:
        return sum(self.volume.values())


def padded(t: torch.Tensor, world: int) -> torch.Tensor:
    """``t`` flattened and zero-padded to a multiple of ``world`` elements."""
    flat = t.reshape(-1)
    return F.pad(flat, (0, math.ceil(flat.numel() / world) * world - flat.numel()))


def my_shard(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard (a copy) of a whole tensor: ceil(n / N) elements, the last padded."""
    rank, world = dist.get_rank(), dist.get_world_size()
    c = math.ceil(t.numel() / world)
    return padded(t.detach(), world)[rank * c:(rank + 1) * c].clone()


def reduce_scatter_mean(grad: torch.Tensor, log: "CommLog | None" = None) -> torch.Tensor:
    """Sum ``grad`` over all ranks and keep this rank's shard of the mean."""
    world = dist.get_world_size()
    flat = padded(grad, world)
    out = torch.empty(flat.numel() // world, dtype=grad.dtype, device=grad.device)
    dist.reduce_scatter_tensor(out, flat)
    if log is not None:
        log.add("reduce_scatter", flat.numel())
    return out.div_(world)


def all_gather_full(shard: torch.Tensor, numel: int, shape, log: "CommLog | None" = None) -> torch.Tensor:
    """Every rank's shard, concatenated, unpadded and reshaped to the whole tensor."""
    full = torch.empty(shard.numel() * dist.get_world_size(), dtype=shard.dtype, device=shard.device)
    dist.all_gather_into_tensor(full, shard)
    if log is not None:
        log.add("all_gather", full.numel())
    return full[:numel].view(shape)


class ZeroAdamW:
    """AdamW sharded ZeRO-style over the default process group. Call ``step()`` after backward."""

    def __init__(self, model: nn.Module, stage: int, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=1e-2):
        assert stage in (0, 1, 2, 3)
        self.model, self.stage = model, stage
        self.lr, self.betas, self.eps, self.wd = lr, betas, eps, weight_decay
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.device = self.params[0].device
        self.comm = CommLog()
        self.t = 0
        self.numel = {p: p.numel() for p in self.params}
        self.shape = {p: p.shape for p in self.params}
        self.chunk = {p: math.ceil(p.numel() / self.world) for p in self.params}
        self.grad_shard: dict = {}
        if stage == 0:
            self.m = {p: torch.zeros_like(p) for p in self.params}
            self.v = {p: torch.zeros_like(p) for p in self.params}
            return
        self.m = {p: torch.zeros(self.chunk[p], device=self.device) for p in self.params}
        self.v = {p: torch.zeros(self.chunk[p], device=self.device) for p in self.params}
        if stage == 3:
            self.shard = {p: my_shard(p) for p in self.params}
            for p in self.params:
                self._release(p)
            self._install_hooks()

    # ---- shards ----------------------------------------------------------------------------
    def _all_gather(self, shard: torch.Tensor, n: int, shape) -> torch.Tensor:
        return all_gather_full(shard, n, shape, self.comm)

    def _reduce_scatter(self, grad: torch.Tensor) -> torch.Tensor:
        return reduce_scatter_mean(grad, self.comm)

    # ---- stage 3: gather before use, release after ------------------------------------------
    def _gather(self, p) -> None:
        if p.data.numel() == 0:
            p.data = self._all_gather(self.shard[p], self.numel[p], self.shape[p])

    def _gather_all(self, params) -> None:
        for p in params:
            self._gather(p)

    def _release_all(self, params) -> None:
        for p in params:
            self._release(p)

    @staticmethod
    def _release(p) -> None:
        p.data = torch.empty(0, dtype=p.dtype, device=p.device)

    def _install_hooks(self) -> None:
        for module in self.model.modules():
            own = list(module.parameters(recurse=False))
            if not own:
                continue
            # (hooks must return None: a returned value would replace the inputs or outputs)
            module.register_forward_pre_hook(lambda m, args, own=own: self._gather_all(own))
            module.register_forward_hook(lambda m, args, out, own=own: self._release_all(own))
            module.register_full_backward_pre_hook(lambda m, grad_out, own=own: self._gather_all(own))
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._grad_ready)

    def _grad_ready(self, p) -> None:
        """Stage 3: reduce-scatter a gradient as soon as it exists, then free it and the param."""
        self.grad_shard[p] = self._reduce_scatter(p.grad)
        p.grad = None
        self._release(p)

    # ---- the step -------------------------------------------------------------------------
    def _adamw(self, param, grad, m, v) -> None:
        adamw_update(param, grad, m, v, self.t, self.lr, self.betas, self.eps, self.wd)

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        for p in self.params:
            if self.stage == 0:
                dist.all_reduce(p.grad)
                self.comm.add("all_reduce", p.grad.numel())
                p.grad.div_(self.world)
                self._adamw(p, p.grad, self.m[p], self.v[p])
            elif self.stage == 3:
                self._adamw(self.shard[p], self.grad_shard[p], self.m[p], self.v[p])
            else:
                self.grad_shard[p] = self._reduce_scatter(p.grad)
                if self.stage == 2:
                    p.grad = None         # only the shard of the reduced gradient is kept
                mine = my_shard(p)
                self._adamw(mine, self.grad_shard[p], self.m[p], self.v[p])
                p.copy_(self._all_gather(mine, self.numel[p], self.shape[p]))
                if self.stage == 1:       # the full gradient stays; the reduced shard was temporary
                    del self.grad_shard[p]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        self.grad_shard.clear()

    def full_parameters(self) -> list[torch.Tensor]:
        """Every parameter, whole (gathered under stage 3), for comparing with a reference."""
        if self.stage < 3:
            return [p.detach().clone() for p in self.params]
        return [self._all_gather(self.shard[p], self.numel[p], self.shape[p]).clone() for p in self.params]

    def state_bytes(self) -> dict:
        """Bytes this rank holds now, measured on the tensors themselves."""
        nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts)
        params = nbytes(self.shard.values()) if self.stage == 3 else nbytes(self.params)
        grads = nbytes(self.grad_shard.values()) if self.stage >= 2 else \
            nbytes(p.grad for p in self.params if p.grad is not None)
        return {"params": params, "grads": grads, "optimizer": nbytes(self.m.values()) + nbytes(self.v.values())}
