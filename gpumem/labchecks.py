"""``check()`` for every lab: the learner's functions graded against traced truth.

Each lab's last cell calls ``labchecks.<lab>(globals())``. The cases are not the ones the lab
shows; the expected values come from fake-tensor traces (``gpumem.tracing``) where a trace can
say it, otherwise from the library's formulas, which tests prove against traces.
"""

from functools import lru_cache

from . import accounting, tracing
from .estimate import n_param_tensors
from .grading import Report, Row, grade
from .models import ModelConfig, with_layers

# Configurations the lab never shows (GQA ratios, odd widths, a large vocabulary so that the
# loss, not a layer, sets the forward activation peak).
_CONFIGS = [ModelConfig("lab-a", 3, 96, 6, 2, 256, 4000),
            ModelConfig("lab-b", 3, 128, 8, 8, 320, 6000)]


@lru_cache(maxsize=None)
def traced_states(cfg: ModelConfig, recipe: str) -> dict:
    tr = tracing.trace_step(cfg, recipe, seq=16)
    counters = 4 * n_param_tensors(cfg) if accounting.recipe(recipe).step_counter else 0
    return {"params": tr.peaks["params"], "grads": tr.peaks["grads"],
            "optimizer": tr.peaks["optimizer"] - counters}


@lru_cache(maxsize=None)
def traced_layer(cfg: ModelConfig, kernel: str, seq: int, batch: int) -> int:
    """One layer's saved bytes, read off two traces: depth 3 minus depth 2."""
    deep, shallow = (tracing.trace_step(with_layers(cfg, n), "mixed", kernel, seq=seq, micro_batch=batch)
                     for n in (3, 2))
    return deep.peaks["activations"] - shallow.peaks["activations"]


def _bytes(v) -> str:
    return f"{v:,} B" if isinstance(v, int) else repr(v)


def lab01(ns: dict, show: bool = True) -> Report:
    report = Report("lab01_memory_calculator")
    cases = []
    for cfg in _CONFIGS:
        for recipe in accounting.RECIPES:
            cases.append((f"{cfg.name}, {recipe}, 1 GPU (traced)",
                          dict(n_params=cfg.n_params(), recipe=recipe), traced_states(cfg, recipe)))
    for recipe, gpus, zero in [("mixed", 8, 1), ("mixed", 8, 2), ("pure-bf16", 8, 3), ("mixed-ds", 6, 3)]:
        n = _CONFIGS[0].n_params()
        s = accounting.model_states(n, recipe, gpus, zero)
        cases.append((f"{n:,} params, {recipe}, {gpus} GPUs, ZeRO-{zero}",
                      dict(n_params=n, recipe=recipe, gpus=gpus, zero=zero),
                      {"params": s.params, "grads": s.grads, "optimizer": s.optimizer}))
    grade(report, "model_state_bytes", ns.get("model_state_bytes"), cases)

    cases = []
    for cfg, seq, batch in [(_CONFIGS[0], 24, 2), (_CONFIGS[1], 32, 1)]:
        for kernel in ("flash", "naive", "eager"):
            cases.append((f"{cfg.name} d={cfg.d_model} heads={cfg.n_heads}/{cfg.n_kv_heads} seq={seq} "
                          f"batch={batch} {kernel} (traced)",
                          dict(d_model=cfg.d_model, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads,
                               ffn=cfg.ffn, seq=seq, batch=batch, kernel=kernel),
                          traced_layer(cfg, kernel, seq, batch)))
    grade(report, "layer_activation_bytes", ns.get("layer_activation_bytes"), cases, show=_bytes)
    if show:
        print(report.summary())
    return report


# ---- lab 02: the stage-1 sharded AdamW step, run on 2 CPU ranks ------------------------------
LAB02_STEPS = 3


def lab02_rank(rank: int, world: int, source: str, steps: int = LAB02_STEPS) -> list[list]:
    """On each rank: train the tiny model with the learner's ``sharded_adamw_step``."""
    import torch

    from . import zero, zero_experiments as ze
    ns: dict = {}
    exec(compile(source, "<your sharded_adamw_step>", "exec"), ns)
    step_fn = ns["sharded_adamw_step"]
    net = ze.build("tiny")
    data = ze.batches(net.cfg, steps, world * 2, 32)
    params = list(net.parameters())
    m = [torch.zeros_like(zero.my_shard(p)) for p in params]
    v = [torch.zeros_like(zero.my_shard(p)) for p in params]
    history = []
    for t in range(1, steps + 1):
        mine = data[t - 1, rank * 2:(rank + 1) * 2]
        net(mine[:, :-1], mine[:, 1:]).backward()
        with torch.no_grad():
            step_fn(params, m, v, t, **ze.HYPER)
        net.zero_grad(set_to_none=True)
        history.append([p.detach().clone() for p in params])
    return history


def lab02(ns: dict, show: bool = True) -> Report:
    """Run the learner's step on 2 CPU ranks; compare every tensor after every step with
    single-process torch.optim.AdamW on the whole batch; name the first that diverges."""
    import inspect

    import torch

    from . import launch, zero_experiments as ze
    report = Report("lab02_sharded_adamw")
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
                ranks = launch.run("gpumem.labchecks:lab02_rank", 2, progress=False, source=source)
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

    from . import zero_experiments as ze
    net = ze.build("tiny")
    names = [n for n, _ in net.named_parameters()]
    data = ze.batches(net.cfg, LAB02_STEPS, 4, 32)
    opt = torch.optim.AdamW(net.parameters(), foreach=False, **ze.HYPER)
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


CHECKS = {"lab01_memory_calculator": lab01, "lab02_sharded_adamw": lab02}
