"""Lab 02's two physical probes: they measure what happened, whatever route the learner's code took.

**Overlap, by holding one rank back.** In each backward pass the grader's own arrival hook holds
one rank (rank 1 in the first pass, rank 0 in the second, ...) at a drawn gradient, before the
learner's hook runs: the first arrival after that rank's own k-th collective of the pass, k drawn
per pass from 1 to one less than the buckets the lab's rule sends before the last gradient, so
every such collective but the first can be the one tested (:func:`hold_after`; review r12 #2:
holding always at the first gradient tested only the first bucket, and hooks that blocked on every
later one passed; r14: drawn from the first half, blocking on the second half passed). It sleeps
:func:`delay` seconds (at least :data:`DELAY_S`, more on a slow machine), and notes when it woke
and how many operations its process group had run. Every collective that
rank issues after that (whatever function, wrapper or method issued it) joins after it woke, and
a collective cannot finish on the other rank before the held rank has joined it. The other rank's
arrival hook notes, at each gradient, the time and its own operation count. So if, on the other
rank, a gradient arrives after its first such collective was issued and *before* the held rank
woke, backward went on while that collective was pending: it overlapped. If it arrives only
after, the hooks stood still until the collective could finish: they blocked (a synchronous
collective, a wait, a barrier, a poll, the handle behind the grader's proxy...). No timing
threshold decides it, only the order of two clock readings (``time.monotonic`` is one clock for
all processes of a machine), and none of the readings comes from the record the wrappers keep.
The ranks meet at a barrier before each backward; a pass is checked only if the other rank began
the hook that issued that collective at least :data:`WINDOW_S` before the held rank woke. A rank
fails if none of its checked passes overlapped, and also if no pass could be checked: a probe
that tested nothing proves nothing.

**Bytes held, by reachability.** :class:`.lab02_meter.LiveMeter` sees tensors through the dispatcher;
tensors made with the dispatch modes switched off (``_disable_current_modes``) escape it.
:class:`Reach` finds every tensor and storage object the garbage collector tracks (wherever it is
kept: a closure, a module, an attribute) and counts the storages that did not exist when backward
started, that the live meter did not count and that a Python object keeps (those made while the
meter was paused too: review r15 #2, hooks that paused it kept every flat copy unseen); :mod:`tracemalloc` adds host buffers made during
backward (``bytes``, NumPy arrays) beyond :data:`HOST_SLACK`. The ranks sample both at the last
gradient's arrival and when backward returns.
"""

import gc
import os
import random
import sys
import threading
import tracemalloc

import torch
from torch.multiprocessing.reductions import StorageWeakRef

WATCH_S = 90.0               # a case still running after this long is stuck (a case takes seconds)
DELAY_S = 0.25               # the least the held rank sleeps at its held arrival
DELAY_MAX = 2.0
BUSY = "the machine was too busy for the probe's timing"   # the case is run once more (:func:`again`)
WINDOW_S = 0.1               # a pass is checked only if the launching hook began this long before the wake
HOST_SLACK = 256 * 1024      # an assumption: the Python objects a hook makes (lists, dicts, tensor
# wrappers) stay well under this; a host copy of a gradient bucket is larger in every graded case


def held_rank(n_pass: int) -> int:
    """The rank held back in backward pass ``n_pass`` (1, 2, ...): 1, 0, 1, ..."""
    return n_pass % 2


def hold_after(sizes: list[int], bucket: int, rng: random.Random) -> int:
    """k: the held rank is held at its first arrival after its own k-th collective of the pass.
    ``sizes``: the gradients' bytes in the order they arrive. k is drawn from 1 to one less than the
    buckets the lab's rule (send once the bucket reaches ``bucket``) sends before the last gradient,
    so every early collective but the first can be the one tested (review r14: drawn from the first
    half only, blocking on the second half passed); 0 (the first arrival) when it sends at most one.
    A rank that never gets that far is held at its last arrival."""
    early, filling = 0, 0
    for size in sizes[:-1]:
        filling += size
        if filling >= bucket:
            early, filling = early + 1, 0
    return rng.randint(1, early - 1) if early > 1 else 0


class Stuck(BaseException):
    """Raised in a rank's main thread by :func:`watchdog`: not an ``Exception``, so it ends the run."""
    line = ""

    def __str__(self) -> str:
        return self.line


def watchdog(what: str, filename: str, source: str, seconds: float):
    """Watch one case on this rank: if it has not ended after ``seconds``, name ``what`` (the case)
    and the line of the learner's code (compiled as ``filename`` from ``source``) the rank was
    running, raise :class:`Stuck` in the main thread (the run ends with that line as the rank's
    error), and end the rank 10 s later if that did not stop it (stuck in C: the line is its last
    output). Review r12 #5: a hook spinning on its output, which gloo fills only in ``wait()``,
    hung the whole check for its 480 s with a row naming nothing. Returns the function that stops
    the watch."""
    import ctypes
    me, done, lines = threading.get_ident(), threading.Event(), source.splitlines()

    def fire():
        if done.wait(seconds):
            return
        frame, where = sys._current_frames().get(me), ""
        while frame is not None and not where:
            if frame.f_code.co_filename == filename and 0 < frame.f_lineno <= len(lines):
                where = f"; it was at line {frame.f_lineno} of your function: {lines[frame.f_lineno - 1].strip()[:70]}"
            frame = frame.f_back
        line = f"{what}: still running after {seconds:g} s{where}"
        print(line, file=sys.stderr, flush=True)
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(me),
                                                   ctypes.py_object(type("Stuck", (Stuck,), {"line": line})))
        if not done.wait(10):
            os._exit(3)
    threading.Thread(target=fire, name="lab02-watchdog", daemon=True).start()
    return done.set


def delay(step_s: float) -> float:
    """How long the held rank sleeps: twice this rank's forward and backward without hooks
    (``step_s``), so the other rank fills its first bucket and computes the next gradient in the
    meantime, between :data:`DELAY_S` and :data:`DELAY_MAX`."""
    return min(DELAY_MAX, max(DELAY_S, 2 * step_s))


class Reach:
    """Storages made during backward that the garbage collector can reach and the live meter did not
    note, plus host bytes traced by :mod:`tracemalloc` beyond :data:`HOST_SLACK`."""

    def __init__(self, params):
        self.skip = {p.untyped_storage()._cdata for p in params}
        self.before: dict = {}
        self.made: dict = {}                        # storage key -> (weak ref, bytes) the install call made
        self.host_made = 0                          # host bytes the install call made and kept (tracemalloc)
        self.tracing = False

    def install(self, call) -> None:
        """Run the learner's install ``call``, noting the storages it made that a Python object keeps
        (review r29: a whole-model store made there and written through numpy during backward was
        counted nowhere), and the host bytes it made and kept, traced by :mod:`tracemalloc` (review
        r31: the store as a ``bytearray``): :meth:`hidden` adds both to every sample."""
        before = {key for key, _, _ in _storages(gc.get_objects())}
        tracing = not tracemalloc.is_tracing()
        if tracing:                                 # review r31: a bytearray store (written through
            tracemalloc.start()                     # torch.frombuffer views) is no torch storage
        try:
            call()
            self.host_made = tracemalloc.get_traced_memory()[0] if tracing else 0
        finally:
            if tracing:
                tracemalloc.stop()
        self.made = {key: (StorageWeakRef(st), st.nbytes()) for key, st, _ in _storages(gc.get_objects())
                     if key not in before and key not in self.skip}

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
        """Bytes of storages made since :meth:`start`, still alive, neither ``grads`` (the ``.grad``
        tensors, and the grader's own copies) nor counted by the live meter ``meter``, that a Python
        object keeps, plus those the install call made and kept (:meth:`install`), plus host bytes
        (the install call's and backward's) beyond the slack. Storages noted while the meter was paused
        (``meter.backend``) are not skipped: the backend's own buffers are kept by C++ alone."""
        host = tracemalloc.get_traced_memory()[0] if self.tracing else 0
        skip = self.skip | {g.untyped_storage()._cdata for g in grads if g is not None} | meter.live.keys()
        installed = sum(n for key, (ref, n) in self.made.items() if key not in skip and not ref.expired())
        everything = gc.get_objects()
        new: dict[int, int] = {}
        found: dict[int, int] = {}                    # id(tensor or storage object) -> storage key
        for key, st, o in _storages(everything):
            old = self.before.get(key)
            if key not in skip and (old is None or old.expired()):
                new[key] = st.nbytes()
                found[id(o)] = key
        host = max(0, self.host_made + host - HOST_SLACK)         # one slack for the install call and backward
        if not new:
            return installed + host
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
        return installed + sum(new[k] for k in kept) + host


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
    """The first rank on which no checked pass overlapped, or no pass could be checked (module text)."""
    eligible = 0
    for c in range(len(ranks)):
        checked, overlapped, why = 0, 0, set()
        for n, mine in enumerate(ranks[c]["passes"], 1):
            held = held_rank(n)
            if held == c or held >= len(ranks) or ranks[held]["passes"][n - 1]["hold"] is None:
                continue
            eligible += 1
            ops, woke = ranks[held]["passes"][n - 1]["hold"]
            times, seqs = mine["times"], mine["seqs"]
            j = next((j for j, s in enumerate(seqs) if s > ops), None)   # first arrival after the tested one
            if j is None or j == 0:
                why.add("it issued no collective before its last gradient arrived" if not ops else
                        f"it issued no collective after its first {ops} before its last gradient arrived")
                continue
            if woke - times[j - 1] < WINDOW_S:
                nth = "first collective" if not ops else f"collective no. {ops + 1}"
                why.add(f"the hook that issued its {nth} began {times[j - 1] - woke:+.2f} s from the held rank's wake")
                continue
            checked += 1
            overlapped += times[j] < woke
        if why and not checked:
            return (f"the grader could not test overlap on rank {c} in any pass ({'; '.join(sorted(why))}"
                    "): send each full bucket from the hook that fills it, as soon as it fills; if yours do, "
                    f"{BUSY}: run the check again")
        if checked and not overlapped:
            passes = f"{checked} pass{'es' if checked != 1 else ''} checked"
            return (f"rank {c} computed no further gradient after issuing a collective until rank {1 - c}, held back "
                    f"by the grader's own arrival hook, had woken ({passes}): your hooks block "
                    "right after each launch (a synchronous collective, a wait, a barrier or a poll, by whatever "
                    "route), so nothing overlapped; let backward go on while the bucket travels")
    return None if eligible else "the grader could not test overlap: no rank was held back in any pass"


def several(sizes, bucket: int) -> bool:
    """Whether a bucket of ``bucket`` bytes fills before the last of these gradients arrives: else
    nothing can overlap, and the row does not read the probe."""
    return sum(sizes) - max(sizes) >= bucket


def again(ranks: list[list[dict]], cases: list, relaunch, probed: list[bool]) -> list[list[dict]]:
    """The ranks' results with each case whose overlap probe timed nothing (:data:`BUSY`) run once
    more (review r27: an honest design failed the row at load 0.74, and passed the next check);
    ``relaunch(cases)``: the ranks' results for those cases alone. A case whose row does not read
    the probe (``probed[k]`` False, :func:`several`) is not run again: it changed nothing, at 2.7 s a check."""
    busy = [k for k in range(len(cases)) if probed[k] and _busy([r[k] for r in ranks])]
    if not busy:
        return ranks
    second = relaunch([cases[k] for k in busy])
    return [[second[r][busy.index(k)] if k in busy else res for k, res in enumerate(rank)]
            for r, rank in enumerate(ranks)]


def _busy(results: list[dict]) -> bool:
    """Whether a case's overlap probe timed nothing; False for a case the ranks did not finish (an
    error, a stop: its own rows say why)."""
    try:
        return BUSY in (grade_overlap(results) or "")
    except (KeyError, IndexError, TypeError):
        return False
