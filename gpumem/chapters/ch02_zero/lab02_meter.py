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

import math

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveMeter(TorchDispatchMode):
    """Storages returned by operators while the mode is on, counted while they are alive."""

    def __init__(self, params):
        super().__init__()
        self.skip = {p.untyped_storage()._cdata for p in params}
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.paused = False                # set while a collective runs: the backend's buffers are its own
        self.backend: dict[int, StorageWeakRef] = {}    # storages seen while paused (lab02_probe skips them)

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """No torch.compile runs here: leave __torch_dispatch__ unwrapped (the wrapper imports
        torch._dynamo, 5 s per rank)."""
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:               # a view's storage was made by another op
            for t in (out,) if isinstance(out, torch.Tensor) else tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    st = t.untyped_storage()
                    if self.paused:
                        self.backend.setdefault(st._cdata, StorageWeakRef(st))
                    else:
                        self._note(st)
        return out

    def _note(self, st) -> None:
        key = st._cdata
        old = self.live.get(key)
        if key not in self.skip and (old is None or old[0].expired()):
            self.live[key] = (StorageWeakRef(st), st.nbytes())

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


def autograd_bytes(net, params, inputs, targets, order: list | None = None) -> list[int]:
    """Autograd's own live bytes at each gradient arrival of one backward with no hooks, and when it
    returned (the last entry): everything made during backward and alive, less the ``.grad``
    storages. The gradients are freed afterwards; the weights do not change. ``order``, if given,
    gets the parameters in the order their gradients arrived."""
    meter, out = LiveMeter(params), []

    def sample(_p):
        if order is not None:
            order.append(_p)
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


def held_bound(sizes: list[int], bucket: int, world: int) -> int:
    """Bytes made during backward the hooks may hold at a gradient's arrival or when backward
    returns: the bucket's gradients and the one just arrived, two buckets' flat copies in flight
    (each padded by at most N - 1 elements per gradient), and the shards (every tensor's
    ceil(n / N) elements, in fp32)."""
    used = [n for n in sizes if n]
    full = bucket + max(used)
    pad = 4 * world * len(used)
    return full + 2 * (full + pad) + sum(4 * math.ceil(n / 4 / world) for n in used)


def grade_peak(ranks: list[dict], sizes: list[int], names: list[str], bucket: int, world: int,
               most: int | None = None) -> str | None:
    """Full ``.grad`` bytes (:class:`~gpumem.runs.gradmeter.GradMeter`), then every byte the hooks
    made and kept (:class:`LiveMeter`: copies count even after ``.grad = None``) against ``most``
    (default :func:`held_bound`; the bf16 case passes the bound of its fp32 copies)."""
    peak = max(res["peak_full"] for res in ranks)
    if peak > bucket + max(sizes):
        return (f"expected at most {bucket + max(sizes):,} B (the bucket, {bucket:,} B, plus the largest "
                f"gradient, {names[sizes.index(max(sizes))]}), got {peak:,} B"
                + (" = every gradient at once, as ZeRO-1 holds them" if peak >= sum(sizes) else ""))
    held, most = max(res["peak_held"] for res in ranks), most or held_bound(sizes, bucket, world)
    if held > most:
        return (f"your hooks kept {held:,} B of tensors made during backward (or by the install call and kept), "
                f"at most {most:,} B expected (bucket, largest gradient, 2 flat copies, shards): copies of full "
                f"gradients count even after "
                f".grad = None, dispatch modes off or on; free them once sent")
    return None
