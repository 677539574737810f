"""Chapter 06's planner widget: model, GPU, GPU count, sequence length, global batch and the
node's CPU Adam rate as controls; every change re-plans and re-draws the ranked plans and their
memory bars. The CPU Adam rate is parameters/s for a whole node (G params/s on the slider), shared
by the ranks on it; it starts at the ZeRO-Offload paper's measured 3.89 G
(``offload_time.CPU_ADAM_NODE_RATE``) and stops below the node's DRAM bound
(``offload_time.adam_dram_ceiling``, 20.48 G).

``planner_widget()`` returns the ipywidgets box (JupyterLab); in text mode (no kernel, no
ipywidgets, or ``GPUMEM_QUIZ_MODE=text``) it shows the table and figure for the given values. The planner answers in well under a second, so the widget
re-plans on every move.

Redraws are safe across kernel threads (issue 24, item 1): JupyterLab 4.6 with ipykernel 7 can
run a widget's callback on a subshell thread while the main thread runs another, and the inline
backend's end-of-execution flush renders and closes every *pyplot* figure, whichever thread is
still drawing it. So the figure is a ``matplotlib.figure.Figure`` of its own (``plots``), turned
into a PNG before anything is shown, and one redraw at a time writes the output; a redraw that a
later change has overtaken shows nothing, so the chart always matches the controls.
"""

import threading

from gpumem.memory import gpus as gpu_table
from gpumem.memory import models
from gpumem import planner
from gpumem.timing import offload_time

from . import diagrams, plots

_ONE_DRAW = threading.Lock()
MODELS = ("llama-3-8b", "llama-3-70b", "llama-3.1-405b")
COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
SEQS = (1024, 2048, 4096, 8192, 16384, 32768)
BATCHES = (8, 16, 32, 64, 128, 256, 512, 1024)
# CPU Adam, G params/s per node: from a small host's to the DRAM bound (20.48), the paper's 3.89 first
ADAM_G = offload_time.CPU_ADAM_NODE_RATE / 1e9
ADAM_RANGE = (0.5, round(offload_time.adam_dram_ceiling() / 1e9, 2), 0.01)


def render(model: str, gpu: str, gpus: int, seq: int, global_batch: int, top: int = 6,
           cpu_adam_g: float = ADAM_G):
    """The table and the figure for one setting (what the widget shows); ``cpu_adam_g``: CPU Adam
    in G params/s for the whole node."""
    result = planner.plan(model, gpus, gpu, seq=seq, global_batch=global_batch, cpu_adam_rate=cpu_adam_g * 1e9)
    return diagrams.plans_table(result, top), plots.memory_bars(result, top), result


def planner_widget(model: str = "llama-3-70b", gpu: str = "h100-80gb", gpus: int = 8, seq: int = 4096,
                   global_batch: int = 64, cpu_adam_g: float = ADAM_G):
    """The interactive planner (ipywidgets), or a printed table where widgets are unavailable."""
    from gpumem.course.quiz import widgets_available
    if not widgets_available():   # text mode (tests, terminals): the table and figure for the defaults
        text, fig, _result = render(model, gpu, gpus, seq, global_batch, cpu_adam_g=cpu_adam_g)
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
        # on the slider's 0.01 grid: an off-grid value comes back rounded from the browser (a redraw)
        "cpu_adam_g": w.FloatSlider(value=round(cpu_adam_g, 2), min=ADAM_RANGE[0], max=ADAM_RANGE[1], step=ADAM_RANGE[2],
                                    readout_format=".2f", description="CPU Adam",
                                    tooltip="G params/s per node, shared by its ranks"),
    }
    out = w.Output()
    drawing_lock, asked = threading.Lock(), [0]    # asked: changes seen so far (the latest wins)

    def redraw(_=None):
        from IPython.display import display

        from gpumem.course.drawing import figure_png
        with drawing_lock:
            asked[0] += 1
            mine = asked[0]
        with _ONE_DRAW:                      # matplotlib is not thread-safe: one figure at a time
            if mine != asked[0]:
                return                       # a later change is waiting; it draws the current values
            text, fig, _result = render(**{k: c.value for k, c in controls.items()})
            png = figure_png(fig)
            if mine != asked[0]:
                return
            with out:
                out.clear_output(wait=True)
                print(text)
                display({"image/png": png}, raw=True)

    for c in controls.values():
        c.observe(redraw, names="value")
    redraw()
    box = w.VBox([w.HBox(list(controls.values())[:2]), w.HBox(list(controls.values())[2:]), out])
    return box


def check_models() -> list[str]:
    """The widget's models, checked against the registry (a test calls it)."""
    return [models.get(m).name for m in MODELS]
