"""Lab 06's questions under the team's limits, and their grading against the course planner.

A team's cluster is rarely the planner's default: its nodes may hold less host memory than
``planner.HOST_PER_NODE`` (2 TB), and its operators may keep every model replica's tensor,
context and pipeline ranks inside one node of 8 GPUs (``one_node``: tp x cp x pp <= 8), so that
only data-parallel traffic crosses the slow link between nodes; its stack may lack some of the
planner's levers (``without``: names from :data:`.lab06_levers.LACKS`). ``planner.plan``'s default
answer is for its own node (2 TB, any placement) and every lever, so it, or a copy's, is a layout
that breaks the team's limit. The learner's ``choose_plan`` takes the limits as keywords
(``host_per_node=None``: bytes per node, None for the planner's; ``one_node=False``; ``without=()``).

Five families, one member of each drawn at check time like :mod:`.lab06_cases`' (GPU count,
sequence, batch, link and the host cap drawn from ranges): a host-memory cap per node below the
planner's 2 TB; model-parallel ranks kept in one node on a 5-20 Gb/s link between nodes (issue
21's slow-network case); the same on 128K-192K-token sequences (its long-sequence case); a cap
that NVMe offload's states fit but not with its swap buffers, which a slower NVMe layout keeps
(:mod:`.lab06_swap`; review r9: the buffers never decided a case; r32: nothing kept it); a stack that
lacks 1-3 of the levers the planner's fastest layout uses, on clusters of every other family's
ranges (review r29: a packed table of ~115 harvested winners fit the literal rule; the winners
under a drawn lack are second choices that change with it, tests/test_lab06_adversarial.py). A member
counts only when the planner's own fastest layout breaks the limit and the fastest that keeps it
is at least :data:`.lab06_cases.MARGIN` slower, so
``plan()``'s default answer, or a copy's or a child process's, breaks it (and everything within
5 % of it does too).

The truth is :func:`truth`: the course planner's own search (``planner.plan``, copy-watched and
switched off during the learner's call by :mod:`.lab06_guard`) asked with the team's host memory
(its ``host_per_node`` option); ``one_node`` and ``without`` are no options of the planner's, so its
list of every fitting layout is kept to those whose tp x cp x pp fits a node and that use no lever
the stack lacks (review r13 #2: the grader's own
search, ``lab06_limits``, was a readable answer key; the tests keep an independent one). It is
computed after the learner's call; a plan passes when it runs, fits, keeps the limits and is
within the lab's slack of that truth.
"""

import random
from typing import Callable, NamedTuple

from gpumem import planner
from gpumem.course import lab_audit
from gpumem.memory import gpus as gpu_table, models
from gpumem.planner import HOST_PER_NODE, NVME_PER_NODE, Layout
from gpumem.planner.cost import step_seconds
from gpumem.planner.evaluate import to_layout
from gpumem.planner.memory import per_gpu
from gpumem.planner.swap_buffers import offload_buffers
from gpumem.timing.offload_time import datasheet_links

from . import lab06_cases, lab06_diagnose, lab06_guard, lab06_levers, lab06_swap
from .lab06_swap import swap_of  # noqa: F401 (tests read it here)
from .lab06_cases import FAST, SLOW, SLOW_LINK

NODE = 8                          # GPUs per node (the planner's GPUS_PER_NODE: DGX/HGX 8-GPU nodes)


class Limits(NamedTuple):
    """The team's limits: host bytes per node (None: the planner's 2 TB), one-node replicas, and the
    levers its stack lacks (names from :data:`.lab06_levers.LACKS`)."""
    host_per_node: float | None = None
    one_node: bool = False
    without: tuple = ()

    def keywords(self) -> dict:
        """What the grader passes to ``choose_plan`` (only the limits that are set)."""
        out = {} if self.host_per_node is None else {"host_per_node": self.host_per_node}
        return out | ({"one_node": True} if self.one_node else {}) | ({"without": self.without} if self.without else {})

    def text(self) -> str:
        parts = [] if self.host_per_node is None else [f"host {self.host_per_node / 1e12:g} TB per node"]
        parts += ["tp x cp x pp in one node"] if self.one_node else []
        return ", ".join(parts + ([f"the stack lacks {', '.join(self.without)}"] if self.without else []))


def breaks(limits: Limits, lay: Layout, host_node: float) -> str:
    """The limit ``lay`` breaks ('' when none); ``host_node``: its host bytes on one node."""
    lacked = lab06_levers.lacking(limits.without, lay)
    if lacked:
        return (f"it uses {', '.join(lacked)}, which the team's stack lacks "
                f"(without={tuple(limits.without)!r}: {'; '.join(lab06_levers.LACKS[n][0] for n in lacked)})")
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


class Found(NamedTuple):
    """The fastest fitting layout under the limits, and the fastest under the planner's own."""
    best: tuple | None            # (seconds, layout) or None when nothing fits the limits
    planner_best: tuple | None    # (seconds, layout) under the planner's 2 TB and any placement


def _fastest(plans) -> tuple | None:
    top = lab06_diagnose.fastest(plans) if plans else None
    return None if top is None else (top.time["total"], top.layout)


def truth(model: str, gpus: int, gpu: str, seq: int, batch: int, link: float | None,
          limits: Limits = Limits()) -> Found:
    """The grader's answer for one case (see the module); refuses while the learner's call runs."""
    if lab_audit.active() or lab06_guard.active():
        raise RuntimeError(lab06_guard.MESSAGE.format("lab06_limit_cases.truth"))
    asked = {"seq": seq, "global_batch": batch, "inter_node": link, "advise": False, "recipes": ("mixed",)}
    own = planner.plan(model, gpus, gpu, **asked)
    capped = own if limits.host_per_node is None else planner.plan(model, gpus, gpu, **asked,
                                                                   host_per_node=limits.host_per_node)
    kept = [p for p in capped.plans if not breaks(Limits(None, limits.one_node, limits.without), p.layout, 0)]
    return Found(_fastest(kept), _fastest(own.plans))


CAP_STEP = 0.05e12           # drawn host caps are rounded to 0.05 TB


class LimitFamily(NamedTuple):
    """Questions under one of the team's limits."""
    name: str
    space: dict                          # as lab06_cases.Family's: model, gpus, gpu, seq, batch, link
    limits: Callable                     # (rng, case, link, search) -> Limits, or None: draw again
    fallback: tuple                      # ((case, link, limits),) that hinge
    hinge: Callable = None               # (Found, Limits, case) -> bool; None: :func:`hinges`
    tries: int = lab06_cases.TRIES       # draws before the fallback


def _cap(rng: random.Random, *_) -> Limits:
    """A host cap of 0.3-1.2 TB per node: an assumption (nodes of 512 GB-1 TB are common in rented
    clusters; the planner's 2 TB is a DGX H100's, NVIDIA DGX H100 datasheet)."""
    return Limits(round(rng.uniform(0.3e12, 1.2e12) / CAP_STEP) * CAP_STEP)


def _swap_cap(rng: random.Random, case: tuple, link, search) -> Limits | None:
    """A cap that the planner's fastest layout (NVMe offload) breaks with its swap buffers and a
    slower NVMe layout keeps (:mod:`.lab06_swap`): a search that leaves the buffers out takes the
    fastest, over the cap."""
    found = search(*case, link, Limits())
    if found.planner_best is None or found.planner_best[1].device != "nvme":
        return None
    steps = lab06_swap.caps(case, link, found.planner_best)
    return Limits(rng.choice(steps) * lab06_swap.STEP) if steps else None


_S, _SEQS = lab06_cases._space, lab06_cases.SEQS
# the cap binds on small clusters: on the offload family's 24-80 GPUs a host cap seldom decides the plan
HOST_CAP_SPACES = (_S(("llama-3-70b",), (8, 16), ("a100-40gb", "a100-80gb"), (2048, 4096, 8192), (16, 256, 8), FAST),
                   _S(("llama-3-70b",), (8, 16, 32), ("a100-40gb",), _SEQS, (16, 512, 8), FAST),
                   _S(("llama-3-70b",), (8,), ("a100-80gb", "h100-80gb", "h200"), _SEQS, (16, 512, 8), FAST),
                   _S(("llama-3.1-405b",), (32, 64), ("a100-80gb", "h100-80gb"), _SEQS, (64, 512, 16), FAST))
ONE_NODE_SLOW = _S(("llama-3-70b",), (32, 64), ("h100-80gb",), (2048, 4096), (128, 512, 32), SLOW)
ONE_NODE_LONG = _S(("llama-3-8b",), (16, 32), ("h100-80gb",), (131072, 163840, 196608), (4, 64, 4), FAST)


def _every_node(space: dict) -> dict:
    """``space`` with every whole number of 8-GPU nodes between its least and most GPUs."""
    return {**space, "gpus": tuple(range(min(space["gpus"]), max(space["gpus"]) + 1, NODE))}


# every other family's ranges, each on every node count between its ends (8 to 128 GPUs; 9, 11 or 13
# nodes split the stages unlike any power of two): the winners without a lever differ across them
LACK_SPACES = tuple(_every_node(s) for f in lab06_cases.FAMILIES for s in lab06_cases.spaces(f)) + \
    tuple(_every_node(s) for s in HOST_CAP_SPACES + (ONE_NODE_SLOW, ONE_NODE_LONG))


def _lacks(rng: random.Random, case: tuple, link, search) -> Limits | None:
    """1-3 of the levers the planner's fastest layout uses, which the team's stack lacks."""
    found = search(*case, link, Limits())
    names = None if found.planner_best is None else lab06_levers.draw(rng, found.planner_best[1])
    return None if names is None else Limits(without=names)


FAMILIES = (
    LimitFamily("host cap", HOST_CAP_SPACES, _cap,
                ((("llama-3-70b", 8, "a100-40gb", 4096, 64), None, Limits(0.8e12)),)),
    LimitFamily("one node, slow link", ONE_NODE_SLOW, lambda *_: Limits(None, True),
                ((("llama-3-70b", 32, "h100-80gb", 4096, 256), SLOW_LINK, Limits(None, True)),)),
    LimitFamily("one node, long sequence", ONE_NODE_LONG, lambda *_: Limits(None, True),
                ((("llama-3-8b", 16, "h100-80gb", 131072, 8), None, Limits(None, True)),)),
    LimitFamily("NVMe swap buffers", lab06_swap.SPACE, _swap_cap,
                ((("llama-3.1-405b", 16, "h100-80gb", 6144, 64), None, Limits(0.54e12)),), lab06_swap.hinges),
    LimitFamily("the stack lacks a lever", LACK_SPACES, _lacks,
                ((("llama-3.1-405b", 128, "h100-80gb", 2048, 672), None, Limits(without=("mcore",))),),
                tries=8),        # about half the draws hinge: 4 tries fell back on 11 of 130 seeds
)


def hinges(found) -> bool:
    """The planner's fastest layout breaks the limits and the fastest that keeps them is
    :data:`.lab06_cases.MARGIN` slower (so nothing within 5 % of the planner's answer keeps them)."""
    return found.best is not None and found.planner_best is not None and \
        found.best[0] >= lab06_cases.MARGIN * found.planner_best[0]


def hinged(family: LimitFamily, found, limits: Limits, case: tuple) -> bool:
    """Whether the member hinges on its limit (the family's own test, else :func:`hinges`)."""
    return family.hinge(found, limits, case) if family.hinge else hinges(found)


def draw(family: LimitFamily, rng: random.Random, search=None) -> tuple:
    """A ``(case, link, limits)`` of the family that hinges (priced here and dropped)."""
    search = search or truth
    for _ in range(family.tries):
        case, link = lab06_cases.member(family, rng)
        limits = family.limits(rng, case, link, search)
        if limits is not None and hinged(family, search(*case, link, limits), limits, case):
            return case, link, limits
    return rng.choice(family.fallback)


def grade(choice, case: tuple, link: float | None, limits: Limits, slack: float, fields_of) -> tuple[str, str]:
    """(status, detail) of the learner's ``choice`` (returned before the truth is computed);
    ``fields_of``: labcheck's reading of a Layout or dict. UsageError (a layout no framework runs)
    propagates to the caller's row."""
    model, gpus, gpu, seq, batch = case
    found = truth(*case, link, limits)                              # the truth, after the learner's call
    if choice is None:
        if found.best is None:
            return "ok", "no layout keeps the limits and fits"
        return "wrong", (f"returned None, but layouts fit and keep the limits ({limits.text()}): the fastest "
                         f"takes {found.best[0]:.2f} s. Does your search still try every lever under the limit?")
    try:
        fields = fields_of(choice, gpus, batch)
    except (TypeError, ValueError) as err:
        return "wrong", str(err) if not isinstance(err, TypeError) else f"the plan's values: {err}"
    cfg, g = models.get(model), gpu_table.get(gpu)
    lay = to_layout(cfg, fields, gpus, batch, NODE, seq)
    mem = per_gpu(cfg, seq, lay)
    host, nvme = host_node(cfg, seq, lay, mem, gpus)
    label = lay.label()
    if mem["total"] > gpu_table.usable(g):
        return "wrong", (f"yours: {label}: does not fit: needs {mem['total'] / 1e9:.1f} GB per GPU, usable "
                         f"{gpu_table.usable(g) / 1e9:.1f} GB")
    why = breaks(limits, lay, host)
    states = mem["host"] * min(gpus, NODE)
    if why.startswith("host memory") and states <= limits.host_per_node < host:     # the buffers tip it
        return "wrong", (f"yours: {label}: host memory {host / 1e12:.4f} TB per node with NVMe offload's swap "
                         f"buffers (offload_buffers: {(host - states) / 1e12:.4f} TB of it), over the team's "
                         f"host_per_node {limits.host_per_node / 1e12:g} TB: what else does NVMe offload keep in "
                         "host memory?")
    if why:
        knows = ("assumes a stack with every lever" if limits.without and why.startswith("it uses") else
                 f"knows only its own nodes, {HOST_PER_NODE / 1e12:g} TB, any placement")
        return "wrong", f"yours: {label}: {why}: keep the team's limit in your search (the course's planner {knows})"
    if host > HOST_PER_NODE or nvme > NVME_PER_NODE:
        return "wrong", (f"yours: {label}: does not fit: host {host / 1e12:.2f} TB, NVMe {nvme / 1e12:.2f} TB per "
                         f"node (limits {HOST_PER_NODE / 1e12:g} and {NVME_PER_NODE / 1e12:g} TB)")
    links = datasheet_links(g.name, ranks_on_node=min(gpus, NODE))
    mine = step_seconds(cfg, seq, lay, g, links=links, inter_node=link)
    if found.best is None:            # review r24: a plan that fits where the planner's search found none
        return "ok", (f"{mine['total']:.2f} s; the planner's search found no layout that keeps the limits "
                      "and fits, yours does")
    best_t, best = found.best
    ratio = mine["total"] / best_t
    if ratio <= slack:
        return "ok", (f"{mine['total']:.2f} s vs the fastest layout that keeps the limits: {best_t:.2f} s "
                      f"({ratio:.3f}x, within {slack}x)")      # review r29: a pass shows its margin
    theirs = step_seconds(cfg, seq, best, g, links=links, inter_node=link)
    # review r23: a lever the fastest has and yours lacks need not be why (a layout without it may tie the
    # fastest): the row names the term that loses the most and the settings that differ (r24: not their values)
    term = max(lab06_diagnose.TERMS, key=lambda k: mine[k] - theirs[k])
    return "wrong", (f"yours: {label}: {mine['total']:.2f} s, {ratio:.2f}x the fastest step that keeps the limits "
                     f"(more than {slack}x): "
                     f"your {term.replace('_', ' ')} term takes {mine[term]:.2f} s against {theirs[term]:.2f} s in "
                     f"the fastest, which differs from yours in {lab06_diagnose.differs(lay, best)}")
