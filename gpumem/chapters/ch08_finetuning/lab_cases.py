"""Lab 08's part 3 cases: a GPU, its host's RAM, a model, a sequence length and a micro-batch.

Each answer is drawn first (a setup of :data:`.lab_draw.SETUPS`, a rung with a checkpoint policy,
or None: None and a base-on-CPU answer always among them, three rungs, both policies, in a drawn
order); the GPU is drawn independently of it; then the model's width and seq/batch are drawn and
its depth is picked among the depths whose answer is the drawn one and that a published model of
that width has (:func:`published_depths`; review r14 minor 5.4), every setup's GPU bytes at
least :data:`MARGIN` away from the usable bytes (chapter 08's ``scale.usable``: capacity minus the
single-GPU reserve, no NCCL); then the host's RAM, from :data:`HOST_GIB`, at least MARGIN away
from the base-on-CPU rung's host bytes: above them when that rung is the answer, below them in a
None case. So neither the GPU nor the model's width says the answer. Each case has its own ladder
(:func:`.lab_draw.ladder`): its QLoRA rungs carry a drawn NF4 block and double-quantisation choice.
In a None case that choice is a heavy one (:data:`HEAVY`: fp32 absmaxes) and the depth is one
where gpumem's count (the paper's block of 64, double quantised) would still fit the ``qlora`` rung
by at least :data:`LIB_MARGIN`: a copy of the library's chooser, however rewritten, picks
``qlora`` there.

Four cases a check are tight (:data:`TIGHT`): the answer fits by less than a quarter GiB ("under"),
so a reserve too large misses it (review r11: 1.5 GiB + 5 % passed 9 of 10 draws); the setup just
before the answer misses the usable bytes by less than a part of the reserve ("gib": 2^30 - 10^9 B,
so even 1 GB read for the CUDA context's 1 GiB takes it, review r22; "share"), so a reserve too
small takes it, or by
less than its own ``dequant_buffer`` ("buffer": the answer is the base on the CPU, the setup before
it QLoRA on the GPU, checkpointed), so a per-parameter count of QLoRA's states (4.127 bits a
weight, no dequantised matrix) takes it (review r11 defect 3).
"""

from gpumem.memory import gpus

from . import lab_draw
from .lab_draw import NF4_CHOICES, SETUPS, answer, config, draw_model, in_depth, ladder, total, totals, truth
from .scale import usable as card_usable     # the chapter's single-GPU reserve: one fact, one function

MARGIN = 0.03
LIB_MARGIN = 0.01    # in a None case, gpumem's own count fits the QLoRA rung by at least this share
HEAVY = ((32, False), (64, False))   # fp32 absmaxes per 32 or 64 weights: 0.125 or 0.0625 B a weight
# NF4 choices whose constants are at least the paper's (a per-parameter 0.5159 B counts too few)
DENSE = ((32, True), (32, False), (64, False), (128, False))
HOST_GIB = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
OFFLOADED = "qlora-cpu"
BUFFER = (OFFLOADED, "none")          # the "buffer" case's answer; the setup before it is ("qlora", "full")
TIGHT = {"share": (("a100-40gb", "a100-80gb", "h100-80gb", "h200"),
                   lambda card, model, rungs: int(0.05 * gpus.get(card).capacity) - 2 ** 30),
         "under": (lab_draw.CARDS, lambda card, model, rungs: 2 ** 28),
         # r22: 1 GB read for 1 GiB (the reserve 73.7 MB too small) passed 7 of 40 draws
         "gib": (lab_draw.CARDS, lambda card, model, rungs: 2 ** 30 - 10 ** 9),
         "buffer": (("t4", "l4", "a100-40gb"),
                    lambda card, model, rungs: truth(config(model), rungs["qlora"])["dequant_buffer"])}
DEPTHS = (2, 160)
LAYERS = (16, 128)          # published dense models' depths (Llama-3.2-3B's 28 to Llama-3.1-405B's 126)
WIDTH_PER_LAYER = (64, 160)  # and their d_model / n_layers (Qwen3-4B 71, Qwen2.5-32B 80, Llama-3-70B 102,
                             # Llama-3-8B 128, Llama-3.1-405B 130, Llama-3.2-1B 128)


def published_depths(d_model: int) -> tuple[int, int]:
    """The depths a published dense model of width ``d_model`` has (review r14 minor 5.4): n_layers
    within :data:`LAYERS` and d_model / n_layers within :data:`WIDTH_PER_LAYER`."""
    return max(LAYERS[0], -(-d_model // WIDTH_PER_LAYER[1])), min(LAYERS[1], d_model // WIDTH_PER_LAYER[0])


def _last_under(total_of, limit: float) -> int:
    """The largest depth whose total is under ``limit`` (DEPTHS[0] - 1 if none): totals grow with depth."""
    lo, hi = DEPTHS[0] - 1, DEPTHS[1]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if total_of(mid) < limit else (lo, mid - 1)
    return lo


def _clear(figures: dict, usable: int, host_ram: int, tight: tuple | None = None) -> bool:
    gpu = all(abs(total(figures, s) / usable - 1) >= MARGIN for s in SETUPS if s != tight)
    return gpu and abs(figures[OFFLOADED][2] / host_ram - 1) >= MARGIN


def _host(rng, want, host: int) -> int | None:
    """Host RAM (bytes) for a case: above the offloaded rung's ``host`` bytes when it is the
    answer, below them when none fits, anything otherwise (an earlier rung fits)."""
    sizes = [g * 2 ** 30 for g in HOST_GIB]
    if want is None:
        sizes = [s for s in sizes if s <= host * (1 - MARGIN)]
    elif want[0] == OFFLOADED:
        sizes = [s for s in sizes if s >= host * (1 + MARGIN)]
    else:
        sizes = [s for s in sizes if abs(s / host - 1) >= MARGIN]
    return rng.choice(sizes) if sizes else None


def _trim_vocab(model: dict, layers: int, seq: int, batch: int, rungs, before, usable: int) -> dict:
    """The model with the smallest vocabulary (>= 1,000) that keeps ``before`` over ``usable``
    (bisection: totals grow with the vocabulary); the model as given if none."""
    fig = in_depth(dict(model, n_layers=layers), seq, batch, rungs, "vocab", (1000, model["vocab"]))
    lo, hi = 1000, model["vocab"]
    if total(fig(lo), before) > usable:
        return model
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if total(fig(mid), before) > usable else (mid, hi)
    return dict(model, vocab=hi)


def _grow_vocab(model: dict, layers: int, seq: int, batch: int, rungs, want, usable: int) -> dict:
    """The model with the largest vocabulary (up to 200,000) whose ``want`` still fits ``usable``."""
    fig = in_depth(dict(model, n_layers=layers), seq, batch, rungs, "vocab", (model["vocab"], 200_000))
    lo, hi = model["vocab"], 200_000
    if total(fig(hi), want) <= usable:
        return dict(model, vocab=hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if total(fig(mid), want) <= usable else (lo, mid)
    return dict(model, vocab=lo)


def choose_case(rng, want: tuple[str, str] | None, tries: int = 200, tight: str | None = None) -> tuple:
    """(card, host_ram, model, seq, batch, figures, rungs) whose answer is ``want`` (module docstring)."""
    k = SETUPS.index(want) if want is not None else len(SETUPS)
    on_gpu = [s for s in SETUPS[:k] if s[0] != OFFLOADED]
    for _ in range(tries):
        card = rng.choice(TIGHT[tight][0] if tight else lab_draw.CARDS)
        usable = card_usable(card)
        model, seq, batch = draw_model(rng, wide=True), rng.choice(lab_draw.SEQS), rng.choice((1, 2, 4))
        if tight == "buffer":       # no re-run with the base on the CPU: short sequences, one at a time
            seq, batch = rng.choice((512, 1024)), 1
        pool = HEAVY if want is None else DENSE if tight == "buffer" else (
            HEAVY if rng.random() < 0.5 else NF4_CHOICES)
        rungs = ladder(*rng.choice(pool))
        fig = in_depth(model, seq, batch, rungs)       # the search's figures; the case's are totals'
        shallow, deep = published_depths(model["d_model"])
        before = SETUPS[k - 1] if tight and tight != "under" else None
        under = [u for u in on_gpu if u != before]    # every one over: the least of them over (totals grow with depth)
        low = (_last_under(lambda L: min(total(fig(L), u) for u in under), usable * (1 + MARGIN)) + 1 if under
               else DEPTHS[0])
        if want is None:
            high = _last_under(lambda L: lab_draw.library_total(dict(model, n_layers=L), fig(L), rungs),
                               usable * (1 - LIB_MARGIN))
        else:
            high = _last_under(lambda L: total(fig(L), want), usable * (1 - MARGIN))
        if tight == "under":        # want itself lands in (usable - window, usable]: a reserve too large misses it
            layers = _last_under(lambda L: total(fig(L), want), usable + 1)
            if layers < max(low, DEPTHS[0], shallow) or layers > deep:
                continue
            model = _grow_vocab(model, layers, seq, batch, rungs, want, usable)
        elif tight:                 # the setup before want lands in (usable, usable + window]
            window = TIGHT[tight][1](card, model, rungs)
            low = max(low, shallow, _last_under(lambda L: total(fig(L), before), usable + 1) + 1)
            if low > min(high, deep):
                continue
            layers = low
            if total(fig(layers), before) > usable + window:     # a layer is more than the window: trim the vocabulary
                model = _trim_vocab(model, layers, seq, batch, rungs, before, usable)
        else:
            low, high = max(low, shallow), min(high, deep)
            if low > high:
                continue
            layers = rng.randint(low, high)
        f = totals(dict(model, n_layers=layers), seq, batch, rungs)
        host_ram = _host(rng, want, f[OFFLOADED][2])
        near = (usable - TIGHT["under"][1](card, model, rungs) < total(f, want) if tight == "under" else
                not tight or total(f, before) <= usable + window)
        if host_ram and answer(f, usable, host_ram) == want and near and _clear(
                f, usable, host_ram, want if tight == "under" else before):
            return card, host_ram, dict(model, n_layers=layers), seq, batch, f, rungs
    raise RuntimeError(f"no case drawn for {want!r}")


def compute_first(figures: dict, usable: int, host_ram: int) -> tuple[str, str] | None:
    """The setup a chooser takes that puts compute before fidelity: the first that fits among every
    rung without checkpointing, then every rung with it."""
    order = [s for p in lab_draw.POLICIES for s in SETUPS if s[1] == p]
    return next((s for s in order if lab_draw.fits(figures, s, usable, host_ram)), None)


def choose_cases(rng) -> list[tuple]:
    """:func:`draw_cases`, drawn again until one case's answer is not :func:`compute_first`'s: part 4
    states the goal (fidelity, then compute), not the walk, so a chooser that ranks the other way
    must fail every check (without the redraw, 9 of 30 draws had no such case)."""
    while True:
        cases = draw_cases(rng)
        if any(compute_first(f, card_usable(card), ram) != want for want, card, ram, _, _, _, f, _ in cases):
            return cases


def draw_cases(rng) -> list[tuple]:
    """Six cases, answers drawn first: None, the base on the CPU without checkpointing (the
    "buffer" case) and with it (its GPU bytes must be checked too: without checkpointing they do
    not fit), three setups from three other rungs; both policies among them, so
    neither "always checkpoint" nor "never" passes; :data:`TIGHT`'s "gib" and "share" go to
    two of those with a setup before them in the ladder. Each: (want, card, host_ram, model, seq,
    batch, figures, rungs)."""
    while True:
        rungs = rng.sample([r for r in lab_draw.LADDER if r != OFFLOADED], 3)
        answers = [None, BUFFER, (OFFLOADED, "full"), *((r, rng.choice(lab_draw.POLICIES)) for r in rungs)]
        if {a[1] for a in answers if a} == set(lab_draw.POLICIES):
            break
    rng.shuffle(answers)
    cases: list = [None] * len(answers)
    cases[answers.index(BUFFER)] = (BUFFER, *choose_case(rng, BUFFER, tight="buffer"))
    for kind in ("gib", "share", "under"):     # each kind on the first answer, in a drawn order, it can be drawn for
        for i in rng.sample(range(len(answers)), len(answers)):
            if answers[i] is not None and (kind == "under" or answers[i] != SETUPS[0]) and cases[i] is None:
                try:
                    cases[i] = (answers[i], *choose_case(rng, answers[i], tight=kind))
                    break
                except RuntimeError:
                    continue
        else:
            raise RuntimeError(f"no {kind} case drawn")
    return [case or (want, *choose_case(rng, want)) for case, want in zip(cases, answers)]

