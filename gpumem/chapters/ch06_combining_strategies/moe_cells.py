"""Chapter 06's section "Planning a mixture of experts": Mixtral-8x7B on 8 GPUs planned with and
without expert parallelism (``ep``), part by part, and where its all-to-all goes.

Everything is the planner's (``gpumem.planner.plan``, ``planner.moe``) and the time engine's
(``gpumem.timing.moe_time``); these functions only ask and print, in 100 columns.
"""

from ... import planner, units
from ...planner import moe
from ...memory import hf_config
from ...timing import moe_time
from ...timing.hardware import NODES, Group

PARTS = (("params", "params"), ("grads", "grads"), ("optimizer", "optimizer"),
         ("zero3_working_set", "ZeRO-3 working set"), ("buffers", "buffers"), ("activations", "activations"),
         ("total", "total on the GPU"), ("host", "host memory (offload)"))
TERMS = (("compute", "compute"), ("data_parallel", "data parallel"), ("optimizer", "optimizer"),
         ("offload", "offload"), ("expert_parallel", "expert all-to-all"), ("total", "step"))


def compare(model: str = "mixtral-8x7b", gpus: int = 8, gpu: str = "h100-80gb", seq: int = 4096):
    """(the plan with ep searched, the plan with ep = 1 only): two ``planner.plan`` answers."""
    cfg = hf_config.load(model)
    return planner.plan(cfg, gpus, gpu, seq=seq), planner.plan(cfg, gpus, gpu, seq=seq, ep=(1,))


def table(with_ep, without_ep) -> str:
    """The two top plans side by side: per-GPU bytes by part, seconds by term, tokens/s."""
    a, b = with_ep.best, without_ep.best
    q = with_ep.question
    out = [f"{q['model']} on {q['gpus']} x {q['gpu']}, seq {q['seq']:,}, {q['global_batch']:,} sequences a step",
           f"  with ep:    {a.layout.label()}", f"  without ep: {b.layout.label()}",
           f"  {'per GPU':28s}{'with ep':>14s}{'without ep':>14s}"]
    out += [f"  {name:28s}{units.fmt(a.memory[k]):>14s}{units.fmt(b.memory[k]):>14s}" for k, name in PARTS]
    out.append(f"  {'seconds a step':28s}{'with ep':>14s}{'without ep':>14s}")
    out += [f"  {name:28s}{a.time.get(k, 0.0):>12.2f} s{b.time.get(k, 0.0):>12.2f} s" for k, name in TERMS]
    out.append(f"  {'tokens/s':28s}{a.tokens_per_s:>14,.0f}{b.tokens_per_s:>14,.0f}")
    return "\n".join(out)


def all_to_all_lines(model: str = "mixtral-8x7b", tokens: int = 4096, node: str = "dgx-h100") -> str:
    """One MoE layer's dispatch (or combine) all-to-all of ``tokens`` tokens in bf16, over 8 ranks
    of one node (NVLink) and over 16 ranks on two nodes (the network)."""
    cfg = hf_config.load(model)
    out = [f"one all-to-all of {cfg.name}: {tokens:,} tokens x top-{cfg.top_k} x d {cfg.d_model:,} x 2 bytes"]
    for label, group in (("ep 8, one node", Group(NODES[node], 8, 1)), ("ep 16, two nodes", Group(NODES[node], 8, 2))):
        a = moe_time.step(group, moe.a2a_rows(cfg, tokens), cfg.d_model, 2, moe_layers=cfg.n_layers,
                          micro_batches=1)
        out.append(f"  {label + ':':18s} sends {units.fmt(a.moved, 'MB', 1)} of {units.fmt(a.nbytes, 'MB', 1)} "
                   f"in {a.one_s * 1e3:.3f} ms ({a.binding}); x {a.calls:.0f} = {a.seconds * 1e3:.1f} ms a "
                   "micro-batch")
    return "\n".join(out)
