"""Lab 02's rank side: the learner's hooks trained on 2 CPU ranks, with every collective, wait and
end-of-backward callback recorded against the order in which gradients arrive.

Recording, all on the real ``torch.distributed`` (gloo) and the real autograd engine:

* a ``register_post_accumulate_grad_hook`` on every parameter, installed after the
  :class:`~gpumem.runs.gradmeter.GradMeter` and before the learner's hooks, numbers the arrivals
  of one backward pass (1, 2, ...);
* the collectives of ``torch.distributed`` (and ``distributed_c10d``) are wrapped: a reduce-scatter
  records the arrival number at its launch and its ``async_op``; an asynchronous one returns its
  real work handle inside a proxy on which any use (``wait()``, ``_work``, ``get_future()``...)
  records the arrival number at the wait; a barrier counts as a wait of every handle;
* ``torch.autograd.Variable._execution_engine`` is replaced by a proxy that counts
  ``queue_callback`` calls (the engine itself still runs every callback);
* each backward runs inside a :class:`.lab02_meter.LiveMeter`: at each arrival and when backward
  returns, the bytes made during backward still alive, less autograd's own (measured once per
  case in a backward with no hooks), are what the hooks hold, copies of gradients included; at the
  last arrival and at the end, :class:`.lab02_probe.Reach` adds what the garbage collector reaches
  that the dispatcher never showed; and one rank is held back before it joins (:mod:`.lab02_probe`).

A collective launched at arrival k and waited at arrival k was waited before any later gradient
could be computed: nothing overlapped with it. Launches and waits are also numbered in the order
they happen, which gives how many buckets were in flight at each launch.
"""

import inspect
import math
import time

FN = "install_zero2_hooks"
COLLECTIVES = ("reduce_scatter_tensor", "reduce_scatter", "all_reduce", "all_gather", "all_gather_into_tensor",
               "broadcast", "all_to_all_single", "barrier", "monitored_barrier")
BARRIERS = ("barrier", "monitored_barrier")   # on gloo a barrier waits for every collective before it
# a model shape the lab never shows (head dim 8, 6 heads over 2 KV heads, 3 layers)
ODD = dict(name="lab02-odd", n_layers=3, d_model=48, n_heads=6, n_kv_heads=2, ffn=136, vocab=300, teaching=True)
SPARE = ("spare.weight", "spare.bias")      # a layer the forward never calls: no gradient, ever


def build(model: str, seed: int, spare: bool):
    """(net, names, params): a teaching Llama (registry name or ``"odd"``), with the two parameters
    of an unused layer put first and in the middle of ``params`` when ``spare``."""
    import torch

    from gpumem.memory import models
    from gpumem.memory.llama import Llama
    from gpumem.runs import training
    if model == "odd":
        torch.manual_seed(seed)
        net = Llama(models.ModelConfig(**ODD))
    else:
        net = training.build(model, seed)
    names, params = map(list, zip(*net.named_parameters()))
    if spare:
        unused = torch.nn.Linear(24, 10)
        mid = len(params) // 2
        names[mid:mid] = [SPARE[1]]
        params[mid:mid] = [unused.bias]
        names.insert(0, SPARE[0])
        params.insert(0, unused.weight)
    return net, names, params


class Record:
    """What one rank saw during the current backward pass."""

    def __init__(self):
        self.on = False
        self.arrivals = 0
        self.calls: dict = {}
        self.launches: list[dict] = []
        self.queued = 0
        self.events = 0                       # launches and waits, in the order they happen
        self.meter = None                     # the LiveMeter of the current case
        self.n_pass = 0                       # backward passes of the current case (lab02_probe holds ranks)
        self.times: list[float] = []          # time.monotonic() at each arrival

    def start(self) -> None:
        self.on, self.arrivals, self.queued, self.events = True, 0, 0, 0
        self.calls, self.launches, self.times = {}, [], []
        self.n_pass += 1

    def stop(self) -> dict:
        self.on = False
        return {"calls": dict(self.calls), "launches": [dict(x) for x in self.launches],
                "arrivals": self.arrivals, "queued": self.queued, "times": list(self.times)}

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

    def waited(self, launch: dict, how: str) -> None:
        """Note the first wait of ``launch`` (by ``how``) at the current arrival."""
        if launch["waited"] is None:
            self.events += 1
            launch["waited"], launch["t_wait"], launch["how"] = self.arrivals, self.events, how


class _Handle:
    """The real work handle behind a proxy: any use of it (``wait()``, ``is_completed()``,
    ``get_future()``, ``_work``, ...) is noted as a wait at the current arrival, then passed on.
    (One class for all: a class made per launch would keep its handle, and the bucket's tensors,
    alive in a reference cycle until the garbage collector runs.)"""
    __slots__ = ("_h",)

    def __init__(self, work, launch: dict, rec: "Record"):
        object.__setattr__(self, "_h", (work, launch, rec))

    def __getattribute__(self, name):
        work, launch, rec = object.__getattribute__(self, "_h")
        rec.waited(launch, "wait()" if name == "wait" else f"work.{name}")
        if name in ("_work", "_h"):
            return work
        real = getattr(work, name)
        return (lambda *a, **k: rec.unmetered(real, *a, **k)) if callable(real) else real


class _Engine:
    """Autograd's engine, with ``queue_callback`` calls counted."""

    def __init__(self, real, rec: Record):
        self._real, self._rec = real, rec

    def queue_callback(self, callback):
        if self._rec.on:
            self._rec.queued += 1
        return self._real.queue_callback(callback)

    def __getattr__(self, name):
        return getattr(self._real, name)


def instrument(dist, torch, rec: Record) -> None:
    """Wrap the collectives (in ``torch.distributed`` and ``distributed_c10d``, where they are
    defined) and the engine's ``queue_callback``; the real ones still run. A barrier counts as a
    wait of every reduce-scatter in flight; a held rank's reduce-scatter joins late (:mod:`.lab02_probe`)."""
    from . import lab02_probe as probe
    c10d = dist.distributed_c10d
    for name in COLLECTIVES:
        real = getattr(c10d, name)
        sig = inspect.signature(real)

        def wrapped(*args, _real=real, _name=name, _sig=sig, **kwargs):
            if not rec.on:
                return _real(*args, **kwargs)
            rec.calls[_name] = rec.calls.get(_name, 0) + 1
            if _name in BARRIERS:
                for x in rec.launches:
                    rec.waited(x, f"dist.{_name}()")
            t_join = probe.hold(rec, dist.get_rank()) if _name.startswith("reduce_scatter") else 0.0
            out = rec.unmetered(_real, *args, **kwargs)
            if _name.startswith("reduce_scatter"):
                try:
                    is_async = bool(_sig.bind(*args, **kwargs).arguments.get("async_op", False))
                except TypeError:
                    is_async = False
                rec.events += 1
                launch = {"async": is_async, "at": rec.arrivals, "waited": None, "t": rec.events,
                          "t_wait": None, "how": None, "t_join": t_join}
                rec.launches.append(launch)
                if is_async and out is not None:
                    return _Handle(out, launch, rec)
            return out
        setattr(dist, name, wrapped)
        setattr(c10d, name, wrapped)
    variable = torch.autograd.variable.Variable
    if not isinstance(variable._execution_engine, _Engine):
        variable._execution_engine = _Engine(variable._execution_engine, rec)


def sharded_step(params, grad_shards, m, v, t, lr, betas, eps, weight_decay) -> None:
    """The ZeRO-2 update the lab's hooks feed: each rank updates its shard of every parameter
    that got a gradient with the reduced gradient shard, then all ranks exchange the updated
    shards. A parameter with no shard this step is skipped, as ``torch.optim`` skips a ``.grad``
    of ``None``."""
    from gpumem.runs import zero
    for i, p in enumerate(params):
        if i not in grad_shards:
            continue
        mine = zero.my_shard(p)
        zero.adamw_update(mine, grad_shards[i], m[i], v[i], t, lr, betas, eps, weight_decay)
        p.copy_(zero.all_gather_full(mine, p.numel(), p.shape))


def lab02_rank(rank: int, world: int, source: str, cases: tuple) -> list[dict]:
    """On each rank, per case: the learner's hooks on a fresh model, trained with ``sharded_step``."""
    import torch
    import torch.distributed as dist

    from gpumem.runs import training, zero
    from gpumem.runs.gradmeter import GradMeter

    from .lab02_meter import LiveMeter, autograd_bytes
    from .lab02_probe import Reach
    rec = Record()
    instrument(dist, torch, rec)
    ns: dict = {"torch": torch, "dist": dist, "math": math}
    exec(compile(source, f"<your {FN}>", "exec"), ns)
    out = []
    for model, seed, steps, bucket, spare in cases:
        net, _, params = build(model, seed, spare)
        data = training.batches(net.cfg, steps, world * 2, 32, seed)
        shards: dict = {}
        first_batch = data[0, rank * 2:(rank + 1) * 2]
        own = autograd_bytes(net, params, first_batch[:, :-1], first_batch[:, 1:])   # no hooks yet
        meter, live, reach = GradMeter(params), LiveMeter(params), Reach(params)   # before the learner's hooks
        rec.meter, rec.n_pass = live, 0
        arrived: set = set()
        held: list = []                               # bytes the hooks hold, per arrival and at the end

        def count(p, _index={id(p): i for i, p in enumerate(params)}, _arrived=arrived, _held=held):
            rec.arrivals += 1
            rec.times.append(time.monotonic())
            _arrived.add(_index[id(p)])
            hidden = reach.hidden(live, [q.grad for q in params]) if rec.arrivals == len(own) - 1 else 0
            _held.append(live.bytes() - own[min(rec.arrivals, len(own)) - 1] + hidden)
        handles = [p.register_post_accumulate_grad_hook(count) for p in params]
        ns[FN](params, shards, bucket)
        m = [torch.zeros_like(zero.my_shard(p)) for p in params]
        v = [torch.zeros_like(zero.my_shard(p)) for p in params]
        first, peaks, passes = None, [], []
        for t in range(1, steps + 1):
            mine = data[t - 1, rank * 2:(rank + 1) * 2]
            loss = net(mine[:, :-1], mine[:, 1:])
            meter.reset()
            arrived.clear()
            dist.barrier()                            # both ranks start backward together (lab02_probe)
            rec.start()
            reach.start()
            try:
                with live:
                    loss.backward()
            finally:
                passes.append(rec.stop())
            held.append(live.bytes() - own[-1] + reach.hidden(live, [q.grad for q in params]))
            reach.stop()
            peaks.append(meter.peak_full)
            if first is None:
                first = {"shards": {i: g.detach().clone() for i, g in shards.items()},
                         "grads_left": [i for i, p in enumerate(params) if p.grad is not None]}
            if any(i not in shards for i in arrived):     # graded in row 1; the step needs every shard
                break
            with torch.no_grad():
                sharded_step(params, shards, m, v, t, **training.HYPER)
            net.zero_grad(set_to_none=True)
            for p in params:
                p.grad = None
            shards.clear()
        meter.remove()
        for h in handles:
            h.remove()
        out.append({"first": first, "peak_full": max(peaks), "peak_held": max(held), "passes": passes,
                    "weights": [p.detach().clone() for p in params]})
    return out


def reference(model: str, seed: int, steps: int, world: int, spare: bool) -> dict:
    """One process, whole batch: the first step's gradients (None where none) and the weights
    after ``torch.optim.AdamW``."""
    import torch

    from gpumem.runs import training
    net, names, params = build(model, seed, spare)
    data = training.batches(net.cfg, steps, world * 2, 32, seed)
    opt = torch.optim.AdamW(params, foreach=False, **training.HYPER)
    grads = None
    for t in range(steps):
        net(data[t, :, :-1], data[t, :, 1:]).backward()
        if grads is None:
            grads = [None if p.grad is None else p.grad.detach().clone() for p in params]
        opt.step()
        opt.zero_grad()
    return {"names": names, "grads": grads, "weights": [p.detach().clone() for p in params]}

