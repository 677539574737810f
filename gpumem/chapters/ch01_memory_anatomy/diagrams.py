"""Chapter 01's diagrams and tables, rendered from the library's numbers (never typed by hand).

``scenario_box`` re-draws the study note's opening scenario for any model, recipe, sequence,
batch, GPU and GPU count, against capacity and usable memory; ``recipe_box`` the per-recipe
table and ``recipe_names`` what the frameworks call each recipe; ``lifecycle_box`` who holds
what, when, from a traced timeline; ``adamw_table`` the optimizer step's workspace by AdamW
implementation; ``scale_table`` memory and time at 8B / 70B / 405B; ``scenario_explorer`` puts
widgets on the scenario.
"""

from gpumem import units
from gpumem.course.drawing import WIDTH, bar, box
from gpumem.memory import accounting, gpus as gpu_table, models, speed
from gpumem.memory.estimate import estimate


def scenario_box(model: str = "llama-3-70b", recipe: str = "mixed", seq: int = 4096,
                 micro_batch: int = 1, gpus: int = 8, gpu: str = "h100-80gb",
                 checkpoint: str = "none", attention: str = "flash") -> str:
    """One training step without any sharding, against what ``gpus`` GPUs report and can use."""
    est = estimate(model=model, recipe=recipe, seq=seq, micro_batch=micro_batch,
                   checkpoint=checkpoint, attention=attention)
    cfg, r, g = models.get(model), accounting.recipe(recipe), gpu_table.get(gpu)
    d = est.as_dict()["per_gpu"]
    have, room = gpus * g.capacity, gpus * gpu_table.usable(g)
    rows = [("parameters", d["params"], f"{r.params} B x {cfg.n_params() / 1e9:.2f} B"),
            ("gradients", d["grads"], f"{r.grads} B x params"),
            ("optimizer", d["optimizer"], f"{r.optimizer_bytes} B x params"),
            ("activations", d["activations"], f"{attention}, ckpt {checkpoint}")]
    lines = [f"{model}, recipe {recipe}, seq {seq} x batch {micro_batch}", ""]
    for name, value, how in rows:
        lines.append(f"{name:12s}{units.fmt(value):>13s}  {bar(value, d['total'])}  {how}")
    lines.append("-" * (WIDTH - 4))
    lines.append(f"{'total':12s}{units.fmt(d['total']):>13s}")
    lines.append(f"{'capacity':12s}{units.fmt(have):>13s}  = {gpus} x {g.capacity // units.MiB:,} MiB "
                 f"({g.label}, as reported)")
    lines.append(f"{'usable':12s}{units.fmt(room):>13s}  = {gpus} x {units.fmt(gpu_table.usable(g))} "
                 "(capacity - reserve)")
    r_ = gpu_table.DEFAULT_RESERVE
    lines.append(f"    reserve per GPU: {units.fmt(r_.context, 'GiB', 0)} CUDA context + "
                 f"{units.fmt(r_.nccl, 'GiB', 0)} NCCL + {r_.fragmentation:.0%} fragmentation")
    if d["total"] > have:
        verdict = f"does NOT fit: over the capacity by {units.fmt(d['total'] - have)}"
    elif d["total"] > room:
        verdict = (f"under capacity by {units.fmt(have - d['total'])}, over usable by "
                   f"{units.fmt(d['total'] - room)}: no headroom")
    else:
        verdict = f"fits the usable memory, {units.fmt(room - d['total'])} to spare"
    lines.append(f"-> {verdict}")
    lines.append(f"   even split {gpus} ways: {units.fmt(d['total'] / gpus)} per GPU, against "
                 f"{units.fmt(gpu_table.usable(g))} usable")
    return box("Memory of one training step, nothing sharded", lines)


def recipe_box() -> str:
    """The bytes-per-parameter table of every recipe, drawn in a box."""
    return box("Bytes per parameter, by recipe", accounting.recipe_table().splitlines(), width=86)


# What each recipe is called where people train. Sources: DeepSpeed 0.19.8 runtime/precision_config.py
# and runtime/config.py (bf16_master_weights_and_grads and bf16_optimizer_states need ZeRO 1-3);
# PyTorch FSDP's MixedPrecision and FSDP2's MixedPrecisionPolicy (the sharded parameters keep
# their fp32 dtype; param_dtype is the compute copy); Megatron Core's distributed-optimizer guide
# (18 B per parameter for 16-bit parameters with fp32 gradients, 16 for fp32) and Megatron-LM's
# arguments (--bf16 turns on fp32 gradient accumulation and all-reduce).
_NAMES = {
    "pure-bf16": [("DeepSpeed", '"bf16": {"enabled": true, "bf16_master_weights_and_grads": true, '
                                '"bf16_optimizer_states": true}, ZeRO 1-3 only'),
                  ("FSDP", "a bf16 model (model.to(torch.bfloat16)), no MixedPrecision; torch AdamW "
                           "keeps m and v in the parameters' dtype"),
                  ("Megatron", "not a standard setting")],
    "mixed": [("DeepSpeed", '"bf16": {"enabled": true}, bf16 weights with fp32 master and moments'),
              ("FSDP", "MixedPrecision(param_dtype=torch.bfloat16) (FSDP2: MixedPrecisionPolicy): the "
                       "fp32 shards are the master, 4 + 4 + 8 = 16 B"),
              ("Megatron", "-")],
    "mixed-ds": [("DeepSpeed", '"bf16": {"enabled": true}, as its estimator counts it: fp32 gradients too'),
                 ("FSDP", "-"),
                 ("Megatron", "--bf16 (gradients accumulated and all-reduced in fp32); "
                              "--use-distributed-optimizer shards the 12 B")],
    "fp32": [("DeepSpeed", "no bf16 or fp16 section"), ("FSDP", "no MixedPrecision, an fp32 model"),
             ("Megatron", "neither --bf16 nor --fp16")],
}


def recipe_names() -> str:
    """Each recipe's name in DeepSpeed's config, PyTorch FSDP/FSDP2 and Megatron-LM."""
    lines = []
    for recipe, names in _NAMES.items():
        for i, (framework, how) in enumerate(names):
            head = f"{recipe:10s}{accounting.recipe(recipe).total:>3d} B" if i == 0 else " " * 15
            lines.append(f"{head}  {framework:10s} {how}")
    return "\n".join(lines)


def lifecycle_box(tl, moments: tuple[str, ...] = ("forward peak", "backward peak", "backward ends",
                                                   "optimizer peak")) -> str:
    """Who holds what, when: bytes per category at named moments of a traced timeline (GB)."""
    at = tl.moments()
    cats = list(tl.series)
    lines = [f"Who holds what, when: {tl.label} (GB = 10^9 bytes)",
             f"{'moment':15s}" + "".join(f"{c[:11]:>12s}" for c in cats) + f"{'total':>9s}  in"]
    for name in moments:
        i = at[name]
        row = tl.at(i)
        lines.append(f"{name:15s}" + "".join(f"{row[c] / units.GB:>12.1f}" for c in cats)
                     + f"{tl.total(i) / units.GB:>9.1f}  {tl.modules[i] or tl.phases[i]}")
    peak = tl.peak()
    lines.append(f"the step's peak: {units.fmt(tl.total(peak))}, in the {tl.phases[peak]} phase "
                 f"(operator {peak:,} of {len(tl):,})")
    return "\n".join(lines)


def adamw_table(traces: dict) -> str:
    """The optimizer step's workspace (the temporaries' peak) by AdamW implementation."""
    w = max(len(n) for n in [*traces, "AdamW implementation"])
    lines = [f"{'AdamW implementation':{w}s} {'temporaries peak':>17s}  at {'step peak':>12s}  at"]
    for name, tr in traces.items():
        lines.append(f"{name:{w}s} {units.fmt(tr.peaks['temporaries']):>17s}  {str(tr.peak_moments['temporaries']):14s}"
                     f"{units.fmt(tr.total_peak):>11s}  {tr.total_peak_moment}")
    return "\n".join(lines)


def scale_table(names=("llama-3-8b", "llama-3-70b", "llama-3.1-405b"), seq: int = 4096,
                gpu: str = "h100-80gb", gpus: int = 8, mfu: float = speed.MFU) -> str:
    """Memory and time at scale: model states and activations, and seconds of compute and of the
    optimizer step on ``gpu`` at ``mfu`` (one sequence per GPU)."""
    g = gpu_table.get(gpu)
    lines = [f"{'model':15s} {'states':>10s} {'activations':>12s} {'= GPUs':>7s} {'6*Psi*T':>9s} {'+attn':>6s}"
             f" {'compute':>8s} {'+ recompute':>12s} {'AdamW step':>11s} {'AdamW / ' + str(gpus):>10s}"]
    for name in names:
        cfg = models.get(name)
        n = cfg.n_params()
        d = estimate(model=name, seq=seq).as_dict()["per_gpu"]
        flops = speed.train_flops(n, seq)
        need = (d["params"] + d["grads"] + d["optimizer"] + d["activations"]) / gpu_table.usable(g)
        attn = speed.attention_flops(cfg, seq) / flops
        lines.append(f"{name:15s} {units.fmt(d['params'] + d['grads'] + d['optimizer'], digits=0):>10s} "
                     f"{units.fmt(d['activations'], digits=0):>12s} {need:>7.1f} {flops:>9.2e} {attn:>6.1%} "
                     f"{speed.seconds(flops, g, mfu):>7.2f}s "
                     f"{speed.seconds(speed.train_flops(n, seq, recompute=True), g, mfu):>11.2f}s "
                     f"{speed.optimizer_seconds(n, 'mixed', g):>10.2f}s "
                     f"{speed.optimizer_seconds(n, 'mixed', g, gpus, zero=1):>9.3f}s")
    lines += [f"mixed recipe, seq {seq}, flash, no checkpointing, one sequence per GPU",
              f"= GPUs: usable {g.label}s the step needs, before any sharding",
              "6*Psi*T: FLOPs per sequence; +attn: the score FLOPs (12*L*h*s per token) it leaves out",
              f"compute at {mfu:.0%} MFU of {g.bf16_flops / 1e12:.0f} TFLOP/s; + recompute: 8*Psi*T",
              f"AdamW: {speed.optimizer_bytes_per_param('mixed')} B/param over {g.hbm / 1e12:.2f} TB/s HBM, "
              f"all parameters / the 1/{gpus} shard of ZeRO"]
    return "\n".join(lines)


def scenario_explorer():
    """Dropdowns and sliders that re-render :func:`scenario_box` (plain text without widgets)."""
    from gpumem.course.quiz import widgets_available
    if not widgets_available():
        print(scenario_box())
        return None
    import ipywidgets as w
    from IPython.display import display
    from gpumem.memory.policies import KERNELS, POLICIES

    controls = dict(
        model=w.Dropdown(options=[n for n, c in models.REGISTRY.items() if not c.teaching], value="llama-3-70b"),
        recipe=w.Dropdown(options=accounting.RECIPES, value="mixed"),
        seq=w.SelectionSlider(options=[512, 1024, 2048, 4096, 8192, 16384, 32768], value=4096),
        micro_batch=w.IntSlider(min=1, max=16, value=1),
        gpus=w.IntSlider(min=1, max=64, value=8),
        gpu=w.Dropdown(options=list(gpu_table.REGISTRY), value="h100-80gb"),
        checkpoint=w.Dropdown(options=POLICIES, value="none"),
        attention=w.Dropdown(options=KERNELS, value="flash"))
    out = w.Output(layout=w.Layout(font_family="monospace"))

    def redraw(**kwargs):
        out.clear_output(wait=True)
        with out:
            print(scenario_box(**kwargs))

    ui = w.interactive(redraw, **controls)
    display(w.VBox([w.HBox(list(controls.values())[:4]), w.HBox(list(controls.values())[4:]), out]))
    redraw(**{k: c.value for k, c in controls.items()})
    return ui
