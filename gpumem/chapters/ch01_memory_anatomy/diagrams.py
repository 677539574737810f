"""Chapter 01's diagrams and tables, rendered from the library's numbers (never typed by hand).

``scenario_box`` re-draws the study note's opening scenario for any model, recipe, sequence,
micro-batch, GPU and GPU count: one micro-batch per GPU, the sum of the parts beside the traced
peak, judged per GPU (nothing sharded, states split evenly) and for all GPUs together; ``recipe_box`` the per-recipe
table and ``recipe_names`` what the frameworks call each recipe; ``lifecycle_box`` who holds
what, when, from a traced timeline; ``adamw_table`` the optimizer step's workspace by AdamW
implementation; ``megatron_table`` Korthikanti et al.'s layer beside Llama's, tensor by tensor,
within 100 columns; ``scale_table`` memory and time at 8B / 70B / 405B; ``scenario_explorer`` puts
widgets on the scenario.
"""

import textwrap

from gpumem import units
from gpumem.course.drawing import WIDTH, bar, box
from gpumem.memory import accounting, gpus as gpu_table, models
from gpumem.timing import compute
from gpumem.memory.estimate import estimate

from . import steps


def fit(value: int, gpu: gpu_table.GPU, n: int = 1) -> str:
    """How ``value`` bytes compare with ``n`` GPUs' capacity and usable memory, in words."""
    have, room = n * gpu.capacity, n * gpu_table.usable(gpu)
    if value > have:
        return f"over capacity by {units.fmt(value - have)}"
    if value > room:
        return f"under capacity, over usable by {units.fmt(value - room)}"
    return f"fits, {units.fmt(room - value)} under usable"


def _split_verdict(split: dict, gpu: gpu_table.GPU) -> str:
    """The fit of one GPU's bracketed bytes: sure when both bounds agree, else open."""
    room = gpu_table.usable(gpu)
    if split["at_least"] > room:
        return fit(split["at_least"], gpu) + ": does not fit"
    if split["at_most"] <= room:
        return f"fits, at least {units.fmt(room - split['at_most'])} under usable"
    return "the bounds straddle usable memory: trace it per GPU (section 4)"


def scenario_box(model: str = "llama-3-70b", recipe: str = "mixed", seq: int = 4096,
                 micro_batch: int = 1, gpus: int = 8, gpu: str = "h100-80gb",
                 checkpoint: str = "none", attention: str = "flash") -> str:
    """One training step on ``gpus`` GPUs, each running its own micro-batch: the parts, their
    sum and the traced peak, judged per GPU (nothing sharded, and states split evenly) and for
    all GPUs together."""
    est = estimate(model=model, recipe=recipe, seq=seq, micro_batch=micro_batch,
                   checkpoint=checkpoint, attention=attention)
    cfg, r, g = models.get(model), accounting.recipe(recipe), gpu_table.get(gpu)
    d = est.as_dict()["per_gpu"]
    peak = steps.trace(model, recipe, checkpoint, seq, micro_batch, attention)
    split = steps.split_states(model, recipe, gpus, seq, micro_batch, checkpoint, attention)
    rows = [("parameters", d["params"], f"{r.params} B x {cfg.n_params() / 1e9:.2f} B"),
            ("gradients", d["grads"], f"{r.grads} B x params"),
            ("optimizer", d["optimizer"], f"{r.optimizer_bytes} B x params"),
            ("activations", d["activations"], f"{attention}, ckpt {checkpoint}, per GPU")]
    lines = [f"{model}, recipe {recipe}; each GPU runs seq {seq} x micro-batch {micro_batch}", "",
             "one copy of the model states, and one GPU's activations:"]
    for name, value, how in rows:
        lines.append(f"{name:12s}{units.fmt(value):>13s}  {bar(value, d['total'])}  {how}")
    lines.append("-" * WIDTH)
    lines.append(f"{'sum':12s}{units.fmt(d['total']):>13s}  the four lines added, as the note does")
    lines.append(f"{'traced peak':12s}{units.fmt(peak.total_peak):>13s}  the most held at one moment "
                 f"({peak.total_peak_moment.phase})")
    r_ = gpu_table.DEFAULT_RESERVE
    lines += ["", f"one {g.label} reports {units.fmt(g.capacity)} ({g.capacity // units.MiB:,} MiB); "
                  f"usable {units.fmt(gpu_table.usable(g))}",
              f"    reserve: {units.fmt(r_.context, 'GiB', 0)} CUDA context + {units.fmt(r_.nccl, 'GiB', 0)} "
              f"NCCL + {r_.fragmentation:.0%} fragmentation",
              f"per GPU, nothing sharded: peak {units.fmt(peak.total_peak)} -> {fit(peak.total_peak, g)}",
              f"per GPU, states split {gpus} ways: between {units.fmt(split['at_least'])[:-3]} and "
              f"{units.fmt(split['at_most'])}",
              f"    -> {_split_verdict(split, g)}"]
    if split["activations"] > gpu_table.usable(g):
        lines.append(f"    one GPU's activations alone ({units.fmt(split['activations'])}) exceed its usable "
                     "memory")
    states = d["params"] + d["grads"] + d["optimizer"]
    low = d["params"] + d["optimizer"] + gpus * d["activations"]
    lines.append(f"all {gpus} GPUs, {gpus} micro-batches: at least {units.fmt(low)}, summed "
                 f"{units.fmt(states + gpus * d['activations'])},")
    lines.append(f"    against {units.fmt(gpus * gpu_table.usable(g))} usable, {units.fmt(gpus * g.capacity)} "
                 "capacity")
    return box(f"One training step on {gpus} x {g.label}, data parallel", lines, width=WIDTH + 4)


def recipe_box() -> str:
    """The bytes-per-parameter table of every recipe, drawn in a box."""
    return box("Bytes per parameter, by recipe", accounting.recipe_table().splitlines(), width=86)


# What each recipe is called where people train. Sources, DeepSpeed 0.19.8: runtime/config.py
# (bf16_master_weights_and_grads and bf16_optimizer_states need ZeRO 1-3); zero/stage3.py
# (_create_fp32_partitions: a 16-bit partition whose dtype is already the master's is reused, no
# copy); zero/stage_1_and_2.py (the master partition is always .clone()d: +2 B / N in pure bf16);
# engine.py _do_optimizer_sanity_check (bf16 with data_types.grad_accum_dtype "fp32" at stage 1
# selects BF16_Optimizer) and bf16_optimizer.py (fp32_groups_gradients_flat: a full fp32 gradient
# buffer); at stages 1-3 with the default grad_accum_dtype the gradients stay bf16. PyTorch
# FSDP's MixedPrecision and FSDP2's MixedPrecisionPolicy (the sharded parameters keep their fp32
# dtype; param_dtype is the compute copy). Megatron Core's distributed-optimizer guide (18 B per
# parameter for 16-bit parameters with fp32 gradients) and its precision-aware optimizer options
# (--use-precision-aware-optimizer with --main-grads-dtype, --main-params-dtype fp32|fp16,
# --exp-avg-dtype, --exp-avg-sq-dtype).
_NAMES = {
    "pure-bf16": [("DeepSpeed", '"bf16": {"enabled": true, "bf16_master_weights_and_grads": true, '
                                '"bf16_optimizer_states": true}, ZeRO 1-3 only: 8 B at ZeRO-3; ZeRO-1/2 '
                                'clone a separate bf16 master shard, 8 + 2/N B'),
                  ("FSDP", "a bf16 model (model.to(torch.bfloat16)), no MixedPrecision; torch AdamW "
                           "keeps m and v in the parameters' dtype"),
                  ("Megatron", "no exact match: --use-precision-aware-optimizer --main-grads-dtype bf16 "
                               "--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16 still keeps a master copy, "
                               "fp32 (12 B) or with --main-params-dtype fp16 (10 B)")],
    "mixed": [("DeepSpeed", '"bf16": {"enabled": true} with ZeRO 1-3: gradients stay bf16, fp32 master '
                            'and moments in the optimizer'),
              ("FSDP", "MixedPrecision(param_dtype=torch.bfloat16) (FSDP2: MixedPrecisionPolicy): the "
                       "fp32 shards are the master, 4 + 4 + 8 = 16 B"),
              ("Megatron", "--bf16 --use-precision-aware-optimizer --main-grads-dtype bf16 (fp32 master "
                           "and moments)")],
    "mixed-ds": [("DeepSpeed", '"bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "fp32"} '
                               "at ZeRO-1 (BF16_Optimizer: fp32 gradients instead of bf16 ones); what "
                               "DeepSpeed's estimators count at every stage"),
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
            for j, part in enumerate(textwrap.wrap(how, 72, break_on_hyphens=False, break_long_words=False)):
                lines.append(f"{head if j == 0 else ' ' * 15}  {framework if j == 0 else '':10s} {part}")
    return "\n".join(lines)


_SHORT = {"activations": "acts", "temporaries": "temps"}


def lifecycle_box(tl, moments: tuple[str, ...] = ("forward peak", "backward peak", "backward ends",
                                                   "optimizer peak")) -> str:
    """Who holds what, when: bytes per category at named moments of a traced timeline (GB)."""
    at = tl.moments()
    cats = list(tl.series)
    lines = [f"Who holds what, when: {tl.label} (GB = 10^9 bytes)",
             f"{'moment':15s}" + "".join(f"{_SHORT.get(c, c)[:9]:>10s}" for c in cats) + f"{'total':>9s}  in"]
    for name in moments:
        i = at[name]
        row = tl.at(i)
        lines.append(f"{name:15s}" + "".join(f"{row[c] / units.GB:>10.1f}" for c in cats)
                     + f"{tl.total(i) / units.GB:>9.1f}  {tl.modules[i] or tl.phases[i]}")
    peak, ops = tl.peak(), tl.operators()
    lines.append(f"the step's peak: {units.fmt(tl.total(peak))}, in the {tl.phases[peak]} phase "
                 f"(operator {ops[peak]:,} of {ops[-1] + 1:,})")
    short = [f"{v}: {k}" for k, v in _SHORT.items() if k in cats]
    if short:
        lines.append("; ".join(short) + (" (backward's scratch tensors, the optimizer's workspace)"
                                         if "temporaries" in cats else ""))
    return "\n".join(lines)


def megatron_table(cfg, seq: int, batch: int = 1) -> str:
    """``memory.megatron.reconcile`` in at most 100 columns: tensor and reason wrapped in their
    columns, bytes in MB (10^6) and in units of s*b*h, with both totals and Megatron's formula."""
    from gpumem.memory import megatron
    rows, sbh = megatron.reconcile(cfg, seq, batch), seq * batch * cfg.d_model

    lines = [f"one layer of {cfg.name}, s={seq}, b={batch}",
             f"{'':31s}{'bytes (MB = 10^6)':>19s}{'in s*b*h':>14s}",
             f"{'tensor (Megatron | Llama)':31s}{'Megatron':>9s}{'Llama':>10s}{'Megatron':>10s}{'Llama':>7s}"
             "  why they differ", "-" * 99]
    for r in rows:
        name, why = textwrap.wrap(r.tensor, 30), textwrap.wrap(r.why, 31)
        lines.append(f"{name[0]:31s}{units.fmt(r.megatron, 'MB', 0):>9s}{units.fmt(r.llama, 'MB', 0):>10s}"
                     f"{r.megatron / sbh:>10.2f}{r.llama / sbh:>7.2f}  {why[0]}")
        for j in range(1, max(len(name), len(why))):
            left = "  " + name[j] if j < len(name) else ""
            lines.append(f"{left:31s}{'':36s}  {why[j] if j < len(why) else ''}".rstrip())
    m, l = sum(r.megatron for r in rows), sum(r.llama for r in rows)
    lines += ["-" * 99, f"{'total':31s}{units.fmt(m, 'MB', 0):>9s}{units.fmt(l, 'MB', 0):>10s}"
                        f"{m / sbh:>10.2f}{l / sbh:>7.2f}",
              f"Megatron's 34*sbh + 5*a*s^2*b = {units.fmt(megatron.korthikanti_layer(cfg, seq, batch), 'MB', 0)} "
              f"(5*a*s/h = {5 * cfg.n_heads * seq / cfg.d_model:g} sbh of it is the s^2 term)"]
    return "\n".join(lines)


def adamw_table(traces: dict) -> str:
    """The optimizer step's workspace (the temporaries' peak) by AdamW implementation."""
    w = max(len(n) for n in [*traces, "AdamW implementation"])
    lines = [f"{'AdamW implementation':{w}s} {'temporaries peak':>17s}  at {'step peak':>12s}  at"]
    for name, tr in traces.items():
        lines.append(f"{name:{w}s} {units.fmt(tr.peaks['temporaries']):>17s}  {str(tr.peak_moments['temporaries']):14s}"
                     f"{units.fmt(tr.total_peak):>11s}  {tr.total_peak_moment}")
    return "\n".join(lines)


def _gpus_needed(states: int, acts: int, room: int) -> str:
    """Fewest GPUs whose usable memory holds an even share of ``states`` plus a whole ``acts``
    each (the sum, no working set); "none" when ``acts`` alone exceed one GPU."""
    if acts >= room:
        return "none"
    return f"{-(-states // (room - acts)):,d}"


def scale_table(names=("llama-3-8b", "llama-3-70b", "llama-3.1-405b"), seq: int = 4096,
                gpu: str = "h100-80gb", gpus: int = 8, mfu: float = compute.MFU) -> str:
    """Memory and time at scale (mixed recipe, flash, one sequence per GPU): model states and
    activations, what they are worth in usable GPUs, how many GPUs a step needs when the states
    are split evenly and each GPU keeps its own activations (without and with full
    checkpointing), and seconds of compute and of the optimizer step on ``gpu`` at ``mfu``."""
    g = gpu_table.get(gpu)
    room = gpu_table.usable(g)
    mem = [f"{'model':15s} {'states':>10s} {'activations':>12s} {'states/usable':>14s} "
           f"{'GPUs needed':>12s} {'full ckpt acts':>15s} {'GPUs, full ckpt':>16s}"]
    time = [f"{'model':15s} {'6*Psi*T':>9s} {'embedding':>10s} {'+attn':>6s} {'compute':>8s} "
            f"{'+ recompute':>12s} {'AdamW step':>11s} {'AdamW / ' + str(gpus):>10s}"]
    for name in names:
        cfg = models.get(name)
        n = cfg.n_params()
        d = estimate(model=name, seq=seq).as_dict()["per_gpu"]
        full = estimate(model=name, seq=seq, checkpoint="full").as_dict()["per_gpu"]["activations"]
        states = d["params"] + d["grads"] + d["optimizer"]
        mem.append(f"{name:15s} {units.fmt(states, digits=0):>10s} {units.fmt(d['activations'], digits=0):>12s} "
                   f"{states / room:>14.1f} {_gpus_needed(states, d['activations'], room):>12s} "
                   f"{units.fmt(full, digits=1):>15s} {_gpus_needed(states, full, room):>16s}")
        flops = compute.train_flops(n, seq)
        time.append(f"{name:15s} {flops:>9.2e} {cfg.vocab * cfg.d_model / n:>10.1%} "
                    f"{compute.attention_flops(cfg, seq) / flops:>6.1%} {compute.seconds(flops, g, mfu):>7.2f}s "
                    f"{compute.seconds(compute.train_flops(n, seq, recompute=True), g, mfu):>11.2f}s "
                    f"{compute.optimizer_seconds(n, 'mixed', g):>10.2f}s "
                    f"{compute.optimizer_seconds(n, 'mixed', g, gpus, zero=1):>9.3f}s")
    mem += [f"mixed recipe, seq {seq}, flash, one sequence per GPU; usable = {units.fmt(room)} per {g.label}",
            "states/usable: the states' memory worth in usable GPUs (activations left out)",
            "GPUs needed: fewest N with states/N + one sequence's activations <= usable (the sum,",
            "  no ZeRO-3 working set); none: one sequence's activations alone exceed a GPU"]
    time += ["6*Psi*T: FLOPs per sequence, embedding included; embedding: its share of Psi (a lookup,",
             "  no matmul); +attn: the score FLOPs (12*L*h*s per token, non-causal) 6*Psi*T leaves out",
             f"compute at {mfu:.0%} MFU of {g.bf16_flops / 1e12:.0f} TFLOP/s; + recompute: 8*Psi*T",
             f"AdamW: {compute.optimizer_bytes_per_param('mixed')} B/param over {g.hbm / 1e12:.2f} TB/s HBM, "
             f"all parameters / the 1/{gpus} shard of ZeRO"]
    return "\n".join(mem) + "\n\n" + "\n".join(time)


def scenario_explorer(**start):
    """Dropdowns and sliders that re-render :func:`scenario_box`, starting from ``start`` (any of
    its arguments), displayed once (nothing returned); plain text of that box without widgets."""
    from gpumem.course.quiz import widgets_available
    if not widgets_available():
        print(scenario_box(**start))
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
    for key, value in start.items():
        controls[key].value = value
    out = w.Output(layout=w.Layout(font_family="monospace"))

    def redraw(**kwargs):
        out.clear_output(wait=True)
        with out:
            print(scenario_box(**kwargs))

    # the interactive only wires the controls to redraw (they hold it alive through their
    # observers); it is not returned: as a cell's last value Jupyter would show every control twice
    w.interactive(redraw, **controls)
    display(w.VBox([w.HBox(list(controls.values())[:4]), w.HBox(list(controls.values())[4:]), out]))
    redraw(**{k: c.value for k, c in controls.items()})
    return None
