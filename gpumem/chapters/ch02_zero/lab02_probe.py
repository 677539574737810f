"""Lab 02's two physical probes: they measure what happened, whatever route the learner's code took.

**Overlap, by holding one rank back.** In each backward pass the grader holds one rank (rank 1 in
the first pass, rank 0 in the second, ...) for :data:`DELAY_S` before its first :data:`HELD`
reduce-scatters join the collective. A collective cannot finish on the other rank before the held
rank has joined it. So if, on the other rank, the gradient after a launch arrives *before* the
held rank joined that launch's collective, backward went on while the collective was pending: it
overlapped. If it arrives only after, the hooks stood still until the collective could finish:
they blocked right after the launch, by ``wait()``, a barrier, a poll, the handle behind the
grader's proxy or any other route. No timing threshold decides it, only the order of two clock
readings (``time.monotonic`` is one clock for all processes of a machine). The ranks meet at a
barrier before each backward; a launch is checked only if the held rank joined at least
:data:`WINDOW_S` after it (a rank that lagged behind the held one opens no window), so a busy
machine can only make an overlapping rank look blocked if it computes one gradient slower than
that window, at every checked launch: a rank fails only if none of its checked launches, in any
pass, overlapped.

**Bytes held, by reachability.** :class:`.lab02_meter.LiveMeter` sees tensors through the dispatcher;
tensors made with the dispatch modes switched off (``_disable_current_modes``) escape it.
:class:`Reach` finds every tensor and storage object the garbage collector tracks (wherever it is
kept: a closure, a module, an attribute) and counts the storages that did not exist when backward
started and that the live meter does not know; :mod:`tracemalloc` adds host buffers made during
backward (``bytes``, NumPy arrays) beyond :data:`HOST_SLACK`. The ranks sample both at the last
gradient's arrival and when backward returns.
"""

import gc
import sys
import time
import tracemalloc

import torch
from torch.multiprocessing.reductions import StorageWeakRef

DELAY_S = 0.2                # how long the held rank sleeps before each of its first HELD launches
HELD = 2
WINDOW_S = 0.1               # a launch is checked only if the held rank joined at least this long after it
HOST_SLACK = 256 * 1024      # an assumption: the Python objects a hook makes (lists, dicts, tensor
# wrappers) stay well under this; a host copy of a gradient bucket is larger in every graded case


def held_rank(n_pass: int) -> int:
    """The rank held back in backward pass ``n_pass`` (1, 2, ...): 1, 0, 1, ..."""
    return n_pass % 2


def hold(rec, rank: int) -> float:
    """In the reduce-scatter wrapper, before the real call: sleep if this rank is held in this pass
    and the launch is among the first :data:`HELD`; returns the moment it joins."""
    if rec.n_pass and held_rank(rec.n_pass) == rank and len(rec.launches) < HELD:
        time.sleep(DELAY_S)
    return time.monotonic()


class Reach:
    """Storages made during backward that the garbage collector can reach and the live meter did not
    note, plus host bytes traced by :mod:`tracemalloc` beyond :data:`HOST_SLACK`."""

    def __init__(self, params):
        self.skip = {p.untyped_storage()._cdata for p in params}
        self.before: dict = {}
        self.tracing = False

    def start(self) -> None:
        self.before = {key: StorageWeakRef(st) for key, st, _ in _storages(gc.get_objects())}
        self.tracing = not tracemalloc.is_tracing()
        if self.tracing:
            tracemalloc.start()

    def stop(self) -> None:
        self.before = {}
        if self.tracing:
            tracemalloc.stop()
            self.tracing = False

    def hidden(self, meter, grads) -> int:
        """Bytes of storages made since :meth:`start`, still alive, not ``.grad`` and unknown to the
        live meter ``meter`` (neither counted nor the backend's), plus host bytes beyond the slack."""
        host = tracemalloc.get_traced_memory()[0] if self.tracing else 0
        skip = self.skip | {g.untyped_storage()._cdata for g in grads if g is not None} | meter.live.keys() | \
            {k for k, ref in meter.backend.items() if not ref.expired()}
        everything = gc.get_objects()
        new: dict[int, int] = {}
        found: dict[int, int] = {}                    # id(tensor or storage object) -> storage key
        for key, st, o in _storages(everything):
            old = self.before.get(key)
            if key not in skip and (old is None or old.expired()):
                new[key] = st.nbytes()
                found[id(o)] = key
        if not new:
            return max(0, host - HOST_SLACK)
        # kept means referred to by a Python object (a list, a closure cell, a dict...): a tensor that
        # only the backend's C++ side keeps (gloo's buffers, behind a waited handle) is not the hooks'
        objs = [o for o in everything if id(o) in found]
        running, f = set(), sys._getframe()           # the frames running now (this scan's callers)
        while f is not None:
            running.add(id(f))
            f = f.f_back
        kept = set()
        for r in gc.get_referrers(*objs):             # a suspended generator's frame counts: it keeps
            if r is not everything and r is not objs and id(r) not in running:
                kept |= {found[id(x)] for x in gc.get_referents(r) if id(x) in found}
        return sum(new[k] for k in kept) + max(0, host - HOST_SLACK)


def _storages(everything: list):
    """(key, storage, object) of every tensor and storage object the garbage collector tracks."""
    kinds = (torch.Tensor, torch.UntypedStorage)   # a TypedStorage keeps an UntypedStorage object
    wanted: dict[type, bool] = {}                   # issubclass once per type: 170,000 objects to look at
    for o in everything:
        tp = type(o)
        ok = wanted.get(tp)
        if ok is None:
            ok = wanted[tp] = issubclass(tp, kinds)
        if not ok:
            continue
        try:
            st = o if isinstance(o, torch.UntypedStorage) else o.untyped_storage()
            if st.device.type != "meta":
                yield st._cdata, st, o
        except (RuntimeError, NotImplementedError):   # a tensor with no storage (sparse, nested)
            continue


def grade_overlap(ranks: list[dict]) -> str | None:
    """The first rank on which no checked launch overlapped with backward (see the module text)."""
    for c in range(len(ranks)):
        checked = overlapped = 0
        for n, mine in enumerate(ranks[c]["passes"], 1):
            held = held_rank(n)
            if held == c or held >= len(ranks):
                continue
            theirs = ranks[held]["passes"][n - 1]
            for x, y in zip(mine["launches"][:HELD], theirs["launches"][:HELD]):
                if x["at"] >= mine["arrivals"] or x["at"] >= len(mine["times"]):
                    continue            # launched at the last arrival: no later gradient to compute
                if y["t_join"] - x["t_join"] < WINDOW_S:
                    continue            # this rank lagged: the other joined too soon after to tell
                checked += 1
                overlapped += mine["times"][x["at"]] < y["t_join"]
        if checked and not overlapped:
            return (f"rank {c} computed no further gradient after launching a reduce-scatter until rank "
                    f"{1 - c}, held back {DELAY_S * 1e3:.0f} ms by the grader, had joined it ({checked} launches "
                    "checked): your hooks block right after each launch (a wait, a barrier or a poll, by "
                    "whatever route), so nothing overlapped; let backward go on while the bucket travels")
    return None
