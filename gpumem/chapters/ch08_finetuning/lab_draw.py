"""Lab 08's graded cases, drawn afresh at each check (no list of answers can be kept).

* :func:`draw_model`: a dense Llama-like model's dimensions as a plain dict (the learner's input),
  with grouped-query attention and, in most draws, ``n_heads * head_dim != d_model`` (as Qwen3 and
  Gemma have), and :func:`config` the same model as the library's ``ModelConfig``;
* :func:`setups`: the fine-tuning setups part 1 grades on one model (full with torch AdamW and with
  8-bit AdamW, LoRA and QLoRA with drawn rank, targets, adapter dtype and optimizer);
* :func:`choose_cases`: part 2's cases. Each answer is drawn first (a setup of :data:`SETUPS`, a
  rung with a checkpoint policy, or None: None always among them, three rungs, both policies, in a
  drawn order); the GPU is drawn
  independently of it; then the model's width and seq/batch are drawn and its depth is picked
  among the depths whose answer is the drawn one, every rung's total at least :data:`MARGIN` away
  from the usable bytes (chapter 08's ``scale.usable``: capacity minus the single-GPU reserve, no
  NCCL). So neither the GPU nor the model's width says the answer. Each case has its own ladder
  (:func:`ladder`): its ``qlora`` rung carries a drawn NF4 block and double-quantisation choice.
  In a None case that choice is a heavy one (:data:`HEAVY`: fp32 absmaxes) and the depth is one
  where gpumem's count (the paper's block of 64, double quantised) would still fit the rung by at
  least :data:`LIB_MARGIN`: a copy of the library's chooser, however rewritten, picks ``qlora``
  there, and the row says why it does not fit.

Part 1's QLoRA setups are ones the library does not count (:class:`LabFinetune`): an NF4 block
other than 64 and, in one of the two, no double quantisation, so a copy of gpumem's counts, however
rewritten, is wrong on them. Their truth is :func:`truth`: the library's bytes for every role the
block does not touch, and a hand count of bitsandbytes 0.50.2 for the two it does
(:func:`nf4_constants`; tests compare it with ``bitsandbytes.functional.quantize_4bit`` run on the
CPU). The activation peaks of part 2 are the library's (``finetune_activation_bytes``). All are
computed here, before the learner's call and outside its guard.
"""

from dataclasses import dataclass
from types import MappingProxyType

from gpumem.memory import gpus, models
from gpumem.memory.finetune import FT_TARGETS, Finetune, finetune_activation_bytes, finetune_states, matrices

from .scale import usable as card_usable     # the chapter's single-GPU reserve: one fact, one function

MARGIN = 0.03
LIB_MARGIN = 0.01    # in a None case, gpumem's own count fits the QLoRA rung by at least this share


@dataclass(frozen=True)
class LabFinetune(Finetune):
    """A :class:`Finetune` with two of bitsandbytes' NF4 choices that gpumem does not count:
    ``nf4_block``, the weights per absmax (``quantize_4bit(blocksize=...)``, ``Params4bit(blocksize=
    ...)``: 32 to 4,096, default 64), and ``double_quant`` (``compress_statistics``, transformers'
    ``bnb_4bit_use_double_quant``): absmaxes stored in 8 bits (True) or kept fp32 (False)."""
    nf4_block: int = 64
    double_quant: bool = True


NF4_BLOCKS = (32, 128, 256, 512)     # bitsandbytes quantize_4bit's accepted sizes, 64 (the library's) left out
NESTED_BLOCK, NF4_CODE, NESTED_MAP = 256, 16 * 4, 256 * 4   # quantize_4bit: blocksize=256; 16 and 256 fp32 values


def nf4_constants(n: int, block: int, double_quant: bool) -> int:
    """Bytes bitsandbytes 0.50.2 keeps beside one n-element NF4 weight's codes (hand count of
    ``functional.quantize_4bit``): double quantisation: uint8 absmaxes, an fp32 absmax per 256 of
    them, an fp32 offset, the NF4 code and the nested map; without: fp32 absmaxes and the code."""
    blocks = -(-n // block)
    if not double_quant:
        return 4 * blocks + NF4_CODE
    return blocks + 4 * -(-blocks // NESTED_BLOCK) + 4 + NF4_CODE + NESTED_MAP


def truth(cfg, ft: LabFinetune) -> dict[str, int]:
    """The bytes by role of a lab setup: gpumem's for the roles the NF4 block does not touch,
    :func:`nf4_constants` and the dequantised matrix (bf16, with its fp32 absmaxes rebuilt when
    they are stored 8-bit) for the two it does."""
    roles = finetune_states(cfg, ft)
    if ft.base_dtype == "nf4":
        sizes = [i * o for i, o in matrices(cfg).values()] * cfg.n_layers
        big = max(sizes)
        roles["quant_constants"] = sum(nf4_constants(m, ft.nf4_block, ft.double_quant) for m in sizes)
        roles["dequant_buffer"] = 2 * big + (4 * -(-big // ft.nf4_block) if ft.double_quant else 0)
    return roles
# The ladder, most faithful first: full weights before adapters, 32-bit moments before 8-bit,
# a bf16 base before a 4-bit one. "The most faithful recipe that fits" = the first rung that fits. Read-only: the
# learner's notebook imports this very mapping, and the grader's answers are drawn from it.
LADDER = MappingProxyType({
    "full": LabFinetune(),
    "full-8bit": LabFinetune(optimizer="adamw-8bit"),
    "lora": LabFinetune(adapter="lora"),
    "qlora": LabFinetune(adapter="lora", base_dtype="nf4"),
})
NF4_CHOICES = tuple((b, d) for b in (32, 64, 128, 256, 512) for d in (True, False) if (b, d) != (64, True))
HEAVY = ((32, False), (64, False))   # fp32 absmaxes per 32 or 64 weights: 0.125 or 0.0625 B a weight


def ladder(block: int = 64, double_quant: bool = True) -> MappingProxyType:
    """:data:`LADDER` with its ``qlora`` rung's NF4 block and double quantisation set (read-only)."""
    return MappingProxyType({**LADDER, "qlora": LabFinetune(adapter="lora", base_dtype="nf4", nf4_block=block,
                                                            double_quant=double_quant)})


CARDS = ("t4", "l4", "a100-40gb", "a100-80gb", "h100-80gb", "h200")   # gpumem.memory.gpus (sourced there)
SEQS = (512, 1024, 2048, 4096)
SHOWN_WIDTHS = {2048, 4096, 8192}     # the d_model of the examples the lab's notebook shows


def draw_model(rng, wide: bool = False, odd_heads: bool | None = None) -> dict:
    """A dense model's dimensions (the learner's view); ``wide``: d_model 2,560 - 8,000."""
    while True:
        head_dim = rng.choice((64, 80, 96, 128))
        n_kv = rng.choice((1, 2, 4, 8))
        n_heads = n_kv * rng.choice((1, 2, 3, 4, 6, 8))
        d_model = 64 * rng.randrange(40, 126) if wide else 64 * rng.randrange(6, 40)
        odd = n_heads * head_dim != d_model
        if (odd_heads is None or odd == odd_heads) and d_model not in SHOWN_WIDTHS and n_heads * head_dim <= 2 * d_model:
            break
    return {"n_layers": rng.randrange(2, 9), "d_model": d_model, "n_heads": n_heads, "n_kv_heads": n_kv,
            "head_dim": head_dim, "ffn": 32 * round(d_model * rng.uniform(2.4, 3.6) / 32),
            "vocab": rng.randrange(1000, 160_000), "tie_embeddings": rng.random() < 0.3}


def config(model: dict) -> models.ModelConfig:
    """The library's view of a drawn model."""
    return models.ModelConfig(name="drawn", n_layers=model["n_layers"], d_model=model["d_model"],
                              n_heads=model["n_heads"], n_kv_heads=model["n_kv_heads"], ffn=model["ffn"],
                              vocab=model["vocab"], explicit_head_dim=model["head_dim"],
                              tie_embeddings=model["tie_embeddings"])


def _targets(rng) -> tuple[str, ...]:
    picked = [t for t in FT_TARGETS if rng.random() < 0.5] or [rng.choice(FT_TARGETS)]
    return tuple(picked)


def setups(rng) -> list[LabFinetune]:
    """Six setups for one model: full (AdamW, 8-bit AdamW), LoRA twice (fp32 adapters with either
    optimizer, bf16 adapters with torch AdamW), QLoRA twice, each QLoRA
    with an NF4 block other than 64, one of them without double quantisation (drawn which)."""
    r = lambda: rng.choice((2, 4, 8, 16, 32, 64))   # noqa: E731
    dq = rng.sample((True, False), 2)
    return [LabFinetune(), LabFinetune(optimizer="adamw-8bit"),
            LabFinetune(adapter="lora", lora_rank=r(), lora_targets=_targets(rng),
                        optimizer=rng.choice(("adamw", "adamw-8bit"))),
            # bf16 adapters with torch AdamW: moments in bf16 (a count that keeps them fp32 fails here)
            LabFinetune(adapter="lora", lora_rank=r(), lora_targets=_targets(rng), adapter_dtype="bf16"),
            LabFinetune(adapter="lora", base_dtype="nf4", lora_rank=r(), lora_targets=FT_TARGETS,
                        nf4_block=rng.choice(NF4_BLOCKS), double_quant=dq[0]),
            LabFinetune(adapter="lora", base_dtype="nf4", lora_rank=r(), lora_targets=_targets(rng),
                        optimizer=rng.choice(("adamw", "adamw-8bit")), nf4_block=rng.choice(NF4_BLOCKS),
                        double_quant=dq[1])]


def states_cases(rng) -> list[tuple[dict, list[tuple[Finetune, dict]]]]:
    """Three models (one with n_heads * head_dim == d_model, two without; the second always ties
    its head to the embedding), each with its setups and their bytes by role (:func:`truth`)."""
    out = []
    for i, odd in enumerate((True, False, True)):
        model = draw_model(rng, odd_heads=odd)
        if i == 1:
            model["tie_embeddings"] = True
        cfg = config(model)
        out.append((model, [(ft, truth(cfg, ft)) for ft in setups(rng)]))
    return out


# Within a rung: no re-run first (faster), then every layer checkpointed (one more forward per
# step). A setup is (rung, policy); the answer is the first in this order that fits.
POLICIES = ("none", "full")
SETUPS = tuple((rung, policy) for rung in LADDER for policy in POLICIES)


def totals(model: dict, seq: int, batch: int, rungs=LADDER) -> dict[str, tuple[int, dict[str, int]]]:
    """rung -> (model-state bytes (:func:`truth`), {policy: activation peak}), one GPU."""
    cfg = config(model)
    return {name: (sum(truth(cfg, ft).values()),
                   {p: finetune_activation_bytes(cfg, ft, seq, batch, checkpoint=p)["peak"] for p in POLICIES})
            for name, ft in rungs.items()}


def total(figures: dict, setup: tuple[str, str]) -> int:
    """States + activations of ``setup`` (rung, policy)."""
    states, acts = figures[setup[0]]
    return states + acts[setup[1]]


def library_total(model: dict, figures: dict, rungs) -> int:
    """The QLoRA rung's total, checkpointed, as gpumem counts it (its NF4 choices ignored: block
    64, double quantised), with the case's activations: what a copy of the library would compare."""
    return sum(finetune_states(config(model), rungs["qlora"]).values()) + figures["qlora"][1]["full"]


def answer(figures: dict, usable: int) -> tuple[str, str] | None:
    """The first setup (rung, policy) whose states + activations fit ``usable`` bytes (None if none)."""
    return next((setup for setup in SETUPS if total(figures, setup) <= usable), None)


def _clear(figures: dict, usable: int, tight: tuple | None = None) -> bool:
    return all(abs(total(figures, setup) / usable - 1) >= MARGIN for setup in SETUPS if setup != tight)


# Two cases a check are tight: the setup just before the answer misses the usable bytes by less
# than one part of the single-GPU reserve, so a chooser that leaves that part out takes it. Review
# r10: with every setup 3 % away, forgetting the CUDA context passed 12 of 20 draws, a flat 2 GiB
# 13 of 20. "context": within the context's GiB, on the small cards (a layer of a big card's model
# outgrows a GiB); "share": within 5 % of capacity less a GiB, on the big cards, so that a flat
# reserve of 2 GiB or less takes it too. Smaller slips (10^9 for 2^30) pass.
TIGHT = {"context": (("t4", "l4"), lambda card: 2 ** 30),
         "share": (("a100-40gb", "a100-80gb", "h100-80gb", "h200"),
                   lambda card: int(0.05 * gpus.get(card).capacity) - 2 ** 30)}


DEPTHS = (2, 160)


def _last_under(total, limit: float) -> int:
    """The largest depth whose total is under ``limit`` (DEPTHS[0] - 1 if none): totals grow with depth."""
    lo, hi = DEPTHS[0] - 1, DEPTHS[1]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if total(mid) < limit else (lo, mid - 1)
    return lo


def choose_case(rng, want: tuple[str, str] | None, tries: int = 200, tight: str | None = None) -> tuple:
    """(card, model, seq, batch, figures, rungs) whose answer is ``want`` (a setup of
    :data:`SETUPS`): the card and the width drawn independently of it, the depth picked among
    those that give it (bisection: totals grow with depth), every setup at least MARGIN away from
    the usable bytes. ``rungs``: the case's ladder; for ``want`` None its QLoRA rung is a
    :data:`HEAVY` one and gpumem's count of that rung fits by at least LIB_MARGIN (module docstring).
    ``tight`` (a key of :data:`TIGHT`): the setup just before ``want`` misses the usable bytes by
    less than that part of the reserve, every other setup MARGIN away."""
    for _ in range(tries):
        card = rng.choice(TIGHT[tight][0] if tight else CARDS)
        usable = card_usable(card)
        model, seq, batch = draw_model(rng, wide=True), rng.choice(SEQS), rng.choice((1, 2, 4))
        pool = HEAVY if want is None or rng.random() < 0.5 else NF4_CHOICES
        rungs = ladder(*rng.choice(pool))
        cache: dict[int, dict] = {}

        def fig(layers: int) -> dict:
            if layers not in cache:
                cache[layers] = totals(dict(model, n_layers=layers), seq, batch, rungs)
            return cache[layers]
        k = SETUPS.index(want) if want is not None else len(SETUPS)
        above = [_last_under(lambda L, u=u: total(fig(L), u), usable * (1 + MARGIN)) for u in SETUPS[:k]]
        low = max(above, default=DEPTHS[0] - 1) + 1
        if want is None:
            high = _last_under(lambda L: library_total(dict(model, n_layers=L), fig(L), rungs),
                               usable * (1 - LIB_MARGIN))
        else:
            high = _last_under(lambda L: total(fig(L), want), usable * (1 - MARGIN))
        if tight:                   # the setup before want lands in (usable, usable + window]
            before = SETUPS[k - 1]
            low = max(low, _last_under(lambda L: total(fig(L), before), usable + 1) + 1)
            high = min(high, _last_under(lambda L: total(fig(L), before), usable + TIGHT[tight][1](card) + 1))
        if low > high:
            continue
        layers = rng.randint(low, high)
        f = fig(layers)
        if answer(f, usable) == want and _clear(f, usable, SETUPS[k - 1] if tight else None):
            return card, dict(model, n_layers=layers), seq, batch, f, rungs
    raise RuntimeError(f"no case drawn for {want!r}")


def choose_cases(rng) -> list[tuple]:
    """Five cases, answers drawn first: None, three different setups from three different rungs,
    and one more; both policies among them, so neither "always checkpoint" nor "never" passes; the
    two of those with a setup before them in the ladder are tight (:data:`TIGHT`)."""
    while True:
        rungs = rng.sample(list(LADDER), 3)
        answers = [None, *((r, rng.choice(POLICIES)) for r in rungs), rng.choice([*SETUPS, None])]
        if {a[1] for a in answers if a} == set(POLICIES):
            break
    rng.shuffle(answers)
    cases: list = [None] * len(answers)
    for kind in TIGHT:                  # each kind on the first answer, in a drawn order, it can be drawn for
        for i in rng.sample(range(len(answers)), len(answers)):
            if answers[i] not in (None, SETUPS[0]) and cases[i] is None:
                try:
                    cases[i] = (answers[i], *choose_case(rng, answers[i], tight=kind))
                    break
                except RuntimeError:
                    continue
        else:
            raise RuntimeError(f"no {kind} case drawn")
    return [case or (want, *choose_case(rng, want)) for case, want in zip(cases, answers)]
