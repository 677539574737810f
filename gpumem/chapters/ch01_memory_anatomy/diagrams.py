"""Chapter 01's diagrams, rendered from the library's numbers (never typed by hand).

``scenario_box`` re-draws the study note's opening scenario for any model, recipe, sequence,
batch and GPU count; ``recipe_box`` the per-recipe table; ``scenario_explorer`` puts widgets on
the scenario.
"""

from gpumem import units
from gpumem.course.drawing import WIDTH, bar, box
from gpumem.memory import accounting, models
from gpumem.memory.estimate import estimate

def scenario_box(model: str = "llama-3-70b", recipe: str = "mixed", seq: int = 4096,
                 micro_batch: int = 1, gpus: int = 8, gpu_mem: int = 80 * units.GB,
                 checkpoint: str = "none", attention: str = "flash") -> str:
    """One training step without any sharding, against the memory of ``gpus`` GPUs together."""
    est = estimate(model=model, recipe=recipe, seq=seq, micro_batch=micro_batch,
                   checkpoint=checkpoint, attention=attention)
    cfg = models.get(model)
    r = accounting.recipe(recipe)
    d = est.as_dict()["per_gpu"]
    have = gpus * gpu_mem
    rows = [("parameters", d["params"], f"{r.params} B x {cfg.n_params() / 1e9:.2f} B"),
            ("gradients", d["grads"], f"{r.grads} B x params"),
            ("optimizer", d["optimizer"], f"{r.optimizer_bytes} B x params"),
            ("activations", d["activations"], f"{attention}, ckpt {checkpoint}")]
    lines = [f"{model}, recipe {recipe}, seq {seq} x batch {micro_batch}", ""]
    for name, value, how in rows:
        lines.append(f"{name:12s}{units.fmt(value):>13s}  {bar(value, d['total'])}  {how}")
    lines.append("-" * (WIDTH - 4))
    lines.append(f"{'total':12s}{units.fmt(d['total']):>13s}")
    lines.append(f"{'available':12s}{units.fmt(have):>13s}  = {gpus} x {units.fmt(gpu_mem, digits=0)}")
    verdict = "fits in total" if d["total"] <= have else f"does NOT fit: short by {units.fmt(d['total'] - have)}"
    lines.append(f"-> {verdict}, before any question of how to split it")
    return box("Memory of one training step, nothing sharded", lines)


def recipe_box() -> str:
    """The bytes-per-parameter table of every recipe, drawn in a box."""
    return box("Bytes per parameter, by recipe", accounting.recipe_table().splitlines(), width=86)


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
