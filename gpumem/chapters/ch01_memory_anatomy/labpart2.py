"""Lab 01, part 2's grading: ``layer_activation_bytes`` against :func:`.labwide.measure`, on shapes
drawn at each check whose attention is not d_model wide (``n_heads * head_dim != d_model``),
with q/k norms per head (Qwen3), over the whole width (OLMo 2) or none, under all three kernels;
one far shape.

Chapter 01's table (a Llama layer: everything d_model or k wide) does not give these counts, and
``gpumem.memory.activations.layer_parts`` has no full-width q/k norm (it counts a 1/rms per
head): the first case of every check, and the far one, are ``qk_norm="full"``, so a copy of the
library fails there however it is disguised. A wrong count is explained by its first wrong term
(:func:`why`): the grader asks the learner's function again at the same shape as the plain Llama
layer (``head_dim = d_model // n_heads``, no q/k norms) and with the wide attention but no q/k
norms, and compares each step's change with the measured one: the plain layer first, then the
attention's width, then the norms. The plain layer's difference is put over the formula's
monomials at the case's own dims (:func:`_in_terms`: "-144 B off = -4 x heads x tokens": the units,
not which tensor or which operation), checked at nearby shapes where monomials equal at the case differ.
"""
from gpumem.course.grading import LearnerError, Report, Todo, call, returned, run_case

from . import labtruth, labwide

NAME = "layer_activation_bytes"
KERNELS = ("flash", "naive", "eager")


def label(case: dict, tag: str = "") -> str:
    """A row's case: the shape, kernel and q/k norm switch."""
    c = case
    return (f"d={c['d_model']} heads={c['n_heads']}/{c['n_kv_heads']}x{c['head_dim']} ffn={c['ffn']} "
            f"seq={c['seq']} batch={c['batch']} kernel={c['kernel']} qk_norm={c['qk_norm']!r} (traced{tag})")


def cases(rng) -> list[tuple[dict, str]]:
    """Two drawn shapes under each kernel, the q/k norms cycling so that the first case is OLMo 2's
    (which the library does not count) and each kernel meets two placements; then one far shape,
    also OLMo 2's."""
    norms = ("full", "per-head", "none")
    found = [(dict(shape, kernel=kernel, qk_norm=norms[(i + j) % 3]), "")
             for i, shape in enumerate((labwide.draw_shape(rng), labwide.draw_shape(rng)))
             for j, kernel in enumerate(KERNELS)]
    return found + [(dict(labwide.draw_far_shape(rng), kernel=rng.choice(KERNELS), qk_norm="full"), ", far shape")]


def _ask(learner, case: dict):
    """The learner's count at ``case``, or None if it raises or is no int."""
    try:
        got = call(learner, **case)
    except (Todo, LearnerError):
        return None
    return got if type(got) is int else None


def why(learner, case: dict, got: int, want: int) -> str:
    """The row's detail for a wrong count: its first wrong term."""
    h, a, d = case["d_model"], case["n_heads"], case["head_dim"]
    plain = {**case, "head_dim": h // a, "qk_norm": "none"}
    wide = {**case, "qk_norm": "none"}
    steps = [(plain, None), (wide, plain)] + ([(case, wide)] if case["qk_norm"] != "none" else [])
    for i, (now, before) in enumerate(steps):
        mine, true = _ask(learner, now), labwide.measure(**now)[0]
        if before is not None:
            mine_before = _ask(learner, before)
            mine = None if mine is None or mine_before is None else mine - mine_before
            true -= labwide.measure(**before)[0]
        if mine is None or mine == true:
            continue
        off = mine - true
        if i == 0:
            return (f"the plain Llama layer at this shape (head_dim = d_model // n_heads = {h // a}, "
                    f"qk_norm='none') is already {off:+,} B off{_in_terms(learner, now, off)}")
        if i == 1:
            what = "your count ignores head_dim" if mine == 0 else f"your width term is {off:+,} B off"
            return (f"head_dim={d}: the attention is {a}x{d} = {a * d} wide, d_model {h}; {what}: which saved "
                    "tensors are d_model wide, which n_heads*head_dim, which n_kv_heads*head_dim?")
        return _norm_hint(case, mine, off)
    return f"expected {want:,} B, got {got:,} B ({got - want:+,})"


# the plain layer's count is a sum of these, each times a few bytes (review r15 #4): name, value
MONOMIALS = (("tokens x d_model", lambda c, T: T * c["d_model"]),
             ("tokens x n_kv_heads x head_dim", lambda c, T: T * c["n_kv_heads"] * c["head_dim"]),
             ("tokens x ffn", lambda c, T: T * c["ffn"]),
             ("tokens", lambda c, T: T),
             ("heads x tokens", lambda c, T: T * c["n_heads"]),
             ("n_kv_heads x tokens", lambda c, T: T * c["n_kv_heads"]),
             ("batch x heads x seq^2", lambda c, T: T * c["n_heads"] * c["seq"]),
             ("seq^2", lambda c, T: c["seq"] ** 2))


def _probes(case: dict) -> list[dict]:
    """Shapes near ``case`` where the monomials that coincide at it differ: twice the query heads,
    twice all heads (the same head width), one more position, a wider MLP, one more sequence."""
    c, wide = case, {**case, "n_heads": 2 * case["n_heads"], "d_model": 2 * case["d_model"]}
    return [wide, {**wide, "n_kv_heads": 2 * c["n_kv_heads"]}, {**c, "seq": c["seq"] + 1},
            {**c, "ffn": c["ffn"] + 8}, {**c, "batch": c["batch"] + 1}]


def _terms(case: dict, off: int) -> list:
    """(coefficient, monomial) with coefficient x monomial = ``off`` at ``case``: the coefficient a
    whole number of bytes, at most 16."""
    T = case["batch"] * case["seq"]
    return [(off // v, m) for m in MONOMIALS if (v := m[1](case, T)) and off % v == 0 and 0 < abs(off // v) <= 16]


def _pairs(case: dict, off: int) -> list:
    """((k1, m1), (k2, m2)) with k1 x m1 + k2 x m2 = ``off`` at ``case``, each coefficient a whole
    number of bytes, at most 16 (review r31: naive attention's K and V left n_kv_heads wide is
    -4 x tokens x d_model + 4 x tokens x n_kv_heads x head_dim, one slip over two monomials)."""
    T = case["batch"] * case["seq"]
    vals = [(m, m[1](case, T)) for m in MONOMIALS]
    out = []
    for i, (m1, v1) in enumerate(vals):
        for m2, v2 in vals[i + 1:]:
            for k1 in range(-16, 17):
                rest = off - k1 * v1
                if k1 and v1 and v2 and rest % v2 == 0 and 0 < abs(rest // v2) <= 16:
                    out.append(((k1, m1), (rest // v2, m2)))
    return out


def _in_terms(learner, case: dict, off: int) -> str:
    """``off`` over the formula's monomials, from the case's own dims: " = -4 x heads x tokens" (review
    r29: the units only; which dtype and which operation are the learner's to find). A term that fits at the case may be a coincidence
    (two monomials equal there, or two slips that add up to one): the learner's function and the
    measure are asked again at :func:`_probes`' shapes, and only a term that is the difference there
    too is kept; then, with no single term left, a pair of terms (:func:`_pairs`) the same way; none,
    or more than one left: the old advice. ``case`` is the plain layer, so a monomial's head_dim is
    written as its number, d_model // n_heads (review r33 #3: the row's header shows the case's)."""
    offs: list = []                       # (probe, the learner's bytes off there), asked when needed

    def off_at(i: int):
        while len(offs) <= i:
            probe = _probes(case)[len(offs)]
            mine = _ask(learner, probe)
            offs.append((probe, None if mine is None else mine - labwide.measure(**probe)[0]))
        return offs[i]

    def holds(terms) -> bool:
        for i in range(len(_probes(case))):
            probe, there = off_at(i)
            T = probe["batch"] * probe["seq"]
            if there is None or sum(k * m[1](probe, T) for k, m in terms) != there:
                return False
        return True

    def named(name: str) -> str:      # r33 #3: the plain layer's head width as a number, not the case's
        return name.replace("head_dim", str(case["head_dim"]))

    found = [(k, m) for k, m in _terms(case, off) if holds([(k, m)])]
    if len({m[0] for _, m in found}) == 1:
        k, (name, _) = found[0]
        return f" = {k:+} x {named(name)}"
    if not found:
        pairs = [p for p in _pairs(case, off) if holds(p)]
        if len({(a[0], a[1][0], b[0], b[1][0]) for a, b in pairs}) == 1:
            (k1, (n1, _)), (k2, (n2, _)) = pairs[0]
            return f" = {k1:+} x {named(n1)} {k2:+} x {named(n2)}"
    return ": go through its operations again"


def _norm_hint(case: dict, mine: int, off: int) -> str:
    """A wrong q/k norm term: what the learner's term most likely left out or added."""
    T, a, k, said = case["batch"] * case["seq"], case["n_heads"], case["n_kv_heads"], f"qk_norm={case['qk_norm']!r}"
    if mine == 0:
        return f"{said}: your count has no q/k norm term: what does each of the two RMSNorms save?"
    rows = (a + k) * T if case["qk_norm"] == "per-head" else 2 * T      # 1/rms rows of the two norms
    if off == -4 * rows:
        return f"{said}: {-off:,} B missing: each norm's fp32 1/rms, one per row it normalises"
    if case["qk_norm"] == "full" and off == 4 * (a + k - 2) * T:
        return (f"{said}: {off:+,} B = 4 B x {off // 4:,} rows of 1/rms too many: this norm runs before the "
                "split into heads: how many rows does it normalise per token?")     # review r35 #2: no diagnosis
    if case["qk_norm"] == "per-head" and off == -4 * (a + k - 2) * T:
        return (f"{said}: {off:+,} B = 4 B x {-off // 4:,} rows of 1/rms too few: this norm runs after the "
                "split into heads: how many rows does it normalise per token?")
    if off % (4 * T) == 0 and 0 < abs(off) // (4 * T) <= a + k:      # review r36 #3: rows, any other count
        return (f"{said}: {off:+,} B = 4 B x {abs(off) // 4:,} rows of 1/rms too {'many' if off > 0 else 'few'}: "
                "how many rows does each of the two norms normalise per token?")
    return (f"{said}: your q/k norm term is {off:+,} B off: go through the two norms, and RoPE between them "
            "and the attention, operation by operation")


def grade(report: Report, fn, rng, guarded) -> None:
    """Part 2's rows: each drawn case, stopping at the first that fails."""
    if fn is None:
        from gpumem.course.grading import Row
        report.rows.append(Row(NAME, "part 2", "todo", f"define {NAME}"))
        return
    learner = guarded(fn)
    for case, tag in cases(rng):
        def body(case=case):
            got = call(learner, **case)          # the truth is measured after the learner's call
            truth = labwide.measure(**case)
            if changed := labtruth.wide_disagreement(case, truth):
                return "error", changed
            if type(got) is not int:
                return "wrong", returned(got, "an int (bytes)")
            return ("ok", "") if got == truth[0] else ("wrong", why(learner, case, got, truth[0]))
        if run_case(report, NAME, label(case, tag), body).status in ("wrong", "error"):
            return
