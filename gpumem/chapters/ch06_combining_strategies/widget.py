"""Chapter 06's planner widget: model, GPU, GPU count, sequence length and global batch as
controls; every change re-plans and re-draws the ranked plans and their memory bars.

``planner_widget()`` returns the ipywidgets box (JupyterLab); in text mode (no kernel, no
ipywidgets, or ``GPUMEM_QUIZ_MODE=text``) it shows the table and figure for the given values. The planner answers in well under a second, so the widget
re-plans on every move.
"""

from gpumem.memory import gpus as gpu_table
from gpumem.memory import models
from gpumem import planner

from . import diagrams, plots

MODELS = ("llama-3-8b", "llama-3-70b", "llama-3.1-405b")
COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
SEQS = (1024, 2048, 4096, 8192, 16384, 32768)
BATCHES = (8, 16, 32, 64, 128, 256, 512, 1024)


def render(model: str, gpu: str, gpus: int, seq: int, global_batch: int, top: int = 6):
    """The table and the figure for one setting (what the widget shows)."""
    result = planner.plan(model, gpus, gpu, seq=seq, global_batch=global_batch)
    return diagrams.plans_table(result, top), plots.memory_bars(result, top), result


def planner_widget(model: str = "llama-3-70b", gpu: str = "h100-80gb", gpus: int = 8, seq: int = 4096,
                   global_batch: int = 64):
    """The interactive planner (ipywidgets), or a printed table where widgets are unavailable."""
    from gpumem.course.quiz import widgets_available
    if not widgets_available():   # text mode (tests, terminals): the table and figure for the defaults
        text, fig, _result = render(model, gpu, gpus, seq, global_batch)
        print(text)
        plots.show(fig)
        return None
    import ipywidgets as w
    controls = {
        "model": w.Dropdown(options=MODELS, value=model, description="model"),
        "gpu": w.Dropdown(options=[g for g, x in gpu_table.REGISTRY.items() if x.bf16_flops], value=gpu,
                          description="GPU"),
        "gpus": w.SelectionSlider(options=COUNTS, value=gpus, description="GPUs"),
        "seq": w.SelectionSlider(options=SEQS, value=seq, description="sequence"),
        "global_batch": w.SelectionSlider(options=BATCHES, value=global_batch, description="batch"),
    }
    out = w.Output()

    def redraw(_=None):
        with out:
            out.clear_output(wait=True)
            text, fig, _result = render(**{k: c.value for k, c in controls.items()})
            print(text)
            plots.show(fig)

    for c in controls.values():
        c.observe(redraw, names="value")
    redraw()
    box = w.VBox([w.HBox(list(controls.values())[:2]), w.HBox(list(controls.values())[2:]), out])
    return box


def check_models() -> list[str]:
    """The widget's models, checked against the registry (a test calls it)."""
    return [models.get(m).name for m in MODELS]
