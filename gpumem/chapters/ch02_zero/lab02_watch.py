"""Lab 02's record of what one rank's hooks did during backward, on the real ``torch.distributed``
(gloo) and the real autograd engine.

* Every collective of ``torch.distributed`` is wrapped (:func:`collectives`: each public function of
  ``distributed_c10d`` that takes a ``group``, and ``batch_isend_irecv``), synchronous or not: a
  call made during backward is recorded with its name, its ``async_op``, the elements it sends (for
  a reduce-scatter) and the arrival number at its launch; an asynchronous one returns its real work
  handle inside a proxy on which any use (``wait()``, ``_work``, ``get_future()``...) records the
  arrival number at the wait; a barrier counts as a wait of every handle.
* ``torch.autograd.Variable._execution_engine`` is replaced by a proxy that counts
  ``queue_callback`` calls (the engine itself still runs every callback).
* The process groups' own sequence numbers (gloo counts every collective it runs, whoever calls it:
  a ``ProcessGroup`` method, a saved original function) are read by the grader at the start and end
  of backward and at every gradient arrival, through the method as it was before the learner's code
  ran. A collective that went around the wrappers, or a record written by hand, shows as a
  difference between the two counts.

Nothing the learner is handed closes over the record or the real functions: the wrappers are
``functools.partial`` objects of a module function reading this module's private ``_REC`` and
``_REAL``; a handle proxy keeps its launch's number alone (the real work sits in ``_WORKS``) and is
a ``Work`` as torch names it; its finalizer drops the entry (r15 #1). This raises the bar only
(``gc``, ``sys.modules``, ``__globals__`` reach anything): the source is refused statically if it
uses them (:mod:`gpumem.course.lab_reach`), and :func:`seal` checks at every arrival and pass that
what the record and the probe rely on is unchanged (r12 #1).

Measured, not refused (r15 #1, cheat S2): gloo writes an asynchronous reduce-scatter's output only
in ``wait()``. Each graded launch's output is filled with NaN (unmetered); at every later arrival
(:meth:`Record.landed`) one holding anything else while its proxy was never used was written by a
wait of the real work, whatever reached it (or by the hooks, in flight): the case fails. A launch
into a tensor subclass is refused."""

import functools
import inspect
import time
import types
import weakref

from torch.distributed import Work as _TorchWork

REDUCE_SCATTERS = ("reduce_scatter_tensor", "reduce_scatter_single", "reduce_scatter")
BARRIERS = ("barrier", "monitored_barrier")   # on gloo a barrier waits for every collective before it
NOT_COLLECTIVES = ("destroy_process_group", "new_subgroups", "new_subgroups_by_enumeration", "shrink_group",
                   "split_group")            # take a group but move no tensor of the learner's


class Record:
    """What one rank saw during the current backward pass."""

    def __init__(self):
        self.on = False
        self.depth = 0                        # inside a wrapped collective (an object collective calls others)
        self.arrivals = 0
        self.calls: dict = {}
        self.launches: list[dict] = []
        self.by_id: dict = {}                 # launch number -> launch (handle proxies keep the number)
        self.ids = 0
        self.ops = 0                          # process-group operations the recorded calls ran
        self.queued = 0
        self.events = 0                       # launches and waits, in the order they happen
        self.meter = None                     # the LiveMeter of the current case
        self.n_pass = 0                       # backward passes of the current case (lab02_probe holds ranks)
        self.times: list[float] = []          # time.monotonic() at each arrival, read by the grader's hook
        self.seqs: list[int] = []             # process-group operations before each arrival (since start)
        self.hold = None                      # (operations before the hold, monotonic time it ended)
        self.seq0 = 0
        self.groups: list = []                # the default group, captured before the learner's code ran
        self.seqfn = None                     # ProcessGroup._get_sequence_number_for_group, as it was then
        self.outputs: dict = {}               # launch number -> weakref to its NaN-filled output, until waited
        self.early = None                     # (bucket, arrival) of the first output written before its wait
        self.on_wait = None                   # called at each launch's first wait (lab02_ranks samples bytes)

    def seq(self) -> int:
        """Operations run so far on every process group (gloo numbers each collective it runs)."""
        import torch.distributed as dist
        groups = {id(g): g for g in self.groups}
        groups.update((id(g), g) for g in list(dist.distributed_c10d._world.pg_map))
        return sum(int(self.seqfn(g)) for g in groups.values())

    def start(self) -> None:
        self.on, self.arrivals, self.queued, self.events, self.ops = True, 0, 0, 0, 0
        self.calls, self.launches, self.times, self.seqs, self.by_id, self.hold = {}, [], [], [], {}, None
        self.outputs, self.early = {}, None
        self.n_pass += 1
        self.seq0 = self.seq()

    def stop(self) -> dict:
        self.on = False
        return {"calls": dict(self.calls), "launches": [dict(x) for x in self.launches],
                "arrivals": self.arrivals, "queued": self.queued, "times": list(self.times),
                "seqs": list(self.seqs), "hold": self.hold, "ops": self.ops, "seq_ops": self.seq() - self.seq0,
                "early": self.early}

    def unmetered(self, fn, *args, **kwargs):
        """``fn(...)`` with the live-bytes meter paused: what the backend allocates for a
        collective (gloo's own buffers, kept by its work handle) is not the hooks'."""
        meter, paused = self.meter, getattr(self.meter, "paused", False)
        if meter is not None:
            meter.paused = True
        try:
            return fn(*args, **kwargs)
        finally:
            if meter is not None:
                meter.paused = paused

    def landed(self) -> None:
        """At an arrival: note the first launch whose NaN-filled output holds a value although its
        proxy was never used (gloo writes it only in ``wait()``: the real work was waited)."""
        from torch.utils._python_dispatch import _disable_current_modes
        for launch_id, ref in list(self.outputs.items()):
            launch, out = self.by_id.get(launch_id), ref()
            if out is None or launch is None or launch["waited"] is not None:
                del self.outputs[launch_id]
                continue
            with _disable_current_modes():
                written = bool(out.numel()) and not bool(out.isnan().all())
            if written:
                del self.outputs[launch_id]
                if self.early is None:
                    self.early = (next(k for k, x in enumerate(self.launches, 1) if x is launch), self.arrivals)

    def waited(self, launch: dict | int | None, how: str) -> None:
        """Note the first wait of ``launch`` (or the launch of that number; by ``how``) at the current arrival."""
        launch = self.by_id.get(launch) if isinstance(launch, int) else launch
        if launch is not None and launch["waited"] is None:
            self.events += 1
            launch["waited"], launch["t_wait"], launch["how"] = self.arrivals, self.events, how
            self.on_wait and self.on_wait()   # review r22: a third flat copy made before the oldest lands


_REC = Record()
_REAL: dict = {}
_SIG: dict = {}
_WORKS: dict = {}            # launch number -> the real work handle, while its proxy lives


class Work(_TorchWork):
    """A proxy for the real work (in ``_WORKS`` under the launch's number): any use (``wait()``,
    ``get_future()``, ``_work``...) is noted as a wait at the current arrival, then passed on;
    ``is_completed()`` only when True. One class, named as torch's (a class per launch would keep
    the handle and the bucket alive in a reference cycle until the collector runs)."""

    def __init__(self, launch_id: int):
        super().__init__()
        object.__setattr__(self, "_id", launch_id)
        weakref.finalize(self, _drop, launch_id)

    def __getattribute__(self, name):
        launch_id = object.__getattribute__(self, "_id")
        work = _WORKS.get(launch_id)
        if name == "is_completed":     # review r25: a poll that finds it running waits for nothing
            return lambda: _REC.unmetered(work.is_completed) and not _REC.waited(launch_id, "is_completed()")
        _REC.waited(launch_id, "wait()" if name == "wait" else f"work.{name}")
        if name == "_work":
            return work
        real = getattr(work, name)
        return (lambda *a, **k: _REC.unmetered(real, *a, **k)) if callable(real) else real


def _drop(launch_id: int) -> None:
    """A proxy's finalizer: its real work leaves ``_WORKS``, and is handed to no one."""
    _WORKS.pop(launch_id, None)


class _Engine:
    """Autograd's engine, with ``queue_callback`` calls counted."""
    __slots__ = ("_real",)

    def __init__(self, real):
        self._real = real

    def queue_callback(self, callback):
        if _REC.on:
            _REC.queued += 1
        return self._real.queue_callback(callback)

    def __getattr__(self, name):
        return getattr(self._real, name)


def collectives(c10d) -> list[str]:
    """Every public function of ``distributed_c10d`` that takes a ``group`` and runs a collective
    or a point-to-point transfer, and ``batch_isend_irecv``."""
    names = []
    for name, fn in sorted(vars(c10d).items()):
        if name.startswith(("_", "get_", "new_")) or name in NOT_COLLECTIVES or not inspect.isfunction(fn):
            continue
        try:
            if "group" in inspect.signature(fn).parameters:
                names.append(name)
        except (TypeError, ValueError):
            continue
    return names + ["batch_isend_irecv"]


def _sent(name: str, bound: dict) -> int:
    """Elements a reduce-scatter sends from this rank (its input, or its input list)."""
    if name == "reduce_scatter":
        return sum(t.numel() for t in bound.get("input_list", ()))
    x = bound.get("input")
    return x.numel() if x is not None else 0


def _collective(name: str, *args, **kwargs):
    rec, real = _REC, _REAL[name]
    if not rec.on or rec.depth:
        return real(*args, **kwargs)
    rec.calls[name] = rec.calls.get(name, 0) + 1
    if name in BARRIERS:
        for x in rec.launches:
            rec.waited(x, f"dist.{name}()")
    try:
        bound = _SIG[name].bind(*args, **kwargs).arguments if name not in BARRIERS else {}
    except TypeError:
        bound = {}
    is_async = bool(bound.get("async_op", name in ("isend", "irecv", "batch_isend_irecv")))
    sentinel = _sentinel(bound.get("output")) if is_async and name in REDUCE_SCATTERS else None
    before = rec.seq()
    rec.depth += 1
    try:
        out = rec.unmetered(real, *args, **kwargs)
    finally:
        rec.depth -= 1
        rec.ops += rec.seq() - before
    if name in BARRIERS:
        return out
    rec.events += 1
    rec.ids += 1
    launch = {"name": name, "async": is_async, "at": rec.arrivals, "waited": None, "t": rec.events,
              "t_wait": None, "how": None, "sent": _sent(name, bound) if name in REDUCE_SCATTERS else 0}
    rec.launches.append(launch)
    rec.by_id[rec.ids] = launch
    if is_async and out is not None and not isinstance(out, list):
        _WORKS[rec.ids] = out
        if sentinel is not None:
            rec.outputs[rec.ids] = sentinel
        return Work(rec.ids)
    return out


def _sentinel(output):
    """A weak reference to a launch's output, filled with NaN (unmetered); None unless a floating
    CPU tensor (NCCL writes in the background; an integer holds no NaN)."""
    import torch
    from torch.utils._python_dispatch import _disable_current_modes
    if isinstance(output, torch.Tensor) and type(output) is not torch.Tensor:     # r21: its own isnan
        raise RuntimeError(f"your collective's output is a {type(output).__name__}: use plain tensors")
    if not isinstance(output, torch.Tensor) or not output.is_floating_point() or output.device.type != "cpu":
        return None
    with _disable_current_modes():
        output.fill_(float("nan"))
    return weakref.ref(output)


def instrument(dist, torch) -> Record:
    """Wrap the collectives (in ``torch.distributed`` and ``distributed_c10d``, where they are
    defined) and the engine's ``queue_callback``; the real ones still run. Returns the record."""
    c10d = dist.distributed_c10d
    _REC.groups = [c10d._get_default_group()]
    _REC.seqfn = type(_REC.groups[0])._get_sequence_number_for_group
    for name in collectives(c10d):
        real = _REAL.setdefault(name, getattr(c10d, name))
        _SIG[name] = inspect.signature(real)
        wrapped = functools.partial(_collective, name)
        setattr(c10d, name, wrapped)
        if hasattr(dist, name):
            setattr(dist, name, wrapped)
    variable = torch.autograd.variable.Variable
    if not isinstance(variable._execution_engine, _Engine):
        variable._execution_engine = _Engine(variable._execution_engine)
    return _REC


def seal(modules: tuple) -> "Callable[[], str | None]":
    """A check that what the record and the probe rely on is unchanged since this call: every
    global of ``modules`` and every entry of the classes they define, each function's code and
    defaults (by identity), ``time.monotonic`` and ``time.sleep``, and the record's own attributes
    (names, and the sequence-number method). The check returns the first change, or None."""
    pairs = [("time.monotonic", lambda: time.monotonic, time.monotonic), ("time.sleep", lambda: time.sleep, time.sleep),
             ("the record's attributes", lambda: (type(_REC), sorted(vars(_REC))), (type(_REC), sorted(vars(_REC)))),
             ("the record's seqfn", lambda: _REC.seqfn, _REC.seqfn)]
    for m in modules:
        space = vars(m)
        for k, v in list(space.items()):
            pairs.append((f"{m.__name__}.{k}", functools.partial(space.get, k), v))
            mine = [v] + (list(vars(v).values()) if isinstance(v, type) else [])
            if not any(getattr(f, "__module__", None) == m.__name__ for f in mine):
                continue
            entries = list(vars(v).items()) if isinstance(v, type) else [("", v)]
            for name, f in entries:
                where = f"{m.__name__}.{k}{'.' + name if name else ''}"
                if isinstance(v, type) and name:
                    pairs.append((where, functools.partial(vars(v).get, name), f))
                if isinstance(f, types.FunctionType):
                    for attr in ("__code__", "__defaults__", "__kwdefaults__", "__closure__"):
                        pairs.append((f"{where}.{attr}", functools.partial(getattr, f, attr), getattr(f, attr)))

    def changed() -> str | None:
        return next((f"{where} was replaced" for where, read, want in pairs if read() is not want
                     and not (isinstance(want, tuple) and read() == want)), None)
    return changed
