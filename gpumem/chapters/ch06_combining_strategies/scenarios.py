"""The note's three scenarios (its section 4), asked of the planner: 7B on one 80 GB GPU, 70B on
8 x 80 GB, 405B on a thousand-GPU cluster; and the layouts the note proposes, costed.

The note's 7B is Llama-2-7B (6.74 B parameters, multi-head attention, FFN 11,008, vocabulary
32,000: Meta's published config), defined here because the course's registry starts at
Llama-3-8B. Its GPUs are A100 80GB; its cluster "a thousand GPUs", here 1,024 H100s.

The A100 scenarios use DGX A100 figures (NVIDIA DGX A100 datasheet): 1 TB of host memory per
8 GPUs (2 TB is an option), 15 TB of NVMe (4 x 3.84 TB), one 200 Gb/s HDR InfiniBand port per
GPU (25 GB/s). The 7B scenario trains 16 sequences a step (gradient accumulation of the
note's micro-batch of 4 sequences: 4 x 4 = 16, a 32k-token step), so that its plans can be
compared by throughput; the note's batch of 4 is the micro-batch ceiling it names.
"""

from gpumem import planner
from gpumem.planner import memory as planner_memory
from gpumem.memory.models import ModelConfig
from gpumem.planner.memory import Layout

TB = 10**12
DGX_A100 = dict(host_per_node=1 * TB, nvme_per_node=15 * TB, inter_node=25e9)

LLAMA2_7B = ModelConfig("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, 6.74)

SCENARIOS = {
    "7b-1gpu": dict(model=LLAMA2_7B, gpus=1, gpu="a100-80gb", seq=2048, global_batch=16, **DGX_A100,
                    about="7B on one A100 80GB (seq 2048, 16 sequences a step: 4 x the note's 4)"),
    "70b-8gpu": dict(model="llama-3-70b", gpus=8, gpu="a100-80gb", seq=4096, global_batch=64, **DGX_A100,
                     about="Llama-3-70B on 8 x A100 80GB, sequence 4096"),
    "405b-1024gpu": dict(model="llama-3.1-405b", gpus=1024, gpu="h100-80gb", seq=4096, global_batch=1024,
                         about="Llama-3.1-405B on 1,024 x H100, sequence 4096, 4M-token batch"),
}


def ask(name: str, **overrides) -> planner.Result:
    """The planner's answer for one scenario (keyword arguments restrict or change it)."""
    s = {k: v for k, v in SCENARIOS[name].items() if k != "about"} | overrides
    return planner.plan(**s)


def zero3_alone(recipe: str, gpu: str = "a100-80gb", seq: int = 4096) -> planner.Result:
    """70B on 8 GPUs with ZeRO-3 only: no tensor or pipeline parallelism, no offload."""
    return planner.plan("llama-3-70b", 8, gpu, seq=seq, global_batch=64, recipes=(recipe,), zero=(3,),
                        tp=(1,), pp=(1,), offloads=(("none", "cpu"),), **DGX_A100)


def note_70b_layout(recipe: str = "mixed", checkpoint: str = "every-2", pp: int = 1, zero: int = 3) -> Layout:
    """The note's 70B layout on 8 GPUs: ZeRO-3 and checkpointing every 2 layers (pp=1), or with
    pipeline stages (then DeepSpeed allows ZeRO-1 at most)."""
    dp = 8 // pp
    return Layout(recipe, zero, checkpoint, "flash", "none", "cpu", 1, 1, pp, dp, -(-64 // dp))


def layout_bytes(model, layout: Layout, seq: int = 4096) -> dict:
    """Per-GPU bytes of ``layout`` for ``model`` (a name or a config)."""
    from gpumem.memory import models
    cfg = models.get(model) if isinstance(model, str) else model
    return planner_memory.per_gpu(cfg, seq, layout)


def recommendations(recipes: tuple = planner.RECIPES) -> dict:
    """Each scenario's top plan among ``recipes``: label, per-GPU memory breakdown, time
    breakdown, tokens/s."""
    out = {}
    for name in SCENARIOS:
        r = ask(name, recipes=tuple(recipes))
        b = r.best
        out[name] = {"about": SCENARIOS[name]["about"], "fitting": len(r.plans), "label": b.layout.label(),
                     "framework": b.layout.framework, "plan": b,
                     "memory": b.memory, "time": {k: v for k, v in b.time.items() if k != "offload_terms"},
                     "tokens_per_s": b.tokens_per_s}
    return out


def evaluate(name: str, layout: str, result: planner.Result | None = None) -> planner.LayoutResult:
    """One given layout (``plan --layout``'s text) priced and ranked in scenario ``name``."""
    s = {k: v for k, v in SCENARIOS[name].items() if k != "about"}
    model, gpus, gpu = s.pop("model"), s.pop("gpus"), s.pop("gpu")
    return planner.evaluate(model, gpus, layout, gpu, result=result, **s)
