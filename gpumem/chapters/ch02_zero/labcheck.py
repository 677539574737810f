"""Lab 02's ``check()``: the learner's ZeRO-2 gradient hooks, run on 2 CPU ranks.

The learner writes ``install_zero2_hooks(params, grad_shards)``. On each rank the grader builds a
model, puts a :class:`gpumem.dist.gradmeter.GradMeter` on it *first* (so it sees every gradient
before the learner's hooks can free it), installs the learner's hooks and trains with
:func:`sharded_step`. Three things are graded, on models and seeds the lab never shows:

1. after the first backward, ``grad_shards[i]`` is this rank's shard of the gradient averaged
   over ranks (against a single-process gradient on the whole batch), and no ``.grad`` is left;
2. the peak of full-gradient bytes alive during backward is at most one gradient (the largest),
   where ZeRO-1 would hold all of them;
3. the weights after a few steps equal single-process ``torch.optim.AdamW``.
"""

import math

from gpumem.course.grading import Report, Row

LAB = "lab02_zero2_hooks"
FN = "install_zero2_hooks"
# (model, seed, steps): cases the lab does not show
CASES = (("tiny", 3, 3), ("mini", 5, 2))
RTOL, ATOL = 1e-4, 1e-5          # gradient shards: float32 sums in another order
W_ATOL = 1e-4                      # weights: Adam divides by sqrt(v), so rounding in tiny gradients grows


def sharded_step(params, grad_shards, m, v, t, lr, betas, eps, weight_decay) -> None:
    """The ZeRO-2 update the lab's hooks feed: each rank updates its shard of every parameter
    with the reduced gradient shard, then all ranks exchange the updated shards."""
    from gpumem.dist import zero
    for i, p in enumerate(params):
        mine = zero.my_shard(p)
        zero.adamw_update(mine, grad_shards[i], m[i], v[i], t, lr, betas, eps, weight_decay)
        p.copy_(zero.all_gather_full(mine, p.numel(), p.shape))


def lab02_rank(rank: int, world: int, source: str, cases=CASES) -> list[dict]:
    """On each rank, per case: the learner's hooks on a fresh model, trained with ``sharded_step``."""
    import torch
    import torch.distributed as dist

    from gpumem.dist import training, zero
    from gpumem.dist.gradmeter import GradMeter
    ns: dict = {"torch": torch, "dist": dist, "zero": zero, "math": math}
    exec(compile(source, f"<your {FN}>", "exec"), ns)
    out = []
    for model, seed, steps in cases:
        net = training.build(model, seed)
        params = list(net.parameters())
        data = training.batches(net.cfg, steps, world * 2, 32, seed)
        shards: dict = {}
        meter = GradMeter(params)                     # before the learner's hooks
        ns[FN](params, shards)
        m = [torch.zeros_like(zero.my_shard(p)) for p in params]
        v = [torch.zeros_like(zero.my_shard(p)) for p in params]
        first, peaks = None, []
        for t in range(1, steps + 1):
            mine = data[t - 1, rank * 2:(rank + 1) * 2]
            loss = net(mine[:, :-1], mine[:, 1:])
            meter.reset()
            loss.backward()
            peaks.append(meter.peak_full)
            if first is None:
                first = {"shards": {i: g.detach().clone() for i, g in shards.items()},
                         "grads_left": [i for i, p in enumerate(params) if p.grad is not None]}
            with torch.no_grad():
                sharded_step(params, shards, m, v, t, **training.HYPER)
            net.zero_grad(set_to_none=True)
            shards.clear()
        out.append({"first": first, "peak_full": max(peaks), "weights": [p.detach().clone() for p in params]})
    return out


def _reference(model: str, seed: int, steps: int, world: int) -> dict:
    """One process, whole batch: the first step's gradients and the weights after AdamW."""
    import torch

    from gpumem.dist import training
    net = training.build(model, seed)
    data = training.batches(net.cfg, steps, world * 2, 32, seed)
    opt = torch.optim.AdamW(net.parameters(), foreach=False, **training.HYPER)
    grads = None
    for t in range(steps):
        net(data[t, :, :-1], data[t, :, 1:]).backward()
        if grads is None:
            grads = [p.grad.detach().clone() for p in net.parameters()]
        opt.step()
        opt.zero_grad()
    return {"names": [n for n, _ in net.named_parameters()], "grads": grads,
            "weights": [p.detach().clone() for p in net.parameters()]}


def check(ns: dict, show: bool = True) -> Report:
    """Run the learner's hooks on 2 CPU ranks; grade shards, peak gradient bytes and weights;
    name the first mismatch. Never raises: an unsolved lab reports what is left."""
    import inspect

    from gpumem.dist import launch
    report = Report(LAB)
    fn = ns.get(FN)
    source = None
    if fn is not None:
        try:
            source = inspect.getsource(fn)
        except (OSError, TypeError):
            report.rows.append(Row(FN, "2 CPU ranks", "error",
                                   "could not read the function's source (define it in a notebook cell)"))
    if fn is None or (source and 'NotImplementedError("TODO' in source):
        report.rows.append(Row(FN, "2 CPU ranks", "todo", f"{FN} is still to write"))
    elif source:
        try:
            ranks = launch.run(f"{__name__}:lab02_rank", 2, progress=False, source=source)
        except launch.RankError as err:
            report.rows.append(Row(FN, "2 CPU ranks", "error", str(err).strip().splitlines()[-1]))
        else:
            for k, case in enumerate(CASES):
                _grade_case(report, case, [r[k] for r in ranks])
    if show:
        print(report.summary())
    return report


def _grade_case(report: Report, case: tuple, ranks: list[dict]) -> None:
    import torch
    model, seed, steps = case
    world = len(ranks)
    ref = _reference(model, seed, steps, world)
    names, label = ref["names"], f"{model}, seed {seed}, {world} ranks"
    # 1. the shards after the first backward, and no full gradient left behind
    bad = None
    for r, res in enumerate(ranks):
        left = res["first"]["grads_left"]
        if left:
            bad = f"{names[left[0]]} still has its full .grad on rank {r} after backward (free it)"
            break
        for i, (name, g) in enumerate(zip(names, ref["grads"])):
            c = math.ceil(g.numel() / world)
            want = torch.nn.functional.pad(g.reshape(-1), (0, c * world - g.numel()))[r * c:(r + 1) * c]
            got = res["first"]["shards"].get(i)
            if got is None:
                bad = f"grad_shards has no entry for {name} (index {i}) on rank {r}"
            elif got.shape != want.shape:
                bad = f"grad_shards[{i}] ({name}) on rank {r}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
            elif not torch.allclose(got, want, rtol=RTOL, atol=ATOL):
                diff = (got - want).abs().max().item()
                bad = f"first wrong gradient shard: {name} on rank {r}, max |got - expected| = {diff:.3g}"
            if bad:
                break
        if bad:
            break
    report.rows.append(Row(FN, f"{label}: gradient shards after backward", "wrong" if bad else "ok", bad or ""))
    # 2. the peak of full gradients alive during backward
    sizes = [4 * g.numel() for g in ref["grads"]]
    peak = max(res["peak_full"] for res in ranks)
    ok = peak <= max(sizes)
    detail = "" if ok else (f"expected at most {max(sizes):,} B (one gradient at a time; the largest is "
                            f"{names[sizes.index(max(sizes))]}), got {peak:,} B"
                            + (" = every gradient at once, as ZeRO-1 holds them" if peak >= sum(sizes) else ""))
    report.rows.append(Row(FN, f"{label}: peak full-gradient bytes during backward", "ok" if ok else "wrong", detail))
    # 3. the weights after training, against torch.optim.AdamW
    bad = None
    for r, res in enumerate(ranks):
        for name, want, got in zip(names, ref["weights"], res["weights"]):
            if not torch.allclose(got, want, rtol=RTOL, atol=W_ATOL):
                bad = f"first diverging tensor: {name} on rank {r}, max |got - expected| = " \
                      f"{(got - want).abs().max().item():.3g}"
                break
        if bad:
            break
    report.rows.append(Row(FN, f"{label}: weights after {steps} steps vs torch AdamW", "wrong" if bad else "ok",
                           bad or ""))
