"""Lab 01's ``check()``: the learner's memory calculator graded against traced truth, and
``layer_source()``, the layer's code the lab prints for the learner to read.

The cases are not the ones the lab shows. Model states come from fake-tensor traces
(``gpumem.memory.tracing``) of two fixed configurations and from ``accounting.model_states`` at drawn
sizes. Part 2's layer is the Llama layer with a wider attention (n_heads * head_dim != d_model) and
q/k norms per head (Qwen3) or over the whole width (OLMo 2, graded first; :mod:`.labwide`, :mod:`.labpart2`). Part 3's layers are the
variants of :mod:`.variants` (Hugging Face's and Gemma's RMSNorms, a GeLU MLP with dropout, q/k/v
biases) and, after those, chain MLPs whose operations (:data:`.variants.OPS` and ``MULS``, three to
eight) are given to the learner's function as data: twelve fixed (:data:`FIXED_CHAINS`), then some drawn at
each check. Every truth is measured on real tensors (:func:`.labwide.measure`, :func:`.variants.measure`). Each
function stops at its first failing case, explained by :mod:`.labhints` (part 1's key, part 2's term,
part 3's switch, or a chain's first operation whose change differs).

What this does and does not exclude. While the learner's functions run, the course's formulas and
tracers raise "derive it yourself" and tensor operations raise "no tensor ops" (:mod:`.labguard`):
nothing is measured *during* the call. Measuring *before* the check and fitting is not stopped; the
drawn shapes stop a table of last time's answers, and a fit written out as data is refused as a table
(:mod:`.labtable`, whose docstring says what a packed fit still passes). The chain MLPs are drawn at
check time, each with a product with a tensor two or three operations back (``mulK``), whose bytes
depend on the operations up to four back: a table over that context (15**4 = 50,625 entries) is far
past the limit, where one of transitions (253 entries, 104 bytes packed) passed every row before the
products (reviews r35, r36). A table measured in the kernel is named if still in its cache
(:func:`kernel_refusal`). First :mod:`.labtruth` checks torch, the course and the plain layer's formula."""

import random

from gpumem.course import seeds
from gpumem.course.grading import LearnerError, Report, Row, call, grade, returned, run_case
from gpumem.course.plain import read_now
from gpumem.memory import accounting, tracing
from gpumem.memory.estimate import n_param_tensors
from gpumem.memory.models import ModelConfig

from . import lab_gpu, labcopies, labguard, labhints, labpart2, labtable, labtruth, labwide, variants
from .labguard import guarded
from .variants import without_comments

LAB = "lab01_memory_calculator"

# Configurations the lab never shows (GQA ratios, odd widths), traced for the model states.
_CONFIGS = [ModelConfig("lab-a", 3, 96, 6, 2, 256, 4000),
            ModelConfig("lab-b", 3, 128, 8, 8, 320, 6000)]
_states, _layers = {}, {}           # traced truths by (config, recipe) and by layer case


def traced_states(cfg: ModelConfig, recipe: str) -> dict:
    """Expected one-GPU model-state bytes from a fake-tensor trace, without AdamW's step counters
    (the learner's function is given only a parameter count)."""
    if (cfg, recipe) not in _states:
        tr = tracing.trace_step(cfg, recipe, seq=16)
        counters = 4 * n_param_tensors(cfg) if accounting.recipe(recipe).step_counter else 0
        _states[cfg, recipe] = {"params": tr.peaks["params"], "grads": tr.peaks["grads"],
                                "optimizer": tr.peaks["optimizer"] - counters}
    return dict(_states[cfg, recipe])


def traced_layer(cfg: ModelConfig, kernel: str, seq: int, batch: int) -> int:
    """One layer's saved bytes, read off two fake-tensor traces: depth 3 minus depth 2 (tests hold
    :func:`.variants.measure` to it)."""
    from gpumem.memory.models import with_layers
    key = (cfg, kernel, seq, batch)
    if key not in _layers:
        deep, shallow = (tracing.trace_step(with_layers(cfg, n), "mixed", kernel, seq=seq, micro_batch=batch)
                         for n in (3, 2))
        _layers[key] = deep.peaks["activations"] - shallow.peaks["activations"]
    return _layers[key]


def layer_source() -> str:
    """The code part 2's layer runs, as lab 01 shows it (comments removed, the learner works out
    what each operation saves): the course's Llama layer with the wide attention (:mod:`.labwide`)."""
    return labwide.source()


def variant_source() -> str:
    """Part 3's code: the variant block, Hugging Face's and Gemma's RMSNorms, the GeLU MLP and its
    dropout, the chain MLP and its operations."""
    return variants.variant_source()


def _bytes(v) -> str:
    return f"{v:,} B" if isinstance(v, int) else repr(v)


def draw_shape(rng: random.Random) -> dict:
    """A layer shape the lab never shows: GQA ratio 1-4, even head width, small enough to run. At
    least 2 key/value heads: with one (MQA) and batch 1, ``repeat_kv``'s reshape is a view, not the
    copy part 2's hint promises (traced: 2 x 2sb(h - k) fewer bytes)."""
    kv, rep, head = rng.randint(2, 4), rng.randint(1, 4), rng.choice([8, 12, 16, 20, 24])
    return dict(d_model=kv * rep * head, n_heads=kv * rep, n_kv_heads=kv, ffn=8 * rng.randint(10, 60),
                seq=rng.randint(5, 40), batch=rng.randint(1, 3))


def draw_far_shape(rng: random.Random) -> dict:
    """A shape far outside :func:`draw_shape`'s range (6-8 key/value heads, head width 64 or 128,
    hundreds of positions): a count fitted at small shapes passes here only if its monomials are
    the formula's. That stops a wrong basis, not a measurement made before the check with the
    right one (review r9; the module docstring)."""
    kv, rep, head = rng.choice([6, 8]), rng.choice([1, 2]), rng.choice([64, 128])
    return dict(d_model=kv * rep * head, n_heads=kv * rep, n_kv_heads=kv, ffn=16 * rng.randint(100, 250),
                seq=rng.randint(300, 600), batch=rng.randint(1, 2))


def _label(shape: dict, **more) -> str:
    s = shape
    extra = "".join(f" {k}={v}" for k, v in more.items())
    return (f"d={s['d_model']} heads={s['n_heads']}/{s['n_kv_heads']} ffn={s['ffn']} seq={s['seq']} "
            f"batch={s['batch']}{extra}")


def _grade_states(report: Report, fn, rng: random.Random) -> None:
    cases = []
    for cfg in _CONFIGS:
        for recipe in accounting.RECIPES:
            traced, s = traced_states(cfg, recipe), accounting.model_states(cfg.n_params(), recipe)
            if traced != {"params": s.params, "grads": s.grads, "optimizer": s.optimizer}:   # a second witness
                report.rows.append(Row("model_state_bytes", f"{cfg.name}, {recipe}", "error", labtruth.CHANGED.format(
                    f"the trace gives {traced}, accounting.model_states does not")))
                return
            cases.append((f"{cfg.name}, {recipe}, 1 GPU (traced)", dict(n_params=cfg.n_params(), recipe=recipe), traced))
    for recipe, gpus, zero in [("mixed", 8, 1), ("mixed", 8, 2), ("pure-bf16", 8, 3), ("mixed-ds", 6, 3)]:
        n = rng.randrange(10**6, 10**10)
        s = accounting.model_states(n, recipe, gpus, zero)
        cases.append((f"{n:,} params, {recipe}, {gpus} GPUs, ZeRO-{zero}",
                      dict(n_params=n, recipe=recipe, gpus=gpus, zero=zero),
                      {"params": s.params, "grads": s.grads, "optimizer": s.optimizer}))
    for case in cases:
        box: list = []                                      # what the learner's function returned
        grade(report, "model_state_bytes", guarded(fn), [case],
              compare=lambda got, want: box.append(got) or _same_ints(got, want), show=_show)
        if (row := report.rows[-1]).status == "wrong" and box and (
                hint := labhints.states_hint(box[-1], case[2], **case[1])):
            report.rows[-1] = Row(row.function, row.case, row.status, f"{hint} ({row.detail})")
        if _failed(report.rows[-1]):
            return


def plain_int(value) -> bool:
    """An ``int`` itself: not a bool, not a subclass (whose ``__eq__`` could say yes to anything)."""
    return type(value) is int


def _same_ints(got, want: dict) -> bool:
    if type(got) is not dict:        # the grader's message: "returned ..., expected a dict with keys ..."
        raise TypeError("not a dict")
    return set(got) == set(want) and all(plain_int(got[k]) and got[k] == want[k] for k in want)


def _show(value) -> str:
    return "{" + ", ".join(f"{k!r}: {v!r}" if plain_int(v) else f"{k!r}: {v!r} (a {type(v).__name__}, not an int)"
                           for k, v in value.items()) + "}"


def _failed(row: Row) -> bool:
    """Each function stops at its first failing case: that row is the one to fix."""
    return row.status in ("wrong", "error")


# (norm, mlp, qkv_bias) of part 3's cases, one variant at a time first, the kernel cycling; Gemma's norm first
VARIANT_CASES = [("gemma", "swiglu", False), ("hf", "swiglu", False), ("fused", "gelu-dropout", False),
                 ("fused", "swiglu", True), ("hf", "gelu-dropout", False), ("gemma", "gelu-dropout", True),
                 ("hf", "gelu-dropout", True)]
MIXED = 4                  # VARIANT_CASES[MIXED:] switch two or three on; a far shape draws from them
KERNEL_CYCLE = ("flash", "naive", "eager")
CHAINS = 3                 # chain MLPs drawn at each check, after VARIANT_CASES (the other far shape: one more)
# rule slips that passed most drawn checks each fail one (r19-r23, tests); the last four: products (r36-r39)
FIXED_CHAINS = (("hf", ("relu", "float", "gelu", "sigmoid"), True),
                ("gemma", ("relu", "scale", "gelu", "float", "sigmoid"), False),
                ("fused", ("sigmoid", "gelu", "dropout", "relu", "bf16"), False),
                ("hf", ("tanh", "silu", "exp", "gelu_tanh", "dropout", "square", "bf16"), False),
                ("fused", ("float", "exp", "float", "gelu"), True), ("gemma", ("float", "exp", "bf16", "gelu"), False),
                ("fused", ("sigmoid", "exp", "dropout", "gelu"), False), ("hf", ("tanh", "relu", "sigmoid", "tanh"), True),
                ("gemma", ("float", "bf16", "mul2", "sigmoid", "mul1"), True),
                ("fused", ("gelu", "float", "tanh", "mul3", "float", "square"), False),
                ("hf", ("float", "bf16", "mul1", "square"), False),      # r38 #1, r39 #1: bf16 x fp32 is
                ("gemma", ("gelu", "float", "mul2", "square"), True))    # fp32, whichever factor is earlier
FIXED_SHAPE = dict(d_model=72, n_heads=6, n_kv_heads=3, ffn=200, seq=23, batch=2)   # measured once a process
CHAIN_NOTE = ("this MLP's operations are combined at the check (most drawn afresh), so no table of chains "
              "seen before and no fit per operation covers them; work out what each one keeps (input, "
              "output or a mask; which dtype) and what two share")
REFUSALS = (labcopies.SAYS, labguard.SAYS, labguard.NO_OPS, labguard.REFUSAL)    # no chain note on these


def draw_chain(rng: random.Random) -> tuple:
    """A chain MLP's operations: three to eight names from :data:`.variants.OPS` and ``MULS``, with at
    least one product reaching two or more operations back."""
    ops = []
    for i in range(rng.randint(3, 8)):
        ops.append(rng.choice(variants.OPS + tuple(m for m in variants.MULS if variants.chain_op_ok(m, i))))
    if not any(op in variants.MULS[1:] for op in ops):
        i = rng.randrange(2, len(ops))
        ops[i] = rng.choice([m for m in variants.MULS[1:] if variants.chain_op_ok(m, i)])
    return tuple(ops)


def draw_variant(rng: random.Random) -> tuple:
    """(norm, a drawn chain, qkv_bias) of a chain case."""
    return rng.choice(variants.NORMS), draw_chain(rng), rng.random() < 0.5


def _grade_variants(report: Report, fn, rng: random.Random) -> None:
    name = "variant_layer"
    if fn is None:
        report.rows.append(Row(name, "part 3", "todo", f"define {name}"))
        return
    learner = guarded(fn)
    variants_ = VARIANT_CASES + [draw_variant(rng) for _ in range(CHAINS)]
    far = [(draw_far_shape(rng), ", far shape", v) for v in (rng.choice(VARIANT_CASES[MIXED:]), draw_variant(rng))]
    plan = list(enumerate([(draw_shape(rng), "", v) for v in variants_] + far))    # i: the kernel's turn
    plan[len(VARIANT_CASES):len(VARIANT_CASES)] = [(k, (FIXED_SHAPE, "", v)) for k, v in zip((0, 2, 1, 0, 2, 1, 0, 2, 1, 0, 2, 1), FIXED_CHAINS)]
    for i, (shape, tag, (norm, mlp, bias)) in plan:
        case = dict(shape, kernel=KERNEL_CYCLE[i % 3], norm=norm, mlp=mlp, qkv_bias=bias)

        def body(case=case):
            try:
                got = call(learner, **case)          # the truth is measured after the learner's call
            except LearnerError as err:     # a guard's refusal says why itself, first (review r11 #3)
                if isinstance(case["mlp"], tuple) and not any(s in str(err) for s in REFUSALS):
                    raise LearnerError(f"{CHAIN_NOTE} (your function raised {err})") from None
                raise
            want_bytes, want_params = truth = variants.measure(**case)
            if changed := labtruth.disagreement(case, truth):
                return "error", changed
            values = {k: got.get(k) for k in ("activations", "params")} if type(got) is dict else {}
            if not (values and all(plain_int(v) for v in values.values())):
                return "wrong", returned(got, "a dict with int 'activations' (bytes) and 'params'")
            for key, want in (("activations", want_bytes), ("params", want_params)):
                if values[key] != want:
                    return "wrong", labhints.why(learner, case, key, values[key], want)
            return "ok", ""
        if _failed(run_case(report, name, _label(case, kernel=case["kernel"], norm=norm, mlp=mlp,
                                                 qkv_bias=bias) + tag, body, limit=520)):   # r24, r25: long chains
            return


def _grade_gpu(report: Report, fn, measure_fn) -> str:
    """Optional, CUDA only: the learner's prediction (and measurement, if written) on the GPU. Adds
    rows only where it runs; returns the line the learner reads either way."""
    case = "optional GPU part: " + ", ".join(f"{k}={v}" for k, v in lab_gpu.VARIANT.items())
    if reason := lab_gpu.cuda_reason():
        return f"skipped ({reason})"
    if fn is None:
        return "skipped (variant_layer is not defined yet)"
    learner, start = guarded(fn), len(report.rows)
    for kernel in lab_gpu.KERNELS:
        args = dict(**lab_gpu.SHAPE, kernel=kernel, **lab_gpu.VARIANT)

        def body(args=args):
            got = call(learner, **args)
            predicted = got.get("activations") if isinstance(got, dict) else None
            if not plain_int(predicted):
                return "wrong", returned(got, "a dict with int 'activations'")
            return lab_gpu.verdict(predicted, lab_gpu.measure_cuda(args["kernel"]),
                                   lambda: variants.measure(**args)[0])
        run_case(report, "variant_layer", f"{case}, {kernel}", body)
        if measure_fn is not None:
            run_case(report, "gpu_held_bytes", f"{case}, {kernel}", lambda kernel=kernel: lab_gpu.measurement_verdict(
                lab_gpu.learners(call, lambda *a: read_now(measure_fn(*a)), kernel), lab_gpu.measure_cuda(kernel)))
    todo = [r for r in report.rows[start:] if r.status == "todo"]
    report.rows[start:] = [r for r in report.rows[start:] if r.status != "todo"]   # optional: no todo row
    if todo:
        return "ran what is written; " + " and ".join(dict.fromkeys(r.function for r in todo)) + " not written yet"
    return "graded on CUDA (the rows marked 'optional GPU part')"


def kernel_refusal() -> str:
    """Read in the learner's kernel before grading in the fresh process (gpumem.chapters.check_lab):
    a table of chain MLPs measured there (review r16 #2: the fresh process's cache is empty)."""
    return labtruth.tabulated()


def check(ns: dict, show: bool = True, seed: int | None = None) -> Report:
    """Grade ``model_state_bytes``, ``layer_activation_bytes`` and ``variant_layer`` from the
    lab's namespace (and, with CUDA, the optional GPU part); shapes are drawn from ``seed`` (fresh
    each time if None). Each function stops at its first failing case."""
    rng = seeds.rng(seed)
    report = Report(LAB)
    if refused := labtruth.refusal():          # torch changed before the check: nothing is graded
        report.rows.append(Row("check", "the kernel's torch and course", "error", refused))
        if show:
            print(report.summary())
        return report
    rows, said, cached = report.rows, (), labtruth._chain_keys()    # said: each row as it was made
    layers = lambda report, fn, rng: labpart2.grade(report, fn, rng, guarded)      # noqa: E731
    for part, name in ((_grade_states, "model_state_bytes"), (layers, "layer_activation_bytes"),
                       (_grade_variants, "variant_layer")):
        if not labtable.refused(report, ns, name):        # a table of fitted counts (review r29)
            part(report, ns.get(name), rng)
        said += tuple((r, r.status, r.detail) for r in report.rows[len(said):])   # earlier ones kept
    gpu_line = _grade_gpu(report, ns.get("variant_layer"), ns.get("gpu_held_bytes"))
    labtruth.graded(cached)                 # the chains measured since are the grader's
    if report.rows is not rows or len(rows) < len(said) or any(
            type(r) is not Row or r is not was or (r.status, r.detail) != (status, detail)
            for r, (was, status, detail) in zip(rows, said)):
        report.rows = [Row("report", "its rows", "error", "your function changed the grader's report after "
                                                         "a case was graded: derive the counts instead")]
    if show:
        print(report.summary(), f"GPU part: {gpu_line}", sep="\n")
    return report
