"""Lab 03's selective part, measured: one layer's operators listed, and a choice run under SAC.

:func:`forward_ops` runs one drawn layer (the course's ``llama.Block``, bf16, real tensors) under
a ``TorchDispatchMode`` that sees every operator the way PyTorch's SAC policy does (``detach``
and the other ``SAC_IGNORED_OPS`` left out, in the same order), with the course's FLOP counter
(``gpumem.memory.flops.PhaseFlops``: matmuls and attention kernels, the CPU flash kernel
included; pointwise operators count zero) filing each operator's FLOPs under its position. The
learner is given the operators that make a new tensor (an output storage that is none of their
inputs'): their aten name, the bytes of their outputs (all of them: the flash kernel's logsumexp
too) and their forward FLOPs. Operators that only view or reshape a tensor are left out and
always re-run: they own no bytes and cost no FLOPs.

:func:`run_saved` runs the same layer (same seed, same weights) through
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False, context_fn=...)`` with
``create_selective_checkpoint_contexts`` and a policy that answers ``MUST_SAVE`` at the chosen
positions of the forward and ``PREFER_RECOMPUTE`` elsewhere; the policy checks each operator's
name against the listing on the way. Measured, not derived from the listing:

* ``kept``: the bytes of the storages the layer's forward made that are still alive once it has
  returned (weak references, after a garbage collection), its output aside (the next layer's
  input): what SAC's cache holds between forward and backward;
* ``rerun``: the FLOPs of the re-run in backward: a FLOP counter entered just beneath SAC's re-run
  mode, so an operator handed back from the cache never reaches it. Early stop is on, as it is by
  default (review r11 #3 (c)): the re-run stops once it has rebuilt the last tensor the region's
  backward needs (the last one autograd saved in the forward). For a layer alone that is W_down's
  input, so the operators after it (W_down itself, the residual add) never run again, kept or
  not; with the final norm in the region, the norm saves its input, the residual sum, and
  everything is re-run;
* ``reached``: how many of the listed operators the re-run reached before it stopped (a mode
  above SAC's re-run mode sees every operator, handed back or not). :func:`forward_ops` measures
  it once, keeping nothing (``Listing.reached``); the key (``labsac``) counts an operator's FLOPs
  as worth keeping only below it.

Both run outside the learner's call; ``labguard`` refuses this module while the learner's code runs.
"""

import contextlib
import gc
from typing import NamedTuple

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import checkpoint as tuc
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from gpumem.memory import flops, llama
from gpumem.memory.models import ModelConfig

DTYPE = torch.bfloat16


class Layer(NamedTuple):
    """One drawn layer: widths, attention kernel (``flash`` or ``eager``) and tokens; with
    ``final_norm``, the model's last layer, checkpointed together with the final norm."""
    d_model: int
    heads: int
    kv_heads: int
    ffn: int
    kernel: str
    seq: int
    batch: int = 2
    final_norm: bool = False

    def describe(self) -> str:
        return (f"layer h {self.d_model}, {self.heads} heads ({self.kv_heads} kv), ffn {self.ffn}, "
                f"{self.kernel} attention, {self.seq} tokens x {self.batch}"
                + (", with the final norm" if self.final_norm else ""))

    def region(self, block):
        """The checkpointed function: the layer, then the final norm (``block.final``) if drawn."""
        if self.final_norm:
            return lambda h, c, s: block.final(block(h, c, s, self.kernel))
        return lambda h, c, s: block(h, c, s, self.kernel)


class Listing(NamedTuple):
    """A layer's forward: ``ops`` (what the learner is given), every operator's name in the order
    SAC's policy sees them (``names``), the position there of each listed operator, and how many
    listed operators the early-stopping re-run reaches (``reached``: the rest never run again)."""
    ops: list
    names: list
    positions: list
    reached: int = -1

    def worth(self) -> list:
        """``ops`` with the FLOPs keeping each spares under early stop: 0 from ``reached`` on."""
        return [dict(o, flops=o["flops"] if i < self.reached else 0) for i, o in enumerate(self.ops)]


class Saved(NamedTuple):
    """One SAC run's measurements (module docstring)."""
    kept: int
    rerun: int
    reached: int


def _build(layer: Layer):
    """The layer and its inputs, from a fixed seed (the global generator is left as it was)."""
    cfg = ModelConfig("unseen-sac", 1, layer.d_model, layer.heads, layer.kv_heads, layer.ffn, 32,
                      teaching=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        block = llama.Block(cfg).to(DTYPE)
        block.final = llama.make_norm("fused", layer.d_model, cfg.norm_eps).to(DTYPE)     # the final norm
        x = torch.randn(layer.batch, layer.seq, layer.d_model, dtype=DTYPE, requires_grad=True)
    cos, sin = llama.rope_tables(layer.seq, cfg.head_dim, cfg.rope_theta, DTYPE)
    return block, x, cos, sin


def _outputs(out) -> list:
    return [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)]


def _storages(args, kwargs) -> set:
    return {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}


class _Lister(TorchDispatchMode):
    """Every operator SAC's policy would be asked about, in order: name, new storages, bytes."""

    def __init__(self):
        super().__init__()
        self.rows: list[tuple[str, bool, int]] = []
        self.now = -1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in tuc.SAC_IGNORED_OPS:
            return func(*args, **kwargs)
        self.now = len(self.rows)
        out = func(*args, **kwargs)
        made, used = _outputs(out), _storages(args, kwargs)
        new = bool(made) and all(t.untyped_storage().data_ptr() not in used for t in made)
        self.rows.append((str(func), new, sum(t.untyped_storage().nbytes() for t in made)))
        return out


def forward_ops(layer: Layer) -> Listing:
    """``layer``'s forward, measured: the operators that make a new tensor, as plain data
    (``{"op": aten name, "bytes": output bytes, "flops": forward FLOPs}``), in forward order."""
    block, x, cos, sin = _build(layer)
    lister = _Lister()
    counter = flops.PhaseFlops(lambda: lister.now)
    with counter, lister:                   # the counter beneath the lister: it sees each op once
        layer.region(block)(x, cos, sin)
    ops, positions = [], []
    for i, (name, new, size) in enumerate(lister.rows):
        if new:
            ops.append({"op": name, "bytes": size, "flops": int(counter.by_key.get(i, 0))})
            positions.append(i)
    listing = Listing(ops, [r[0] for r in lister.rows], positions)
    return listing._replace(reached=run_saved(layer, listing, set()).reached)     # measured


class _Made(TorchDispatchMode):
    """Weak references to the storages made inside (not views of an input's)."""

    def __init__(self):
        super().__init__()
        self.refs: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        used = _storages(args, kwargs)
        for t in _outputs(out):
            storage = t.untyped_storage()
            if storage.data_ptr() not in used:
                self.refs.append((StorageWeakRef(storage), storage.data_ptr(), storage.nbytes()))
        return out

    def alive(self, besides) -> int:
        gc.collect()
        skip = besides.untyped_storage().data_ptr()
        return sum({p: n for ref, p, n in self.refs if not ref.expired() and p != skip}.values())


class _OlderFrozen:
    """Inside, a garbage collection looks only at the objects made inside: the older ones are frozen
    (``gc.freeze``). :meth:`_Made.alive` collects to see which of the run's storages a reference cycle
    alone held; those are all made inside. A full collection of a test process's heap took 160 ms a
    run (19 of a lab 03 test's 26 s). Where objects were frozen before (tests' ``frozen_heap``), the
    ones frozen here stay frozen until whoever froze first unfreezes them all. (A class, not a
    ``contextmanager`` function: labguard refuses every function of this module by its code, and a
    decorated one's code is contextlib's, which torch's checkpoint runs too.)"""

    def __enter__(self):
        self.first = gc.get_freeze_count() == 0
        gc.freeze()

    def __exit__(self, *exc):
        if self.first:
            gc.unfreeze()


class _Reached(TorchDispatchMode):
    """Above SAC's re-run mode: how many operators the re-run reached, handed back or not."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func not in tuc.SAC_IGNORED_OPS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def run_saved(layer: Layer, listing: Listing, chosen) -> Saved:
    """(bytes kept between forward and backward, FLOPs re-run in backward, listed operators the
    re-run reached) of ``layer`` under PyTorch's SAC, early stop on, keeping the listed operators
    ``chosen`` (indices into ``listing.ops``)."""
    keep = {listing.positions[i] for i in chosen}
    seen = [0]

    def policy(ctx, op, *args, **kwargs):
        at = seen[0]
        seen[0] += 1
        if at >= len(listing.names) or str(op) != listing.names[at]:
            raise RuntimeError(f"the layer's forward changed since it was listed: {op} at position {at}")
        return tuc.CheckpointPolicy.MUST_SAVE if at in keep else tuc.CheckpointPolicy.PREFER_RECOMPUTE
    counter, reached = flops.PhaseFlops(), _Reached()

    @contextlib.contextmanager
    def counted(rerun):
        with counter, rerun, reached:              # SAC's re-run mode above the counter: a cache hit is not counted
            yield

    def contexts():
        forward, rerun = tuc.create_selective_checkpoint_contexts(policy)
        return forward, counted(rerun)
    with _OlderFrozen():
        block, x, cos, sin = _build(layer)
        made = _Made()
        with tuc.set_checkpoint_early_stop(True):      # PyTorch's default, said out loud
            with made:
                out = tuc.checkpoint(layer.region(block), x, cos, sin,
                                     use_reentrant=False, context_fn=contexts)
            kept = made.alive(besides=out)
            out.float().square().sum().backward()
    if seen[0] != len(listing.names):
        raise RuntimeError(f"the policy saw {seen[0]} operators, the listing has {len(listing.names)}")
    listed = sum(p < reached.count for p in listing.positions)
    return Saved(kept, int(sum(counter.by_key.values())), listed)
