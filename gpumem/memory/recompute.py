"""Activation checkpointing (recomputation), from scratch and PyTorch's, for any plan.

* :class:`Checkpoint` (``impl="scratch"``) is the whole idea in one ``torch.autograd.Function``:
  its forward runs a segment without building a graph and keeps only the segment's inputs; its
  backward runs the segment again, this time with a graph, and back-propagates through that
  fresh copy. ``torch.utils.checkpoint(use_reentrant=True)`` and DeepSpeed's
  ``CheckpointFunction`` (``impl="deepspeed"``) work this way ("reentrant").
* ``impl="torch"`` uses ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``: the forward
  builds the graph but drops the tensors it would save (saved-tensor hooks), and backward
  re-runs the segment only until the last tensor it will read exists (``early_stop``), so the
  segment's final W_down matmul is never re-run.
* ``sac`` wraps every layer with ``create_selective_checkpoint_contexts`` and a policy that keeps
  matmul outputs (:func:`sac_policy`).

:func:`loss_of` runs the course's Llama (``gpumem.memory.llama``) under a
:class:`~gpumem.memory.recompute_plans.Plan`, driving ``model.embed``, ``model.layers``,
``model.norm`` and ``model.head`` itself (the same maths as ``Llama.forward``), so a plan can be
any list of segments. A segment run while autograd's engine is running backward is a re-run,
whoever runs it; it is marked, and :func:`recomputing` lets tracers and FLOP counters tell
recomputation from backward.
"""

import contextlib

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from ..errors import UsageError, one_of
from . import llama
from .policies import KERNELS
from .recompute_plans import Plan, plan as make_plan

IMPLS = ("torch", "scratch", "deepspeed")
# One recompute marker for the whole engine: a re-run here and the Llama's own checkpoints
# (``llama.ckpt``) are seen alike by the tracers.
recomputing = llama.recomputing
marking = llama.recompute_marker


def in_backward() -> bool:
    """True while autograd's engine is running a backward pass on this thread."""
    return torch._C._current_graph_task_id() != -1


def cuda_devices(*inputs) -> list[int]:
    """The CUDA devices the tensors among ``inputs`` live on (whose generators a re-run replays),
    as ``torch.utils.checkpoint.get_device_states`` finds them; empty on CPU."""
    return sorted({x.get_device() for x in inputs if isinstance(x, torch.Tensor) and x.is_cuda})


class Checkpoint(torch.autograd.Function):
    """Keep a segment's inputs, not its activations; re-run the segment in backward. A re-run
    must draw the same random numbers (dropout): the CPU generator's state and those of the
    inputs' CUDA devices are stashed, and restored for the re-run only (``fork_rng``), as
    ``torch.utils.checkpoint`` does with ``preserve_rng_state=True``."""

    @staticmethod
    def forward(ctx, run, *inputs):
        ctx.run = run
        ctx.rng = torch.get_rng_state()
        ctx.gpus = cuda_devices(*inputs)
        ctx.gpu_rng = [torch.cuda.get_rng_state(d) for d in ctx.gpus]
        ctx.save_for_backward(*inputs)              # the only tensors kept: the segment's inputs
        with torch.no_grad():                       # no graph, so nothing inside is saved
            return run(*inputs)

    @staticmethod
    def backward(ctx, grad_out):
        inputs = [x.detach().requires_grad_(x.requires_grad) for x in ctx.saved_tensors]
        with torch.random.fork_rng(devices=ctx.gpus), torch.enable_grad():
            torch.set_rng_state(ctx.rng)
            for device, state in zip(ctx.gpus, ctx.gpu_rng):
                torch.cuda.set_rng_state(state, device)
            out = ctx.run(*inputs)                  # the segment's forward, again, with a graph
        torch.autograd.backward(out, grad_out)      # parameter grads accumulate here
        return (None, *[x.grad if x.requires_grad else None for x in inputs])


# Ops whose outputs PyTorch's SAC keeps under the policy below: the matmuls, and the attention
# kernels (CPU and CUDA), whose backward needs their own output and logsumexp.
_aten = torch.ops.aten
SAVE_OPS = {_aten.mm.default, _aten.addmm.default, _aten.bmm.default,
            _aten._scaled_dot_product_flash_attention_for_cpu.default,
            _aten._scaled_dot_product_flash_attention.default,
            _aten._scaled_dot_product_efficient_attention.default}


def sac_policy(ctx, op, *args, **kwargs):
    """SAC policy: keep every matmul's (and attention kernel's) output, recompute everything else."""
    return CheckpointPolicy.MUST_SAVE if op in SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _sac_contexts():
    return create_selective_checkpoint_contexts(sac_policy)


def run_checkpointed(fn, *args, impl="torch", sac: bool = False):
    """``fn(*args)`` under activation checkpointing: ours (``scratch``), PyTorch's non-reentrant
    one (``torch``, with SAC if ``sac``), DeepSpeed's (``deepspeed``), or any ``impl(fn, *args)``."""
    if callable(impl):
        return impl(fn, *args)
    one_of(impl, IMPLS, "checkpoint implementation")
    if sac and impl != "torch":
        raise UsageError(f"SAC (selective activation checkpointing) is PyTorch's; got impl {impl!r}, accepted: torch")
    if impl == "scratch":
        return Checkpoint.apply(fn, *args)
    if impl == "deepspeed":
        from deepspeed.runtime.activation_checkpointing import checkpointing as ds_checkpointing
        return ds_checkpointing.checkpoint(fn, *args)   # reentrant: DeepSpeed's CheckpointFunction
    if sac:
        return checkpoint(fn, *args, use_reentrant=False, context_fn=_sac_contexts)
    return checkpoint(fn, *args, use_reentrant=False)


def loss_of(model, tokens, targets, kernel: str = "flash", plan: str | Plan = "none",
            impl: str = "torch"):
    """The Llama's loss with ``plan`` applied (the same maths as ``Llama.forward``)."""
    one_of(kernel, KERNELS, "attention kernel")
    cfg = model.cfg
    p = make_plan(plan, cfg.n_layers) if isinstance(plan, str) else plan
    starts = {seg[0]: seg for seg in p.segments}
    x = model.embed(tokens)
    cos, sin = llama.rope_tables(tokens.shape[1], cfg.head_dim, cfg.rope_theta, x.dtype, x.device)

    def segment(first, count):
        def run(h, cos, sin):
            # called again inside backward, whoever calls it: that is the recomputation
            with marking() if in_backward() else contextlib.nullcontext():
                for layer in model.layers[first:first + count]:
                    h = layer(h, cos, sin, kernel)
            return h
        return run

    i = 0
    while i < cfg.n_layers:
        if i in starts:
            seg = starts[i]
            x = run_checkpointed(segment(seg[0], len(seg)), x, cos, sin, impl=impl, sac=p.sac)
            i += len(seg)
        else:
            x = model.layers[i](x, cos, sin, kernel, p.core)
            i += 1
    logits = model.head(model.norm(x))
    flat = targets if targets.dim() == 1 else targets.reshape(-1)   # a view would be counted anew
    return F.cross_entropy(logits.float().view(-1, cfg.vocab), flat)
