"""ZeRO from scratch, with torch.distributed primitives only (arXiv:1910.02054).

Every parameter tensor of n elements is split into N shards of ceil(n / N) elements (the last
one padded), and rank r owns shard r. Per stage, what each rank keeps and what moves:

=======  ==================================  ==============================================
stage    each rank keeps                     per step it communicates
=======  ==================================  ==============================================
0 (DDP)  params, grads, AdamW m and v        all-reduce every gradient             (2 psi)
1        params, grads, m and v of its shard  reduce-scatter grads after backward,
                                              all-gather params after the update    (2 psi)
2        params, grad shard, m, v shard       reduce-scatter each grad *during* backward,
                                              as soon as it is ready, and free it   (2 psi)
3        param shard, grad shard, m, v shard  all-gather each module's params before its
                                              forward and again before its backward,
                                              reduce-scatter grads during backward  (3 psi)
=======  ==================================  ==============================================

Stages 1 and 2 differ in when the gradient is reduced. Under stage 1 every full gradient exists
when backward ends and stays until ``zero_grad()`` (the reduced shard is a temporary of the
step); under stage 2 a gradient lives only until its bucket (``bucket_bytes``, 0 = each gradient
alone) is reduce-scattered, and only the shards remain. The difference that matters is the peak
during backward, which ``gradmeter.GradMeter`` measures.

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
from .gradmeter import weak_hook


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
    return reduce_scatter_coalesced([grad], log)[0]


def reduce_scatter_coalesced(grads: list[torch.Tensor],
                             log: "CommLog | None" = None) -> list[torch.Tensor]:
    """One reduce-scatter for a bucket of gradients: this rank's shard of each one's mean.

    Rank r must receive shard r of *every* gradient, so the send buffer is laid out rank-major:
    [shard 0 of g1, shard 0 of g2, ... | shard 1 of g1, shard 1 of g2, ... | ...]."""
    world = dist.get_world_size()
    chunks = [math.ceil(g.numel() / world) for g in grads]
    rows = [padded(g, world).view(world, c) for g, c in zip(grads, chunks)]
    flat = torch.cat(rows, dim=1).reshape(-1)
    out = torch.empty(sum(chunks), dtype=flat.dtype, device=flat.device)
    dist.reduce_scatter_single(out, flat)
    if log is not None:
        log.add("reduce_scatter", flat.numel())
    return list(out.div_(world).split(chunks))


def all_gather_full(shard: torch.Tensor, numel: int, shape,
                    log: "CommLog | None" = None) -> torch.Tensor:
    """Every rank's shard, concatenated, unpadded and reshaped to the whole tensor."""
    full = torch.empty(shard.numel() * dist.get_world_size(), dtype=shard.dtype,
                       device=shard.device)
    dist.all_gather_into_tensor(full, shard)
    if log is not None:
        log.add("all_gather", full.numel())
    return full[:numel].view(shape)


class ZeroAdamW:
    """AdamW sharded ZeRO-style over the default process group. Call ``step()`` after backward.

    ``bucket_bytes`` (stages 2 and 3): reduce-scatter ready gradients together once they add up
    to this many bytes (0: each gradient on its own, as soon as it is ready)."""

    def __init__(self, model: nn.Module, stage: int, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=1e-2, bucket_bytes: int = 0):
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
        self.bucket: list = []                  # stages 2-3: ready gradients not yet reduced
        self.bucket_bytes = bucket_bytes
        if stage == 0:
            self.m = {p: torch.zeros_like(p) for p in self.params}
            self.v = {p: torch.zeros_like(p) for p in self.params}
            return
        self.m = {p: torch.zeros(self.chunk[p], device=self.device) for p in self.params}
        self.v = {p: torch.zeros(self.chunk[p], device=self.device) for p in self.params}
        if stage >= 2:
            for p in self.params:
                p.register_post_accumulate_grad_hook(weak_hook(self._grad_ready))   # no cycle via autograd
        if stage == 3:
            self.shard = {p: my_shard(p) for p in self.params}
            for p in self.params:
                self._release(p)
            self._install_module_hooks()

    # ---- stages 2 and 3: reduce-scatter each gradient as soon as backward has produced it ----
    def _grad_ready(self, p) -> None:
        """Autograd calls this right after p.grad is complete (post-accumulate-grad hook)."""
        if self.stage == 3:
            self._release(p)                    # the gathered weight is not needed any more
        self.bucket.append(p)
        if sum(q.grad.numel() * q.grad.element_size() for q in self.bucket) >= self.bucket_bytes:
            self._flush()

    def _flush(self) -> None:
        """Reduce-scatter the bucket in one collective, keep this rank's shards, free the rest."""
        if not self.bucket:
            return
        shards = reduce_scatter_coalesced([p.grad for p in self.bucket], self.comm)
        for p, g in zip(self.bucket, shards):
            self.grad_shard[p] = g
            p.grad = None                       # the full gradient is gone from here on
        self.bucket.clear()

    # ---- stage 3: gather before use, release after ----------------------------------------
    def _gather_all(self, params) -> None:
        """Make each parameter whole again (if it is released) from every rank's shard."""
        for p in params:
            if p.data.numel() == 0:
                p.data = all_gather_full(self.shard[p], self.numel[p], self.shape[p], self.comm)

    def _release_all(self, params) -> None:
        for p in params:
            self._release(p)

    @staticmethod
    def _release(p) -> None:
        """Drop the whole tensor's storage; only this rank's shard (``self.shard[p]``) remains."""
        p.data = torch.empty(0, dtype=p.dtype, device=p.device)

    def _install_module_hooks(self) -> None:
        """Per module that owns parameters: gather before forward, release after, gather before
        backward."""
        for module in self.model.modules():
            own = list(module.parameters(recurse=False))
            if not own:
                continue
            # (hooks must return None: a returned value would replace the inputs or outputs)
            module.register_forward_pre_hook(lambda m, args, own=own: self._gather_all(own))
            module.register_forward_hook(lambda m, args, out, own=own: self._release_all(own))
            module.register_full_backward_pre_hook(
                lambda m, grad_out, own=own: self._gather_all(own))

    # ---- the step -------------------------------------------------------------------------
    def _adamw(self, param, grad, m, v) -> None:
        adamw_update(param, grad, m, v, self.t, self.lr, self.betas, self.eps, self.wd)

    def _step_ddp(self, p) -> None:
        """Stage 0: average the whole gradient over ranks, every rank updates everything."""
        dist.all_reduce(p.grad)
        self.comm.add("all_reduce", p.grad.numel())
        p.grad.div_(self.world)
        self._adamw(p, p.grad, self.m[p], self.v[p])

    def _step_sharded(self, p) -> None:
        """Stages 1 and 2: update this rank's shard, then all-gather the updated weights."""
        if self.stage == 1:                     # the full gradient is still here: reduce it now
            self.grad_shard[p] = reduce_scatter_mean(p.grad, self.comm)
        mine = my_shard(p)
        self._adamw(mine, self.grad_shard[p], self.m[p], self.v[p])
        p.copy_(all_gather_full(mine, self.numel[p], self.shape[p], self.comm))
        if self.stage == 1:                     # the reduced shard was temporary
            del self.grad_shard[p]

    def _step_zero3(self, p) -> None:
        """Stage 3: the rank owns only shards; it updates them and gathers nothing now."""
        self._adamw(self.shard[p], self.grad_shard[p], self.m[p], self.v[p])

    @torch.no_grad()
    def step(self) -> None:
        """One AdamW update of what this rank owns; stages 2-3 first send the last partial
        bucket."""
        self.t += 1
        self._flush()                           # stages 2-3: the last, partly filled bucket
        one = {0: self._step_ddp, 1: self._step_sharded, 2: self._step_sharded,
               3: self._step_zero3}[self.stage]
        for p in self.params:
            one(p)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        self.grad_shard.clear()

    def full_parameters(self) -> list[torch.Tensor]:
        """Every parameter, whole (gathered under stage 3), for comparing with a reference."""
        if self.stage < 3:
            return [p.detach().clone() for p in self.params]
        return [all_gather_full(self.shard[p], self.numel[p], self.shape[p]).clone()
                for p in self.params]

    def shard_bytes(self) -> int:
        """Bytes of the reduced gradient shards this rank holds now."""
        return sum(g.numel() * g.element_size() for g in self.grad_shard.values())

    def state_bytes(self) -> dict:
        """Bytes this rank holds now, measured on the tensors themselves."""
        nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts)
        params = nbytes(self.shard.values()) if self.stage == 3 else nbytes(self.params)
        grads = self.shard_bytes() if self.stage >= 2 else \
            nbytes(p.grad for p in self.params if p.grad is not None)
        optimizer = nbytes(self.m.values()) + nbytes(self.v.values())
        return {"params": params, "grads": grads, "optimizer": optimizer}
