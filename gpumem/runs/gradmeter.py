"""Peak gradient bytes during backward, measured on the gradient tensors themselves.

ZeRO-1 and ZeRO-2 differ most in the peak *during* backward. ZeRO-1 lets autograd build every
full gradient before it reduce-scatters (and the full gradients stay until they are zeroed);
ZeRO-2 reduce-scatters each gradient as soon as it is ready and frees it, so at most a bucket of
full gradients is alive at once. This meter measures that peak on the tensors themselves.

:class:`GradMeter` registers a ``register_post_accumulate_grad_hook`` on every parameter
*before* any sharding hook, so it runs first, at the moment a gradient has been accumulated and
before anything frees it. It remembers each gradient tensor by weak reference and, at every
arrival, adds up the bytes of the gradients still alive (plus, optionally, the bytes the
sharding code keeps, e.g. reduced shards). A gradient set to ``None`` with no other reference
dies at once, so the sum is what is really held, not what the code says it holds.
"""

import weakref
from typing import Callable, Iterable

import torch


def weak_hook(method: Callable) -> Callable:
    """A tensor hook that calls the bound ``method`` while its object lives, holding it weakly.

    Autograd keeps a tensor's hooks on its C++ side, where Python's garbage collector cannot see
    them: a hook that holds its object strongly (a meter or an optimizer that holds the
    parameters) makes a cycle that is never freed. A rank that trains stage after stage would
    keep every earlier model, its gradients and its moments allocated (on a GPU they showed in the
    next stage's ``max_memory_allocated``). The object must be kept alive by its user meanwhile."""
    ref = weakref.WeakMethod(method)

    def hook(*args):
        bound = ref()
        if bound is not None:
            bound(*args)
    return hook


class GradMeter:
    """Sample live gradient bytes each time a gradient arrives during backward; keep the peak.

    ``extra`` is called at each sample and returns further bytes to count (the reduced shards a
    sharded optimizer keeps); the peak of full gradients alone is kept too, in ``peak_full``.
    Create it before the optimizer installs its own hooks."""

    def __init__(self, params: Iterable[torch.nn.Parameter], extra: Callable[[], int] | None = None):
        self.params = [p for p in params if p.requires_grad]
        self.extra = extra
        self._live: dict[int, tuple[weakref.ref, int]] = {}
        self.peak = self.peak_full = 0
        self.samples: list[tuple[int, int]] = []      # (full gradient bytes, extra bytes) per arrival
        self._handles = [p.register_post_accumulate_grad_hook(weak_hook(self._arrived)) for p in self.params]

    def _arrived(self, p: torch.nn.Parameter) -> None:
        g = p.grad
        self._live[id(p)] = (weakref.ref(g), g.numel() * g.element_size())
        self.sample()

    def full_bytes(self) -> int:
        """Bytes of the full gradients that are alive now (dead references are dropped)."""
        dead = [k for k, (ref, _) in self._live.items() if ref() is None]
        for k in dead:
            del self._live[k]
        return sum(n for _, n in self._live.values())

    def sample(self) -> int:
        """Measure now; returns the bytes counted (full gradients + extra)."""
        full = self.full_bytes()
        extra = self.extra() if self.extra else 0
        self.samples.append((full, extra))
        self.peak_full = max(self.peak_full, full)
        self.peak = max(self.peak, full + extra)
        return full + extra

    def reset(self) -> None:
        """Start a new measurement (gradients that are still alive keep being counted)."""
        self.samples.clear()
        self.peak = self.peak_full = 0

    def remove(self) -> None:
        """Take the meter's hooks off the parameters."""
        for h in self._handles:
            h.remove()
        self._handles.clear()


def peak_bound(sizes: list[int], world: int, stage: int, elem_bytes: int = 2, bucket_bytes: int = 0) -> dict:
    """What a :class:`GradMeter` can read at most during backward, from the parameter sizes alone.

    Stages 0-1: every full gradient exists when backward ends. Stages 2-3: less than a bucket of
    ready gradients plus the one that just arrived, and the shards kept so far (at most every
    tensor's ceil(n / N) elements)."""
    shards = elem_bytes * sum(-(-n // world) for n in sizes)
    if stage <= 1:
        return {"full_grads": elem_bytes * sum(sizes), "shards": 0, "total": elem_bytes * sum(sizes)}
    full = bucket_bytes + elem_bytes * max(sizes)
    return {"full_grads": full, "shards": shards, "total": full + shards}
