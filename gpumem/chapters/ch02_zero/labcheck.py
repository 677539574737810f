"""Lab 02's ``check()``: the learner's stage-1 sharded AdamW step, run on 2 CPU ranks and
compared tensor by tensor with single-process ``torch.optim.AdamW``."""

from gpumem.course.grading import Report, Row, grade

LAB = "lab02_sharded_adamw"
LAB02_STEPS = 3


def lab02_rank(rank: int, world: int, source: str, steps: int = LAB02_STEPS) -> list[list]:
    """On each rank: train the tiny model with the learner's ``sharded_adamw_step``."""
    import torch

    from gpumem.dist import training, zero
    ns: dict = {}
    exec(compile(source, "<your sharded_adamw_step>", "exec"), ns)
    step_fn = ns["sharded_adamw_step"]
    net = training.build("tiny")
    data = training.batches(net.cfg, steps, world * 2, 32)
    params = list(net.parameters())
    m = [torch.zeros_like(zero.my_shard(p)) for p in params]
    v = [torch.zeros_like(zero.my_shard(p)) for p in params]
    history = []
    for t in range(1, steps + 1):
        mine = data[t - 1, rank * 2:(rank + 1) * 2]
        net(mine[:, :-1], mine[:, 1:]).backward()
        with torch.no_grad():
            step_fn(params, m, v, t, **training.HYPER)
        net.zero_grad(set_to_none=True)
        history.append([p.detach().clone() for p in params])
    return history


def check(ns: dict, show: bool = True) -> Report:
    """Run the learner's step on 2 CPU ranks; compare every tensor after every step with
    single-process torch.optim.AdamW on the whole batch; name the first that diverges."""
    import inspect

    from gpumem.dist import launch
    report = Report(LAB)
    fn = ns.get("sharded_adamw_step")
    if fn is None:
        grade(report, "sharded_adamw_step", None, [("2 CPU ranks vs AdamW", {}, None)])
    else:
        try:
            source = inspect.getsource(fn)
        except (OSError, TypeError):
            source = None
        if source is None:
            report.rows.append(Row("sharded_adamw_step", "2 CPU ranks vs AdamW", "error",
                                   "could not read the function's source (define it in a notebook cell)"))
        elif "NotImplementedError(\"TODO" in source:
            report.rows.append(Row("sharded_adamw_step", "2 CPU ranks vs AdamW", "todo",
                                   "sharded_adamw_step still raises NotImplementedError"))
        else:
            try:
                ranks = launch.run(f"{__name__}:lab02_rank", 2, progress=False, source=source)
            except launch.RankError as err:
                last = str(err).strip().splitlines()[-1]
                report.rows.append(Row("sharded_adamw_step", "2 CPU ranks", "error", last))
            else:
                _compare_lab02(report, ranks)
    if show:
        print(report.summary())
    return report


def _compare_lab02(report: Report, ranks: list) -> None:
    import torch

    from gpumem.dist import training
    net = training.build("tiny")
    names = [n for n, _ in net.named_parameters()]
    data = training.batches(net.cfg, LAB02_STEPS, 4, 32)
    opt = torch.optim.AdamW(net.parameters(), foreach=False, **training.HYPER)
    for t in range(LAB02_STEPS):
        net(data[t, :, :-1], data[t, :, 1:]).backward()
        opt.step()
        opt.zero_grad()
        case = f"step {t + 1}: every tensor on both ranks vs torch AdamW (rtol 1e-4, atol 1e-5)"
        bad = None
        for name, want, got0, got1 in zip(names, net.parameters(), ranks[0][t], ranks[1][t]):
            for r, got in ((0, got0), (1, got1)):
                if not torch.allclose(got, want.detach(), rtol=1e-4, atol=1e-5):
                    diff = (got - want.detach()).abs().max().item()
                    bad = f"first diverging tensor: {name} on rank {r}, max |got - expected| = {diff:.3g}"
                    break
            if bad:
                break
        report.rows.append(Row("sharded_adamw_step", case, "wrong" if bad else "ok", bad or ""))
        if bad:
            break
