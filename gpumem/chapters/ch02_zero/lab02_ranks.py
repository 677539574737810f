"""Lab 02's rank side: the learner's hooks trained on 2 CPU ranks, with every collective, wait and
end-of-backward callback recorded against the order in which gradients arrive.

Recording, all on the real ``torch.distributed`` (gloo) and the real autograd engine:

* a ``register_post_accumulate_grad_hook`` on every parameter (:func:`_arrive`), installed after
  the :class:`~gpumem.runs.gradmeter.GradMeter` and before the learner's hooks, numbers the
  arrivals of one backward pass (1, 2, ...) and notes, at each, the time and how many operations
  the process groups have run since backward started (their own sequence numbers); in each pass
  it holds one rank back at a drawn arrival, before the learner's hook runs (:mod:`.lab02_probe`),
  and checks that the grader's modules are as sealed before the learner's code ran
  (``lab02_watch.seal``: a change fails the case);
* every collective of ``torch.distributed`` is wrapped and the engine's ``queue_callback`` counted
  (:mod:`.lab02_watch`);
* each backward runs inside a :class:`.lab02_meter.LiveMeter`: at each arrival and when backward
  returns, the bytes made during backward still alive, less autograd's own (measured once per
  case in a backward with no hooks), are what the hooks hold, copies of gradients included; at the
  last arrival and at the end, :class:`.lab02_probe.Reach` adds what the garbage collector reaches
  that the dispatcher never showed.

A collective launched at arrival k and waited at arrival k was waited before any later gradient
could be computed: nothing overlapped with it. Launches and waits are also numbered in the order
they happen, which gives how many buckets were in flight at each launch.
"""

import functools
import math
import sys
import time

import torch

from gpumem.course import lab_intact, seeds
from gpumem.course.plain import odd_tensor

from . import lab02_bundle
from .lab02_watch import _REC, BARRIERS, REDUCE_SCATTERS, instrument  # noqa: F401 (labcheck reads them here)

FN = "install_zero2_hooks"
_TAKEN: list = []          # lab_intact's record on this rank (review r19: torch.Tensor patched on the ranks)
# a model shape the lab never shows (head dim 8, 6 heads over 2 KV heads, 3 layers)
ODD = dict(name="lab02-odd", n_layers=3, d_model=48, n_heads=6, n_kv_heads=2, ffn=136, vocab=300, teaching=True)
SPARE = ("spare.weight", "spare.bias")      # a layer the forward never calls: no gradient, ever


def build(model: str, seed: int, spare):
    """(net, names, params): a teaching Llama (registry name or ``"odd"``); ``spare`` False, or the
    places ``(weight, bias)`` of an unused layer's two parameters in ``params`` (True: first and
    in the middle)."""
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
        at = (0, len(params) // 2 + 1) if spare is True else spare
        for k in sorted((0, 1), key=lambda k: at[k]):      # the lower place first: both end where asked
            names.insert(at[k], SPARE[k])
            params.insert(at[k], (unused.weight, unused.bias)[k])
    return net, names, params


@functools.lru_cache(maxsize=None)
def grad_bytes(model: str) -> tuple[int, ...]:
    """The fp32 gradient bytes of each of ``model``'s parameters (no unused layer), built on the CPU
    (the lab's models are small) with torch's generator left as it was."""
    import torch
    with torch.random.fork_rng(devices=[]):
        return tuple(4 * p.numel() for p in build(model, 0, False)[2])


def n_params(model: str) -> int:
    """How many parameter tensors ``model`` has (no unused layer)."""
    import torch
    with torch.device("meta"):
        return len(build(model, 0, False)[2])


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


_CASE: dict = {}        # the current case, read by the grader's arrival hook alone


def _arrive(p) -> None:
    """The grader's hook, before the learner's: check the grader is as sealed, number the arrival,
    note the time and the operations the process groups ran so far; hold this rank at its drawn
    arrival if it is the held one in this pass (:mod:`.lab02_probe`); keep the bf16 case's gradient;
    sample the bytes the hooks hold."""
    from . import lab02_probe as probe
    case, rec = _CASE, _REC
    _intact(case)
    rec.arrivals += 1
    rec.landed()                                  # an output written before its proxy's wait (lab02_watch)
    if case["live"].paused is not False and not rec.depth and not case["paused"]:   # r15 #2: switched off
        case["paused"] = f"gradient arrival {rec.arrivals} of backward {rec.n_pass}"
    rec.times.append(time.monotonic())
    rec.seqs.append(rec.seq() - rec.seq0)
    if rec.hold is None and probe.held_rank(rec.n_pass) == case["rank"] and (
            rec.seqs[-1] >= case["after"][rec.n_pass - 1] or rec.arrivals >= case["n_arrivals"]):
        time.sleep(case["delay"])
        rec.hold = (rec.seqs[-1], time.monotonic())
        _intact(case)
    i = case["index"][id(p)]
    case["arrived"].add(i)
    if case["keep"] is not None:                  # the bf16 case: the gradient as it arrived
        case["keep"][i] = rec.unmetered(lambda: p.grad.detach().clone())
    own, live = case["own"], case["live"]
    mine = [q.grad for q in case["params"]] + list((case["keep"] or {}).values())    # the bf16 copies are ours
    hidden = case["reach"].hidden(live, mine) if rec.arrivals == len(own) - 1 else 0
    case["held"].append(live.bytes() - own[min(rec.arrivals, len(own)) - 1] + hidden)


def _intact(case: dict) -> None:
    """Note the first change to what the record and the probe rely on (lab02_watch.seal), or to a
    watched class (lab_intact's classes: review r20 patched ``Tensor.isnan`` in a hook and put it
    back in the end-of-backward callback, unseen by the whole check once the case ended; that one
    takes about 6 ms, too slow for every arrival: the overlap probe's timing then misses)."""
    if not case["changed"]:
        case["changed"] = case["seal"]() or (next(lab_intact.class_differences(_TAKEN[0]), None) if _TAKEN else None)


def lab02_rank(rank: int, world: int, source: str, cases: tuple, bf16: tuple | None = None,
               watch_s: float = 90.0, lone_rounds: int | None = None) -> list[dict]:
    """On each rank, per case: the learner's hooks on a fresh model, trained with ``sharded_step``;
    then, in one more entry, the ``bf16`` case (:mod:`.lab02_bf16`: one backward, watched as the
    others) and Part 2's lone reduce-scatters (:mod:`.lab02_measure`). Each case is watched for
    ``watch_s`` seconds (:func:`.lab02_probe.watchdog`); ``lone_rounds``: the lone reduce-scatters'
    rounds (None: :data:`.lab02_measure.ROUNDS`)."""
    import torch.distributed as dist

    from . import lab02_meter, lab02_probe, lab02_watch
    rec = instrument(dist, torch)
    sealed = lab02_watch.seal((sys.modules[__name__], lab02_watch, lab02_probe, lab02_meter))
    _TAKEN[:] = [lab_intact.take(contents=False)]          # every library as it was before the learner's code ran
    ns: dict = {"torch": torch, "dist": dist, "math": math}
    exec(compile(source, f"<your {FN}>", "exec"), ns)
    run = functools.partial(_case, ns, rank, world, rec, sealed, source, watch_s)
    out = [run(case) for case in cases]
    from . import lab02_measure
    out.append({"lone": lab02_measure.lone_rank(world, lone_rounds or lab02_measure.ROUNDS),
                "bf16": run((*bf16, False), True) if bf16 else None})
    return out


def _case(ns, rank, world, rec, sealed, source, watch_s, case: tuple, bf16: bool = False) -> dict:
    """One case on this rank: what the hooks did in each backward, the shards after the first, the
    weights after the last step (none in the bf16 case, which keeps the gradients as they arrived)."""
    from gpumem.runs import training, zero
    from gpumem.runs.gradmeter import GradMeter

    from . import lab02_probe as probe
    from .lab02_meter import LiveMeter, autograd_bytes
    model, seed, steps, bucket, spare = case
    undo: list = [probe.watchdog(f"rank {rank}, case {model}{' in bf16' * bf16}, seed {seed}, bucket {bucket:,} B",
                                 f"<your {FN}>", source, watch_s)]
    try:
        net, _, params = build(model, seed, spare)
        if bf16:
            net.to(torch.bfloat16)
        data = training.batches(net.cfg, steps, world * 2, 32, seed)
        shards: dict = {}
        first_batch = data[0, rank * 2:(rank + 1) * 2]
        start, order = time.monotonic(), []
        own = autograd_bytes(net, params, first_batch[:, :-1], first_batch[:, 1:], order)   # no hooks yet
        sizes = [q.numel() * q.element_size() for q in order]
        meter, live, reach = GradMeter(params), LiveMeter(params), probe.Reach(params)   # before the learner's hooks
        undo += [meter.remove, reach.stop, _CASE.clear, lambda: setattr(rec, "on_wait", None)]
        rec.meter, rec.n_pass = live, 0
        arrived: set = set()
        held: list = []                               # bytes the hooks hold, per arrival and at the end
        rng = seeds.rng()                        # refused where the learner replaced what it draws with
        _CASE.update(index={id(p): i for i, p in enumerate(params)}, arrived=arrived, held=held, reach=reach,
                     live=live, own=own, params=params, rank=rank, delay=probe.delay(time.monotonic() - start),
                     after=[probe.hold_after(sizes, bucket, rng) for _ in range(steps)], n_arrivals=len(order),
                     keep={} if bf16 else None, seal=sealed, changed=None, paused=None)
        undo += [h.remove for h in (p.register_post_accumulate_grad_hook(_arrive) for p in params)]
        # the bytes held are sampled at each arrival and at each launch's first wait too (review r22:
        # a flat copy made before the oldest bucket landed held three, unseen at arrivals)
        rec.on_wait = lambda: held.append(live.bytes() - own[min(max(rec.arrivals, 1), len(own)) - 1])
        reach.install(lambda: ns[FN](params, shards, bucket))     # what it makes and keeps counts (r29)
        m = [torch.zeros_like(zero.my_shard(p)) for p in params]
        v = [torch.zeros_like(zero.my_shard(p)) for p in params]
        first, peaks, passes = None, [], []
        for t in range(1, steps + 1):
            mine = data[t - 1, rank * 2:(rank + 1) * 2]
            loss = net(mine[:, :-1], mine[:, 1:])
            meter.reset()
            arrived.clear()
            torch.distributed.barrier()               # both ranks start backward together (lab02_probe)
            rec.start()
            reach.start()
            try:
                with live:
                    loss.backward()
            finally:
                passes.append(rec.stop())
                _intact(_CASE)
                if live.paused is not False and not _CASE["paused"]:
                    _CASE["paused"] = f"the end of backward {t}"
            passes[-1]["need"] = sum(math.ceil(params[i].numel() / world) * world for i in arrived)
            mine = [q.grad for q in params] + list((_CASE["keep"] or {}).values())
            held.append(live.bytes() - own[-1] + reach.hidden(live, mine))
            reach.stop()
            peaks.append(meter.peak_full)
            if first is None:
                if why := odd_tensor(shards):            # before the grader's own ops read them (r20)
                    raise RuntimeError(why)
                first = {"shards": {i: g.detach().clone() for i, g in shards.items()},
                         "grads_left": [i for i, p in enumerate(params) if p.grad is not None]}
            if bf16 or any(i not in shards for i in arrived):     # graded in row 1; the step needs every shard
                break
            with torch.no_grad():
                sharded_step(params, shards, m, v, t, **training.HYPER)
            net.zero_grad(set_to_none=True)
            for p in params:
                p.grad = None
            shards.clear()
        out = {"first": first, "peak_full": max(peaks), "peak_held": max(held), "passes": passes,
               "weights": [p.detach().clone() for p in params],
               "changed": _CASE["changed"] or sealed() or lab_intact.changed(_TAKEN[0]),
               "paused": _CASE["paused"]}
        if bf16:
            out.update(grads=dict(_CASE["keep"]), shards=first["shards"])
        return out
    except Exception as err:              # noqa: BLE001 - the learner's hooks raised: this case's row says so
        import traceback
        return {"error": f"{type(err).__name__}: {err}".splitlines()[0][:300]
                + lab02_bundle.where(traceback.format_exc(), source)}      # the line, r19
    finally:
        for fn in reversed(undo):
            fn()


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

