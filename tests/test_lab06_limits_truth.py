"""Lab 06 under the team's limits: the tests' own search, an independent truth for the grader's.

Until review r13 (#2) this search was the grader's (``lab06_limits``, shipped in the package: a
readable answer key that a mechanically rewritten copy pasted into a cell passed 13/13 with). The
grader now asks the course planner (``lab06_limit_cases.truth``: ``planner.plan`` with the team's
``host_per_node``, its fitting plans kept to one node); this file keeps the former search, written
from the lab's text and the pieces it hands out (``per_gpu``, ``step_seconds``, ``rules``,
``offload_buffers``), not from ``planner.search``; the tests check that both give the same fastest
layout's seconds on every family's fallback and on drawn members (tests/test_lab06_adversarial.py,
``test_the_graders_limit_truth_is_the_tests_own_search``, which also rewrites this module's source,
r11's AST rewrite, to test the origin rule); its own test is a hand count of how it reads the limits.
"""

from dataclasses import replace
from itertools import product
from typing import NamedTuple

from gpumem.memory import gpus as gpu_table, models
from gpumem.memory.policies import POLICIES
from gpumem.planner import HOST_PER_NODE, MICRO_BATCHES, NVME_PER_NODE, OFFLOAD_CHOICES, Layout, rules
from gpumem.planner.cost import step_seconds
from gpumem.planner.memory import per_gpu
from gpumem.chapters.ch06_combining_strategies.lab06_limit_cases import Limits   # data only: the rules are the tests' own
from gpumem.planner.swap_buffers import offload_buffers
from gpumem.timing.offload_time import datasheet_links

NODE = 8                          # GPUs per node (the planner's GPUS_PER_NODE: DGX/HGX 8-GPU nodes)
CP = (1, 2, 4, 8)                 # ring-attention degrees the lab's planner tries (question.CP_DEGREES)
VP = range(1, 9)                  # virtual stages per pipeline rank (question.VP_DEGREES)
# the names ``without`` may hold and what each forbids, as the lab's text states them (section 2)
FORBIDS = {"tp": lambda lay: lay.tp != 1, "pp": lambda lay: lay.pp != 1, "cp": lambda lay: lay.cp != 1,
           "vp": lambda lay: lay.vp != 1, "zero3": lambda lay: lay.zero == 3,
           "offload": lambda lay: lay.offload != "none",
           "nvme": lambda lay: lay.offload != "none" and lay.device == "nvme",
           "hybrid": lambda lay: lay.hybrid != "none", "mcore": lambda lay: lay.mcore is True,
           "selective": lambda lay: lay.checkpoint == "selective"}


def breaks(limits: Limits, lay: Layout, host_node: float) -> str:
    """The limit ``lay`` breaks ('' when none); ``host_node``: its host bytes on one node."""
    lacked = [name for name in limits.without if FORBIDS[name](lay)]
    if lacked:
        return f"it uses {', '.join(lacked)}, which the team's stack lacks"
    if limits.one_node and lay.tp * lay.cp * lay.pp > NODE:
        return (f"tp {lay.tp} x cp {lay.cp} x pp {lay.pp} = {lay.tp * lay.cp * lay.pp} GPUs spans more than one "
                f"node of {NODE} (one_node=True: a replica's model-parallel ranks stay in one node)")
    if limits.host_per_node is not None and host_node > limits.host_per_node:
        return (f"host memory {host_node / 1e12:.2f} TB per node, over the team's "
                f"host_per_node {limits.host_per_node / 1e12:g} TB")
    return ""


def host_node(cfg, seq: int, lay: Layout, mem: dict, gpus: int) -> tuple[float, float]:
    """(host bytes, NVMe bytes) of one node: per GPU states plus NVMe swap buffers, times its ranks."""
    swap = sum(v for k, v in offload_buffers(cfg, lay).items() if k.endswith("swap"))
    ranks = min(gpus, NODE)
    return (mem["host"] + swap) * ranks, mem["nvme"] * ranks


def _splits(cfg, gpus: int, seq: int, batch: int, one_node: bool):
    """(tp, cp, pp, dp) that multiply to ``gpus``, tp inside a node holding whole heads, cp
    splitting the sequence in 2 cp chunks, dp dividing the batch."""
    for tp, cp in product((1, 2, 4, 8), CP):
        if gpus % (tp * cp) or cfg.n_heads % tp or cfg.n_kv_heads % tp or cp > 1 and seq % (2 * cp):
            continue
        rest = gpus // (tp * cp)
        for pp in (p for p in range(1, min(rest, cfg.n_layers) + 1) if rest % p == 0):
            if batch % (rest // pp) == 0 and not (one_node and tp * cp * pp > NODE):
                yield tp, cp, pp, rest // pp


def _groups(tp: int, dp: int, gpus: int) -> list[int]:
    """Shard groups of hybrid sharding: one node's data-parallel ranks, then doubled."""
    g, out = max(NODE // tp if gpus >= NODE else gpus, 2), []
    while g < dp:
        out += [g] if dp % g == 0 else []
        g *= 2
    return out


def _bases(cfg, gpus: int, seq: int, batch: int, one_node: bool):
    """Every base layout (checkpoint 'none', micro-batch 1) some framework runs."""
    for tp, cp, pp, dp in _splits(cfg, gpus, seq, batch, one_node):
        per = batch // dp
        hybrids = [("none", 0)] + [(h, g) for h in ("hsdp", "hpz") for g in _groups(tp, dp, gpus)]
        vps = [v for v in VP if v == 1 or pp > 1 and cfg.n_layers % (pp * v) == 0]
        for vp, zero, (hy, grp), (off, dev), core in product(vps, (0, 1, 2, 3), hybrids, OFFLOAD_CHOICES,
                                                              (False, True)):
            if core and (cp > 1 or vp > 1 or tp * pp == 1) or not rules.allowed("mixed", zero, pp, off, dev, tp):
                continue
            lay = Layout("mixed", zero, "none", "flash", off, dev, 1, tp, pp, dp, per, cp, vp, hy, grp, core)
            if (core or cp > 1 or vp > 1) and rules.megatron_core(cfg, seq, zero, off, "flash", pp, cp, vp, per):
                continue
            if hy == "none" or not rules.hybrid(lay):
                yield lay


class Found(NamedTuple):
    """The fastest fitting layout under the limits, and the fastest under the planner's own."""
    best: tuple | None            # (seconds, layout) or None when nothing fits the limits
    planner_best: tuple | None    # (seconds, layout) under the planner's 2 TB and any placement


def fastest(model: str, gpus: int, gpu: str, seq: int, batch: int, link: float | None,
            limits: Limits = Limits()) -> Found:
    """The fastest fitting layout that keeps ``limits`` and the fastest under the planner's own node."""
    # one pass over every layout the lab's text allows (degree splits, ZeRO stages, hybrid groups,
    # offloads, engines, checkpoint policies, micro-batches), built from the pieces the lab hands
    # out (per_gpu, step_seconds, offload_buffers, rules); kept when it fits the GPU, the node's
    # host and drives; the fastest that keeps the limits and the fastest under the planner's own
    cfg, g = models.get(model), gpu_table.get(gpu)
    usable, links = gpu_table.usable(g), datasheet_links(g.name, ranks_on_node=min(gpus, NODE))
    cap = HOST_PER_NODE if limits.host_per_node is None else max(limits.host_per_node, HOST_PER_NODE)
    best, planner_best = None, None
    for base in _bases(cfg, gpus, seq, batch, False):
        for policy in POLICIES:
            for mb in (m for m in MICRO_BATCHES if base.n_micro % m == 0):
                if base.vp > 1 and (base.n_micro // mb) % base.pp:
                    continue
                lay = replace(base, checkpoint=policy, micro_batch=mb, n_micro=base.n_micro // mb)
                mem = per_gpu(cfg, seq, lay)
                host, nvme = host_node(cfg, seq, lay, mem, gpus)
                if mem["total"] > usable or host > cap or nvme > NVME_PER_NODE:
                    break             # a larger micro-batch under this policy holds more
                t = step_seconds(cfg, seq, lay, g, links=links, inter_node=link)["total"]
                if host <= HOST_PER_NODE and (planner_best is None or t < planner_best[0]):
                    planner_best = (t, lay)
                if not breaks(limits, lay, host) and (best is None or t < best[0]):
                    best = (t, lay)
    return Found(best, planner_best)



def test_the_search_reads_the_limits_as_the_lab_states_them():
    """By hand: one_node counts the context-parallel ranks (tp 2 x cp 4 x pp 1 = 8 GPUs stays in a
    node, x pp 2 = 16 spans two); the host cap compares one node's bytes; the shard groups start at
    one node's data-parallel ranks (8 / tp) and double while they divide dp and leave two replicas."""
    in_node = Layout("mixed", 1, "full", "flash", "none", "cpu", 1, 2, 1, 4, 1, 4)
    spans = Layout("mixed", 1, "full", "flash", "none", "cpu", 1, 2, 2, 2, 1, 4, 2)
    assert not breaks(Limits(one_node=True), in_node, 0)
    assert breaks(Limits(one_node=True), spans, 0).startswith("tp 2 x cp 4 x pp 2 = 16 GPUs spans")
    assert breaks(Limits(0.8e12), in_node, 0.81e12) and not breaks(Limits(0.8e12), in_node, 0.8e12)
    assert _groups(1, 16, 16) == [8] and _groups(2, 32, 64) == [4, 8, 16]
    # without: each name forbids its own lever only (zero3 leaves ZeRO-1/2; nvme leaves CPU offload)
    cpu = replace(in_node, zero=3, tp=1, cp=1, dp=8, offload="optimizer", device="cpu", checkpoint="selective")
    assert not breaks(Limits(without=("tp", "cp", "pp", "vp", "nvme", "hybrid", "mcore")), cpu, 0)
    assert breaks(Limits(without=("nvme", "zero3")), cpu, 0) == "it uses zero3, which the team's stack lacks"
    assert breaks(Limits(without=("offload", "selective")), cpu, 0).startswith("it uses offload, selective,")
    assert breaks(Limits(without=("tp",)), in_node, 0) and not breaks(Limits(without=("zero3",)), in_node, 0)
