"""Lab 02's ``check()``: the learner's bucketed ZeRO-2 gradient hooks, run on 2 CPU ranks.

The learner writes ``install_zero2_hooks(params, grad_shards, bucket_bytes)`` with
``torch.distributed`` alone (no ``gpumem`` helpers). On each rank the grader builds a model, puts
a :class:`gpumem.runs.gradmeter.GradMeter` on it *first* (so it sees every gradient before the
learner's hooks can free it), installs the learner's hooks and trains with :func:`sharded_step`,
counting the collectives called during each backward. Graded per case (models, seeds and
bucket sizes the lab never shows):

1. when ``backward()`` returns, ``grad_shards[i]`` is this rank's shard of the gradient averaged
   over ranks (against a single-process gradient on the whole batch) and no ``.grad`` is left:
   the last, partly filled bucket went out before backward returned;
2. the peak of full-gradient bytes alive during backward is at most the bucket plus the largest
   gradient, where ZeRO-1 would hold all of them;
3. gradients leave by reduce-scatter (no all-reduce), one collective per bucket: a bucket larger
   than the model means one call per backward;
4. the weights after a few steps equal single-process ``torch.optim.AdamW``.
"""

import ast
import math

from gpumem.course.grading import Report, Row, case_seconds, failure_line, kind, run_case
from gpumem.errors import RunFailure

LAB = "lab02_zero2_hooks"
FN = "install_zero2_hooks"
# (model, seed, steps, bucket_bytes): cases the lab does not show
CASES = (("tiny", 3, 3, 0), ("mini", 5, 2, 200_000), ("tiny", 7, 2, 10**7))
RTOL, ATOL = 1e-4, 1e-5          # gradient shards: float32 sums in another order
W_ATOL = 1e-4                      # weights: Adam divides by sqrt(v), so rounding in tiny gradients grows
COLLECTIVES = ("reduce_scatter_tensor", "reduce_scatter", "all_reduce", "all_gather", "all_gather_into_tensor",
               "broadcast", "all_to_all_single")


def sharded_step(params, grad_shards, m, v, t, lr, betas, eps, weight_decay) -> None:
    """The ZeRO-2 update the lab's hooks feed: each rank updates its shard of every parameter
    with the reduced gradient shard, then all ranks exchange the updated shards."""
    from gpumem.runs import zero
    for i, p in enumerate(params):
        mine = zero.my_shard(p)
        zero.adamw_update(mine, grad_shards[i], m[i], v[i], t, lr, betas, eps, weight_decay)
        p.copy_(zero.all_gather_full(mine, p.numel(), p.shape))


def gpumem_imports(source: str) -> list[str]:
    """Modules of ``gpumem`` the learner's source imports (the lab asks for torch.distributed alone)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        found += [n for n in names if n.split(".")[0] == "gpumem"]
    return found


def _counting(dist, calls: dict, on: list) -> None:
    """Wrap the collectives of ``torch.distributed`` so that calls made while ``on[0]`` is set are
    counted (the real collective still runs)."""
    for name in COLLECTIVES:
        real = getattr(dist, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            if on[0]:
                calls[_name] = calls.get(_name, 0) + 1
            return _real(*args, **kwargs)
        setattr(dist, name, counted)


def lab02_rank(rank: int, world: int, source: str, cases=CASES) -> list[dict]:
    """On each rank, per case: the learner's hooks on a fresh model, trained with ``sharded_step``."""
    import torch
    import torch.distributed as dist

    from gpumem.runs import training, zero
    from gpumem.runs.gradmeter import GradMeter
    calls: dict = {}
    on = [False]
    _counting(dist, calls, on)
    ns: dict = {"torch": torch, "dist": dist, "math": math}
    exec(compile(source, f"<your {FN}>", "exec"), ns)
    out = []
    for model, seed, steps, bucket in cases:
        net = training.build(model, seed)
        params = list(net.parameters())
        data = training.batches(net.cfg, steps, world * 2, 32, seed)
        shards: dict = {}
        meter = GradMeter(params)                     # before the learner's hooks
        ns[FN](params, shards, bucket)
        m = [torch.zeros_like(zero.my_shard(p)) for p in params]
        v = [torch.zeros_like(zero.my_shard(p)) for p in params]
        first, peaks, per_backward = None, [], []
        for t in range(1, steps + 1):
            mine = data[t - 1, rank * 2:(rank + 1) * 2]
            loss = net(mine[:, :-1], mine[:, 1:])
            meter.reset()
            calls.clear()
            on[0] = True
            loss.backward()
            on[0] = False
            per_backward.append(dict(calls))
            peaks.append(meter.peak_full)
            if first is None:
                first = {"shards": {i: g.detach().clone() for i, g in shards.items()},
                         "grads_left": [i for i, p in enumerate(params) if p.grad is not None]}
            missing = [i for i in range(len(params)) if i not in shards]
            if missing:                               # graded in row 1; the step needs every shard
                break
            with torch.no_grad():
                sharded_step(params, shards, m, v, t, **training.HYPER)
            net.zero_grad(set_to_none=True)
            shards.clear()
        meter.remove()
        out.append({"first": first, "peak_full": max(peaks), "calls": per_backward,
                    "weights": [p.detach().clone() for p in params]})
    return out


def _reference(model: str, seed: int, steps: int, world: int) -> dict:
    """One process, whole batch: the first step's gradients and the weights after AdamW."""
    import torch

    from gpumem.runs import training
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
    """Run the learner's hooks on 2 CPU ranks; grade shards, peak gradient bytes, collectives and
    weights; name the first mismatch. Never raises: an unsolved lab reports what is left."""
    report = Report(LAB)
    fn = ns.get(FN)
    source, problem = _source_of(fn) if fn is not None else (None, "")
    if problem:
        report.rows.append(Row(FN, "2 CPU ranks", "error", problem))
    elif fn is None or 'NotImplementedError("TODO' in source:
        report.rows.append(Row(FN, "2 CPU ranks", "todo", f"{FN} is still to write"))
    elif gpumem_imports(source):
        report.rows.append(Row(FN, "torch.distributed only", "wrong",
                               f"it imports {gpumem_imports(source)[0]}: write the padding, the layout and "
                               "the reduce-scatter with torch.distributed yourself"))
    else:
        def body():
            from gpumem.runs import launch
            try:                                 # the learner's code runs on the ranks
                ranks = launch.run(f"{__name__}:lab02_rank", 2, progress=False, source=source)
            except (launch.RankError, RunFailure) as err:
                return "error", failure_line(err)
            for k, case in enumerate(CASES):
                run_case(report, FN, _label(case, 2), lambda: _grade_case(report, case, [r[k] for r in ranks]))
        run_case(report, FN, "2 CPU ranks", body, case_seconds(cases=len(CASES)))
    if show:
        print(report.summary())
    return report


def _source_of(fn) -> tuple[str, str]:
    """(source, problem): the learner's function as text the ranks can run, or why it cannot be."""
    import inspect
    import textwrap
    if not callable(fn):
        return "", f"{FN} is {kind(fn)}, not a function"
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return "", "could not read the function's source (define it in a notebook cell)"
    if not any(isinstance(n, ast.FunctionDef) and n.name == FN for n in tree.body):
        return "", f"define it as `def {FN}(params, grad_shards, bucket_bytes):` in a cell (the ranks run that source)"
    return source, ""


def _label(case: tuple, world: int) -> str:
    model, seed, steps, bucket = case
    return f"{model}, seed {seed}, bucket {bucket:,} B, {world} ranks"


def _grade_shards(ranks: list[dict], ref: dict, world: int) -> str | None:
    """The first wrong or missing shard after the first backward, or a full gradient left behind."""
    import torch
    names = ref["names"]
    for r, res in enumerate(ranks):
        left = res["first"]["grads_left"]
        if left and left[0] not in res["first"]["shards"]:
            return (f"{names[left[0]]} has its full .grad and no shard on rank {r} when backward returns: "
                    "was the last, partly filled bucket sent?")
        if left:
            return f"{names[left[0]]} still has its full .grad on rank {r} when backward returns (free it)"
        for i, (name, g) in enumerate(zip(names, ref["grads"])):
            c = math.ceil(g.numel() / world)
            want = torch.nn.functional.pad(g.reshape(-1), (0, c * world - g.numel()))[r * c:(r + 1) * c]
            got = res["first"]["shards"].get(i)
            if got is None:
                return (f"grad_shards has no entry for {name} (index {i}) on rank {r} when backward returns "
                        "(was the last, partly filled bucket sent?)")
            if got.shape != want.shape:
                return f"grad_shards[{i}] ({name}) on rank {r}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
            if not torch.allclose(got, want, rtol=RTOL, atol=ATOL):
                return (f"first wrong gradient shard: {name} on rank {r}, max |got - expected| = "
                        f"{(got - want).abs().max().item():.3g}")
    return None


def _grade_calls(ranks: list[dict], n_tensors: int, total: int, bucket: int) -> str | None:
    """Gradients leave by reduce-scatter only, one collective per bucket."""
    most = 1 if bucket >= total else n_tensors if bucket == 0 else min(n_tensors, 2 * math.ceil(total / bucket) + 1)
    for res in ranks:
        for calls in res["calls"]:
            other = {k: v for k, v in calls.items() if not k.startswith("reduce_scatter")}
            if other:
                name = next(iter(other))
                return (f"backward called {name} {other[name]} time(s): only reduce-scatters are needed "
                        "(an all-reduce moves twice the bytes)")
            rs = sum(calls.values())
            if rs == 0:
                return "no reduce-scatter ran during backward"
            if rs > most:
                return (f"{rs} reduce-scatters in one backward; with a {bucket:,}-byte bucket and {total:,} bytes "
                        f"of gradients at most {most} (one collective per bucket)")
    return None


def _grade_case(report: Report, case: tuple, ranks: list[dict]) -> None:
    import torch
    model, seed, steps, bucket = case
    world = len(ranks)
    ref = _reference(model, seed, steps, world)
    names, label = ref["names"], _label(case, world)
    bad = _grade_shards(ranks, ref, world)
    report.rows.append(Row(FN, f"{label}: gradient shards when backward returns", "wrong" if bad else "ok",
                           bad or ""))
    sizes = [4 * g.numel() for g in ref["grads"]]
    peak = max(res["peak_full"] for res in ranks)
    ok = peak <= bucket + max(sizes)
    detail = "" if ok else (f"expected at most {bucket + max(sizes):,} B (the bucket, {bucket:,} B, plus the "
                            f"largest gradient, {names[sizes.index(max(sizes))]}), got {peak:,} B"
                            + (" = every gradient at once, as ZeRO-1 holds them" if peak >= sum(sizes) else ""))
    report.rows.append(Row(FN, f"{label}: peak full-gradient bytes during backward", "ok" if ok else "wrong", detail))
    bad = _grade_calls(ranks, len(sizes), sum(sizes), bucket)
    report.rows.append(Row(FN, f"{label}: collectives during backward", "wrong" if bad else "ok", bad or ""))
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
