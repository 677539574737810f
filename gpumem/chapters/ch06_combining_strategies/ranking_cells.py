"""Chapter 06's "why the top plan wins" cells: the top plan against the runner-up term by term,
the answer's sensitivity to the kernel share, the network and CPU Adam's rate, and the note's
selection rules asked again with every lever (hybrid sharding, context parallelism, interleaved
pipelines, Megatron-Core). Everything is :mod:`gpumem.planner.explain` on the planner's answers;
nothing here prices anything.

The two questions: Llama-3-70B on 64 H100s (8 DGX H100 nodes) and the note's 405B scenario
(1,024 H100s), both at sequence 4,096 and a 4M-token step (Llama 3's first-stage batch,
``planner.DEFAULT_TOKENS``)."""

import textwrap
from dataclasses import replace
from functools import lru_cache

from gpumem import planner
from gpumem.planner import explain, placement
from gpumem.timing import hardware

from . import scenarios, timing_cells

WIDTH = 100
ABOUT = {"70b-64gpu": "Llama-3-70B on 64 x H100 (8 DGX H100 nodes), sequence 4,096, 4M-token batch",
         "405b-1024gpu": scenarios.SCENARIOS["405b-1024gpu"]["about"]}


def question(name: str) -> planner.Question:
    """The planner's question for ``name`` (a key of :data:`ABOUT`)."""
    if name == "70b-64gpu":
        return planner.Question.of("llama-3-70b", 64, "h100-80gb", seq=4096)
    s = {k: v for k, v in scenarios.SCENARIOS[name].items() if k != "about"}
    return planner.Question.of(s.pop("model"), s.pop("gpus"), s.pop("gpu"), **s)


@lru_cache(maxsize=8)
def answer(name: str) -> planner.Result:
    """The planner's answer for ``name``, asked once per process."""
    return planner.plan(question(name))


def why_top(name: str) -> str:
    """The question, then :func:`explain.render_versus` of its top plan against the runner-up."""
    r = answer(name)
    v = explain.top_vs_runner_up(r)
    head = f"{ABOUT[name]}: {len(r.plans):,} plans fit"
    if v is None:
        return head + "; every one is the top plan's kind"
    fastest = min(r.plans, key=lambda p: p.time["total"])
    band = sum(p.time["total"] <= fastest.time["total"] * (1 + planner.TIE) for p in r.plans)
    tie = textwrap.fill(
        f"{band} plans lie within {planner.TIE:.1%} of the fastest, {fastest.layout.label()}, "
        f"{fastest.time['total']:.3f} s, {fastest.memory['total'] / 1e9:.1f} GB per GPU, ranked "
        f"{r.plans.index(fastest) + 1}", WIDTH)
    return "\n".join([head, explain.render_versus(v, WIDTH), tie])


@lru_cache(maxsize=8)
def sensitivity(name: str) -> explain.Sensitivity:
    """:func:`explain.sensitivity` of ``name``'s answer (asked once per process)."""
    return explain.sensitivity(answer(name), top_k=3)


def sensitivity_text(name: str) -> str:
    """:func:`explain.render_sensitivity` of ``name``."""
    return explain.render_sensitivity(sensitivity(name), WIDTH)


def robust(name: str) -> tuple[int, int]:
    """(lines whose top layout kind stays, lines) of ``name``'s sensitivity."""
    lines = sensitivity(name).lines
    return sum(not ln.kind_changed for ln in lines), len(lines)


# -- the note's selection rules, asked again with every lever -------------------------------------

def family(lay) -> str:
    """A layout's family in the note's words: ZeRO-3 (plain, hybrid-sharded), ZeRO-0/1/2, 3-D."""
    if lay.tp > 1 and lay.pp > 1 or lay.cp > 1 or lay.vp > 1:
        return "3-D" + (" + cp" if lay.cp > 1 else "")
    name = f"ZeRO-{lay.zero}" + (f" {lay.hybrid}" if lay.hybrid != "none" else "")
    if lay.tp > 1 or lay.pp > 1:
        name += f" tp{lay.tp} pp{lay.pp}"
    return name + (" + offload" if lay.offload != "none" else "")


def best_of(result: planner.Result, test) -> planner.Plan | None:
    """The first plan in ``result``'s order whose layout passes ``test``."""
    return next((p for p in result.plans if test(p.layout)), None)


def _seconds(p) -> str:
    return f"{p.time['total']:.2f}" if p is not None else "-"


def rules_table() -> str:
    """Section 7's question (Llama-3-8B on 16 A100 40GB, data parallelism only,
    ``timing_cells.slow_plan``) and 70B on 64 H100s with every lever, on section 7's four networks
    (the A100 node's ports shared by its GPUs, given to the H100 question as the same per-GPU rate):
    the top plan's family and step, and the best plain ZeRO-3, hpZ and HSDP steps."""
    nets = timing_cells.networks()
    big = question("70b-64gpu")
    lines = [f"{'network between nodes':<34}{'GB/s/GPU':>8}  {'top plan':<22}{'step s':>8}{'ZeRO-3':>8}"
             f"{'hpZ':>8}{'HSDP':>8}",
             "Llama-3-8B on 16 x A100 40GB, data parallelism only (section 7's question):"]
    rows = [("8b", lambda node: timing_cells.slow_plan(node)),
            ("70b", lambda node: planner.plan(replace(big, cluster=replace(
                big.cluster, inter_node=placement.per_gpu_network(node)))))]
    for key, ask in rows:
        if key == "70b":
            lines.append("Llama-3-70B on 64 x H100, every lever (the same per-GPU rates between nodes):")
        for label, node in nets:
            r = ask(node)
            top = r.best
            plain = best_of(r, lambda lay: lay.zero == 3 and lay.hybrid == "none")
            hpz = best_of(r, lambda lay: lay.hybrid == "hpz")
            hsdp = best_of(r, lambda lay: lay.hybrid == "hsdp")
            short = label.split(" (")[0].replace(" per node", "/node")
            rate = placement.per_gpu_network(node) / 1e9
            lines.append(f"  {short:<32}{rate:>8.3g}  {_top_words(top.layout):<22}{top.time['total']:>8.2f}"
                         f"{_seconds(plain):>8}{_seconds(hpz):>8}{_seconds(hsdp):>8}")
    ib = placement.per_gpu_network(nets[0][1]) / 1e9
    own = placement.per_gpu_network(hardware.node(placement.NODE_OF_GPU[big.cluster.gpu])) / 1e9
    note = (f"Seconds a step (ZeRO-3, hpZ, HSDP: each family's best plan). The InfiniBand row is the "
            f"A100 node's own NICs, {ib:.3g} GB/s per GPU; the H100 question is given that same rate, "
            f"not a DGX H100's own NICs ({own:.3g} GB/s per GPU, the 70B answers above).")
    return "\n".join(lines + [textwrap.fill(note, WIDTH)])


def _top_words(lay) -> str:
    """The top plan's family, and for a 3-D layout its split (tp, pp, cp, vp above 1)."""
    name = family(lay)
    if not name.startswith("3-D"):
        return name
    parts = [f"{k}{getattr(lay, k)}" for k in ("tp", "pp", "cp", "vp") if getattr(lay, k) > 1]
    return "3-D " + " ".join(parts)


def slow_versus(net: int = 2) -> str:
    """On network ``net`` of ``timing_cells.networks()`` (default: one 25 Gb/s port per node),
    section 7's top plan against the best plain ZeRO-3 plan, term by term (the same plan twice when
    plain ZeRO-3 is the top)."""
    name, node = timing_cells.networks()[net]
    r = timing_cells.slow_plan(node)
    plain = best_of(r, lambda lay: lay.zero == 3 and lay.hybrid == "none")
    head = textwrap.fill(f"{name}: the top plan against the best plain ZeRO-3 plan", WIDTH)
    body = explain.render_versus(explain.versus(r.best, plain, ("top", "ZeRO-3"), explain.fastest_time(r)),
                                 WIDTH)
    t_top, t_plain = r.best.time["total"], plain.time["total"]
    pace = textwrap.fill(f"ZeRO-3 takes {t_plain / t_top - 1:.0%} longer than the top plan (the top "
                         f"plan is {1 - t_top / t_plain:.0%} faster), against a tie band of "
                         f"{planner.TIE:.1%}.", WIDTH)
    return head + "\n" + body + "\n" + pace
