"""Lab 02's second memory meter: every byte made during backward that is still alive, whoever
holds it and however.

:class:`~gpumem.runs.gradmeter.GradMeter` follows the ``.grad`` tensors; a copy of a gradient
(``p.grad.clone()``, then ``p.grad = None``) escapes it. :class:`LiveMeter` is a
``TorchDispatchMode`` entered around ``loss.backward()``: every tensor an operator returns (autograd's
own, the learner's hooks', their end-of-backward callback's) has its storage noted by a
``StorageWeakRef``, the C++ storage's weak reference, so an alias (``.data``, a view, a list, a
closure) keeps it counted and only a storage that is really freed drops out. Parameter storages
are left out (an operator may return a view of a weight).

Autograd's own temporaries (activation gradients, the views of saved tensors it makes) are not the
learner's: :func:`autograd_bytes` measures them once per case in a backward with no hooks, at each
gradient arrival, as everything alive minus the ``.grad`` storages so far. The ranks report, per
arrival, what is alive in the hooked backward minus that, i.e. the bytes the hooks hold.
"""

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveMeter(TorchDispatchMode):
    """Storages returned by operators while the mode is on, counted while they are alive."""

    def __init__(self, params):
        super().__init__()
        self.skip = {StorageWeakRef(p.untyped_storage()).cdata for p in params}
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.paused = False                # set while a collective runs: the backend's buffers are its own

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in () if self.paused else tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                st = t.untyped_storage()
                ref = StorageWeakRef(st)
                old = self.live.get(ref.cdata)
                if ref.cdata not in self.skip and (old is None or old[0].expired()):
                    self.live[ref.cdata] = (ref, st.nbytes())
        return out

    def bytes(self) -> int:
        """Bytes of the noted storages that are alive now."""
        for k in [k for k, (ref, _) in self.live.items() if ref.expired()]:
            del self.live[k]
        return sum(n for _, n in self.live.values())


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages under ``tensors`` (None skipped)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is not None:
            st = t.untyped_storage()
            seen[StorageWeakRef(st).cdata] = st.nbytes()
    return sum(seen.values())


def autograd_bytes(net, params, inputs, targets) -> list[int]:
    """Autograd's own live bytes at each gradient arrival of one backward with no hooks, and when it
    returned (the last entry): everything made during backward and alive, less the ``.grad``
    storages. The gradients are freed afterwards; the weights do not change."""
    meter, out = LiveMeter(params), []

    def sample(_p):
        out.append(meter.bytes() - storage_bytes(p.grad for p in params))
    handles = [p.register_post_accumulate_grad_hook(sample) for p in params]
    try:
        loss = net(inputs, targets)
        with meter:
            loss.backward()
        out.append(meter.bytes() - storage_bytes(p.grad for p in params))
    finally:
        for h in handles:
            h.remove()
        for p in params:
            p.grad = None
    return out
