"""Lab 01, part 3: which switch a wrong ``variant_layer`` count gets wrong (and part 1's
:func:`states_hint`: which of ``model_state_bytes``' keys is off, by how many elements).

A count is a sum of terms, one per switch (``norm``, ``mlp``, ``qkv_bias``) on top of the plain
layer. The grader asks the learner's function again at the same shape with one switch set back to
part 2's layer, and compares the learner's term (their count with the switch on, minus with it
off) with the true term (the same difference of :func:`.variants.measure`). The switch whose term
differs is the one the hint names (the plain layer is checked first: when it is off, the row says to
fix part 2's count first and names no switch). So a
count that adds bytes for the biases is blamed on ``qkv_bias``, whatever else the case switches on.
A chain MLP's wrong term is narrowed down further (:func:`chain_hint`): the learner's count and
the measured one for the chain's prefixes, from no operation (up, then down) to all of them; the
first operation whose addition changes the two differently is named.
"""

from gpumem.course.grading import LearnerError, Todo, call

from . import variants

PLAIN = {"norm": "fused", "mlp": "swiglu", "qkv_bias": False}
KEYS = {"activations": ("bytes", 0), "params": ("parameters", 1)}


def _value(got, key: str):
    value = got.get(key) if isinstance(got, dict) else None
    return value if type(value) is int else None


def terms(learner, case: dict, key: str) -> dict:
    """{switch or "plain": (the learner's term, the true term)} for ``key`` ("activations" or
    "params"): each switch ``case`` turns on, and the plain layer at the case's shape. A term the
    learner's function cannot give (it raises, returns no int) is None."""
    index = KEYS[key][1]

    def ask(c):
        try:
            return _value(call(learner, **c), key)
        except (Todo, LearnerError):
            return None
    mine, true = ask(case), variants.measure(**case)[index]
    out = {}
    for switch, plain in PLAIN.items():
        if case[switch] != plain:
            off = {**case, switch: plain}
            other = ask(off)
            out[switch] = (None if mine is None or other is None else mine - other,
                           true - variants.measure(**off)[index])
    plain_case = {**case, **PLAIN}
    out["plain"] = (ask(plain_case), variants.measure(**plain_case)[index])
    return out


NORM_CLASS = {"hf": "LlamaRMSNorm", "gemma": "GemmaRMSNorm"}


def _bytes_hint(switch: str, mine: int, true: int, sizes: tuple, norm: str = "hf") -> str:
    """``sizes``: (tokens, d_model, ffn); ``norm``: the case's norm."""
    off = mine - true
    if switch == "norm":
        said, cls = f"norm={norm!r}", NORM_CLASS[norm]
        if mine == 0:
            return (f"{said}: {-off:,} B missing; your count keeps the fused RMSNorm's tensors: count what "
                    f"{cls}'s own operators save")
        if norm == "gemma" and off == -8 * sizes[1]:
            return (f"{said}: {-off:,} B missing, {-off // 2:,} B a norm: something d_model wide that is not "
                    "the weight itself")
        t, h = sizes[0], sizes[1]
        split = f" = {off // (2 * t * h):+} x 2 B x tokens x d_model" if off % (2 * t * h) == 0 else ""   # review r35 #3
        return (f"{said}: your norm term is {off:+,} B off{split}: list what {cls}'s operators save, "
                "with shape and dtype, and which of part 2's norm tensors are gone")
    if switch == "mlp":
        t, h, f = sizes
        if mine == 0:
            return (f"mlp='gelu-dropout': {off:+,} B; your count is SwiGLU's four F-wide tensors: count what "
                    "F.gelu, the dropout and the down projection keep")
        if off == t * h - t * f:
            return ("mlp='gelu-dropout': you counted Megatron's MLP (dropout on the output); here the dropout "
                    "acts on the F-wide hidden: what do gelu, dropout and down each keep?")
        if off == -t * f:
            return f"mlp='gelu-dropout': {t * f:,} B missing: the dropout's mask, one entry per hidden number"
        if off == t * f:
            return ("mlp='gelu-dropout': the dropout mask counted at 2 B an entry: what dtype does "
                    "native_dropout return?")
        if off == 2 * t * f:
            return (f"mlp='gelu-dropout': one F-wide bf16 tensor ({off:,} B) too many: which of gelu's input, "
                    "its output and the dropout's output does backward need?")
        return (f"mlp='gelu-dropout': your MLP term is {off:+,} B off: count what F.gelu, the dropout and the "
                "down projection keep, and which of SwiGLU's tensors are gone")
    if off > 0:
        return (f"qkv_bias=True: {off:,} B too many: what does backward need to compute a bias's gradient, "
                "and does it have to be saved?")
    return (f"qkv_bias=True: {-off:,} B missing: the biases take nothing away from what the projections "
            "save")


def _ask(learner, case: dict):
    try:
        return _value(call(learner, **case), "activations")
    except (Todo, LearnerError):
        return None


def chain_hint(learner, case: dict) -> str:
    """A chain MLP's wrong count: the first operation whose addition to the chain changes the
    learner's count by other than it changes the measured bytes."""
    ops, n = case["mlp"], case["batch"] * case["seq"] * case["ffn"]
    mine_before, true_before = _ask(learner, {**case, "mlp": ()}), variants.measure(**{**case, "mlp": ()})[0]
    if mine_before is not None and mine_before != true_before:
        return (f"mlp=() (up, then down, no operation between) is already {mine_before - true_before:+,} B "
                "off: what do the two projections keep?")
    for i in range(1, len(ops) + 1):
        mine, true = _ask(learner, {**case, "mlp": ops[:i]}), variants.measure(**{**case, "mlp": ops[:i]})[0]
        if mine is None or mine_before is None:
            break
        if mine - mine_before != true - true_before:
            after = f", after {ops[:i - 1]!r}" if i > 1 else ""
            cast = (f" (or the cast before it, {ops[i - 2]!r}: whether it copies decides what this one keeps)"
                    if i > 1 and ops[i - 2] in ("float", "bf16") else "")
            off = (mine - mine_before) - (true - true_before)      # r36 #4: the step's error, not its bytes
            return (f"operation {i}, {ops[i - 1]!r}{after}: your count is {abs(off):,} B ({abs(off) / n:g} x "
                    f"tokens x ffn) too {'high' if off > 0 else 'low'} at this step: what "
                    f"does it keep, in which dtype, sharing what{cast}?"
                    + (" (Or nothing: does a later one keep its new output?)" if mine == mine_before else ""))
        mine_before, true_before = mine, true
    return (f"mlp={ops!r}: your MLP term is off: go through the chain operation by operation (what each "
            "keeps, in which dtype; a tensor two operations keep counts once)")


def _params_hint(switch: str, mine: int, true: int, case: dict) -> str:
    off = mine - true
    if switch == "qkv_bias":
        return (f"qkv_bias=True: the q, k and v biases' {-off:,} parameters are missing" if off < 0 else
                f"qkv_bias=True: {off:,} parameters too many for three bias vectors (q's is d_model "
                "wide, k's and v's as wide as the keys)")
    if switch == "mlp":
        said = f"mlp={case['mlp']!r}"
        if off == case["d_model"] * case["ffn"]:
            return f"{said}: your count has SwiGLU's three matrices; this MLP has two"
        return f"{said}: your MLP's parameters are {off:+,} off; up and down, no biases"
    return f"norm={case['norm']!r}: {off:+,} parameters: {NORM_CLASS[case['norm']]} has one weight as wide as the fused norm's"


def why(learner, case: dict, key: str, got: int, want: int) -> str:
    """The row's detail for a wrong ``key``: the switch whose term differs, else the plain layer."""
    unit = KEYS[key][0]
    t = terms(learner, case, key)
    plain_mine, plain_true = t.pop("plain")
    wrong = [s for s, (mine, true) in t.items() if mine is not None and mine != true]
    whole = f" (this case: expected {want:,} {unit}, got {got:,})"      # r21, r22: the whole gap, every hint
    if plain_mine is not None and plain_mine != plain_true:     # r29: as part 2's and the chain rows, plain first
        return (f"the plain layer (norm='fused', mlp='swiglu', qkv_bias=False) at this shape is already "     # r33 #4
                f"{plain_mine - plain_true:+,} {unit} off: fix part 2's count first; the switches are checked after"
                + whole)
    if key == "activations" and len(wrong) > 1 and all(t[s][0] == 0 for s in wrong):
        named = " and ".join(f"{s}={case[s]!r}" for s in wrong)
        return (f"{named}: you counted the plain Llama layer ({got - want:+,} B); each of these variants "
                "changes what is saved" + whole)
    if wrong:
        mine, true = t[wrong[0]]
        if key == "activations" and wrong[0] == "mlp" and isinstance(case["mlp"], tuple):
            return chain_hint(learner, case) + whole
        said = _bytes_hint(wrong[0], mine, true, (case["batch"] * case["seq"], case["d_model"], case["ffn"]),
                           case["norm"]) if key == "activations" else _params_hint(wrong[0], mine, true, case)
        return said + whole
    return f"expected {want:,} {unit}, got {got:,} {unit} ({got - want:+,})"


SHARDED_FROM = {"optimizer": 1, "grads": 2, "params": 3}      # the ZeRO stage that first shards each


def states_hint(got, want: dict, n_params: int, recipe: str, gpus: int = 1, zero: int = 0) -> str:
    """Part 1's wrong dict, key by key (review r15 #4): how many bytes each differing key is off,
    over the bytes per element that key keeps ("optimizer: 12 B short = 12 B x 1 element: how is
    the last share rounded?"); empty when ``got`` is not a dict of ints with the right keys."""
    if type(got) is not dict or set(got) != set(want) or any(type(v) is not int for v in got.values()):
        return ""
    shard, said = -(-n_params // gpus), []
    for key, true in want.items():
        if got[key] == true:
            continue
        off, sharded = got[key] - true, zero >= SHARDED_FROM[key]
        held = shard if sharded else n_params
        per, word = true // held, "short" if off < 0 else "too many"
        if gpus > 1 and abs(off) == per * (n_params - shard):
            why = f"{per} B x {n_params - shard:,} elements: which ZeRO stage first shards the {key}?"
        elif sharded and off % per == 0 and 0 < abs(off) // per < gpus:
            m = abs(off) // per
            why = f"{per} B x {m} element{'s' * (m > 1)}: how is the last share rounded?"
        elif off % held == 0:
            why = (f"{abs(off) // held} B x {held:,} elements: how many bytes does {recipe!r} keep per "
                   f"element for the {key}?")
        else:
            why = "go through this key again"
        said.append(f"{key}: {abs(off):,} B {word} = {why}")
    return "; ".join(said)
