"""Lab 01's grader against the cheapest submissions that skip the idea (issue 21).

Part 3 (``variant_layer``) grades layers chapter 01 never tabulates, on real-tensor traces at
shapes drawn at each check. Each submission below skips the reasoning one way: it copies the
chapter's Llama counts, asks the course's own tracer or formulas, measures with saved-tensor
hooks, replays a table of answers seen in an earlier report, or makes a learner's likely slip.
Each must fail with a row saying what was skipped. The truth is held to independent counts here:
the fake-tensor MemTracker trace of the plain layer, and hand counts of the variants.
"""

import random
import sys

import pytest
import torch

from conftest import ROOT
from gpumem.chapters.ch01_memory_anatomy import lab_gpu, labcheck, variants
from gpumem.course.grading import Report
from gpumem.memory import activations
from gpumem.memory.accounting import RECIPE as _RECIPE
from gpumem.memory.models import ModelConfig
from test_labs import notebook_namespace

_NS: dict = {}


def solution() -> dict:
    if not _NS:
        _NS.update(notebook_namespace(ROOT / "solutions" / "lab01_memory_calculator.ipynb"))
    return dict(_NS)


def grade(ns: dict, seed: int = 0):
    return labcheck.check(ns, show=False, seed=seed)


def rows(report, function: str):
    return [r for r in report.rows if r.function == function and "optional GPU part" not in r.case]


def first_problem(report, function: str):
    return next(r for r in rows(report, function) if r.status != "ok")


def llama_params(d_model, n_heads, n_kv_heads, ffn):
    kv = n_kv_heads * (d_model // n_heads)
    return 2 * d_model + 2 * d_model * d_model + 2 * d_model * kv + 3 * d_model * ffn


# ---- the truth, against independent counts ----------------------------------------------------

def test_real_tensor_count_equals_the_fake_tensor_trace_of_the_plain_layer():
    """Saved-tensor hooks on real tensors and MemTracker's depth-3-minus-depth-2 trace agree."""
    cfg = ModelConfig("adv", 3, 72, 6, 3, 200, 3000)
    for kernel in ("flash", "naive", "eager"):
        assert variants.measure(72, 6, 3, 200, 11, 2, kernel, "fused", "swiglu", False)[0] == \
            labcheck.traced_layer(cfg, kernel, 11, 2)


def test_variants_against_hand_counts():
    """d=64, 4 query / 2 kv heads (k = 32), F=96, s=10, b=3: T = 30 tokens, flash."""
    T, h, k, F, a = 30, 64, 32, 96, 4
    attention = 2 * T * (h + 2 * k) + 2 * T * h + 4 * a * T          # q, k, v, output, logsumexp
    # fused: its bf16 input and an fp32 1/rms per row (ctx.save_for_backward); HF's: the fp32 copy
    # of the input (pow keeps it, and the product with rsqrt reads the same tensor), rsqrt's fp32
    # 1/rms, and the bf16 normalised copy the weight multiply keeps (library docstrings: totals only)
    fused_norm, hf_norm = 2 * T * h + 4 * T, 4 * T * h + 4 * T + 2 * T * h
    # Gemma's: pow's fp32 copy, rsqrt's 1/rms, and the fp32 product's two factors: the normalised
    # input and 1 + weight (h wide, fp32, made from the weight: not a parameter's storage)
    gemma_norm = 4 * T * h + 4 * T + 4 * T * h + 4 * h
    plain = 2 * fused_norm + 2 * 2 * T * h + attention + 4 * 2 * T * F
    got = {v: variants.measure(64, 4, 2, 96, 10, 3, "flash", *v) for v in
           [("fused", "swiglu", False), ("hf", "swiglu", False), ("fused", "gelu-dropout", False),
            ("fused", "swiglu", True), ("gemma", "swiglu", False)]}
    assert got["fused", "swiglu", False] == (plain, llama_params(64, 4, 2, 96))
    assert got["hf", "swiglu", False][0] == plain + 2 * (hf_norm - fused_norm)
    assert got["gemma", "swiglu", False] == (plain + 2 * (gemma_norm - fused_norm), llama_params(64, 4, 2, 96))
    # GeLU's input, the bool mask and dropout's output (down's input); GeLU's output is not kept
    assert got["fused", "gelu-dropout", False] == (plain - 8 * T * F + 2 * T * F + T * F + 2 * T * F,
                                                   llama_params(64, 4, 2, 96) - h * F)
    assert got["fused", "swiglu", True] == (plain, llama_params(64, 4, 2, 96) + h + 2 * k)


def test_the_solution_passes_at_other_draws():
    for seed in (1,):
        report = grade(solution(), seed)
        assert report.solved, report.summary()


# ---- submissions that skip the reasoning -------------------------------------------------------

def copying_the_chapter():
    """The chapter's Llama counts (part 2's function) for every variant."""
    part2 = solution()["layer_activation_bytes"]

    def copy(d_model, n_heads, n_kv_heads, ffn, seq, batch, kernel, norm, mlp, qkv_bias):
        return {"activations": part2(d_model, n_heads, n_kv_heads, d_model // n_heads, ffn, seq, batch, kernel,
                                     qk_norm="none"),
                "params": llama_params(d_model, n_heads, n_kv_heads, ffn)}
    return copy


def test_chapter_formulas_copied_for_the_variants_fail_at_the_first_case():
    report = grade({"variant_layer": copying_the_chapter()})
    got = rows(report, "variant_layer")
    assert len(got) == 1, report.summary()                  # it stops at its first failing case
    assert "norm=gemma" in got[0].case and "norm='gemma'" in got[0].detail and "missing" in got[0].detail
    assert "GemmaRMSNorm" in got[0].detail


def _ask_variants(d_model, n_heads, n_kv_heads, ffn, seq, batch, kernel, norm, mlp, qkv_bias):
    act, params = variants.measure(d_model, n_heads, n_kv_heads, ffn, seq, batch, kernel, norm, mlp, qkv_bias)
    return {"activations": act, "params": params}


def _ask_labcheck(d_model, n_heads, n_kv_heads, ffn, seq, batch, kernel, **kw):
    return labcheck.traced_layer(ModelConfig("x", 3, d_model, n_heads, n_kv_heads, ffn, 500), kernel, seq, batch)


_bound = activations.layer_parts          # bound before the check, as `from ... import` would


def _ask_formula(d_model, n_heads, n_kv_heads, ffn, seq, batch, kernel, **kw):
    return sum(_bound(ModelConfig("x", 1, d_model, n_heads, n_kv_heads, ffn, 10), seq, batch, kernel, 2).values())


def _ask_accounting(n_params, recipe, gpus=1, zero=0):
    from gpumem.memory import accounting
    s = accounting.model_states(n_params, recipe, gpus, zero)
    return {"params": s.params, "grads": s.grads, "optimizer": s.optimizer}


def _hooks_on_the_block(d_model, n_heads, n_kv_heads, ffn, seq, batch, kernel, norm, mlp, qkv_bias):
    """Builds the block and adds up saved tensors itself: measuring, not deriving."""
    from gpumem.memory import llama
    block = variants.VariantBlock(ModelConfig("x", 1, d_model, n_heads, n_kv_heads, ffn, 10), norm, mlp, qkv_bias)
    cos, sin = llama.rope_tables(seq, d_model // n_heads, 5e5, torch.float32)
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(torch.randn(batch, seq, d_model, requires_grad=True), cos, sin, kernel)
    return {"activations": sum(seen.values()), "params": sum(p.numel() for p in block.parameters())}


def _subprocess_tracer(**kw):
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True, text=True)
    return int(out.stdout)


def _read_recipe(n_params, recipe, gpus=1, zero=0):
    """Review r22's part 1: the course's table of bytes per role, read instead of worked out."""
    r = _RECIPE[recipe]
    share = -(-n_params // gpus)
    held = [share if zero >= stage else n_params for stage in (3, 2, 1)]
    return {"params": r.params * held[0], "grads": r.grads * held[1],
            "optimizer": sum(b for _, b in r.optimizer) * held[2]}


@pytest.mark.parametrize("name, fn, says", [
    ("variant_layer", _ask_variants, "variants.measure is switched off"),
    ("layer_activation_bytes", _ask_labcheck, "labcheck.traced_layer is switched off"),
    ("layer_activation_bytes", _ask_formula, "activations.layer_parts is switched off"),
    ("model_state_bytes", _ask_accounting, "accounting.model_states is switched off"),
    ("variant_layer", _hooks_on_the_block, "variants.VariantBlock.__init__ (the course's code"),  # labcopies
    ("layer_activation_bytes", _subprocess_tracer, "Popen is switched off"),
    ("model_state_bytes", _read_recipe, "accounting.Recipe is switched off"),
])
def test_the_course_answers_and_tracing_tools_are_switched_off(name, fn, says):
    report = grade({name: fn})
    got = rows(report, name)
    assert got and all(r.status == "error" and says in r.detail and "derive it yourself" in r.detail
                       for r in got), report.summary()
    # and everything is back afterwards
    assert torch.is_grad_enabled() and activations.layer_parts is _bound and _RECIPE["mixed"].grads == 2
    assert _ask_variants(48, 4, 2, 64, 5, 1, "flash", "hf", "swiglu", False)["activations"] > 0
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        pass


def test_a_model_of_ones_own_records_no_graph():
    """A layer the learner writes (not the course's) cannot even be built: no tensor op runs while
    the learner's function is graded."""
    def own_layer(d_model, n_heads, n_kv_heads, ffn, seq, batch, kernel, norm, mlp, qkv_bias):
        up = torch.nn.Linear(d_model, ffn)
        torch.nn.functional.gelu(up(torch.randn(batch, seq, d_model, requires_grad=True)))
        return {"activations": 0, "params": 0}
    got = rows(grade({"variant_layer": own_layer}), "variant_layer")
    assert got and all(r.status == "error" and "no tensor ops: derive the count" in r.detail for r in got)


# ---- the reviewer's way round the first guard (issue 21 review of lab 01) ---------------------

def _load_copy(path, name, register=True):
    import importlib.util
    import sys
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _saved_walk(out) -> int:
    """Adds up the tensors autograd saved, reading ``grad_fn._saved_*`` directly (no hooks)."""
    seen, todo, done = {}, [out.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or node in done:
            continue
        done.add(node)
        for attr in dir(node):
            value = getattr(node, attr, None) if attr.startswith("_saved_") else None
            if isinstance(value, torch.Tensor):
                seen[value.untyped_storage().data_ptr()] = value.untyped_storage().nbytes()
        todo += [f for f, _ in node.next_functions]
    return sum(seen.values())


def _reviewer_cheat(llama_copy, variants_copy):
    """Copies of llama.py and variants.py, the block built with grad off, the C switch turned on,
    the saved tensors read off ``grad_fn``: measured, not derived."""
    def cheat(d_model, n_heads, n_kv_heads, ffn, seq, batch, kernel, norm, mlp, qkv_bias):
        cfg = ModelConfig("x", 1, d_model, n_heads, n_kv_heads, ffn, 10)
        block = variants_copy.VariantBlock(cfg, norm, mlp, qkv_bias).to(torch.bfloat16)
        cos, sin = llama_copy.rope_tables(seq, d_model // n_heads, 5e5, torch.bfloat16)
        torch._C._set_grad_enabled(True)
        out = block(torch.randn(batch, seq, d_model, dtype=torch.bfloat16, requires_grad=True) * 1,
                    cos, sin, kernel)
        return {"activations": _saved_walk(out), "params": sum(p.numel() for p in block.parameters())}
    return cheat


@pytest.mark.parametrize("register, says", [
    (True, "ch01_memory_anatomy.variants.VariantBlock.__init__ (the course's code"),   # its super()
    (False, "ch01_memory_anatomy.variants.VariantBlock.__init__ (the course's code"),   # unregistered
])
def test_copies_of_the_course_loaded_under_other_names_fail(register, says):
    """Copies of llama.py and variants.py, registered or not: the copy watch (labcopies) sees the
    copied VariantBlock.__init__ first (it calls super(), which the switch-off leaves alone)."""
    import sys

    from gpumem.memory import llama
    names = ("gpumem.memory.lab01_copy_llama", "gpumem.chapters.ch01_memory_anatomy.lab01_copy_variants")
    llama_copy = _load_copy(llama.__file__, names[0], register)
    variants_copy = _load_copy(variants.__file__, names[1], register)
    variants_copy.llama = llama_copy          # the copy of variants would import the real llama
    try:
        report = grade({"variant_layer": _reviewer_cheat(llama_copy, variants_copy)})
    finally:
        for name in names:
            sys.modules.pop(name, None)
    got = rows(report, "variant_layer")
    assert got and all(r.status == "error" and says in r.detail for r in got), report.summary()
    assert torch.is_grad_enabled() and torch.ones(2).sum().item() == 2


def _grad_on_by_the_c_switch(**kw):
    torch._C._set_grad_enabled(True)
    return 0


def _copy_loaded_during_the_call(d_model, n_heads, n_kv_heads, ffn, seq, batch, kernel, **kw):
    from gpumem.memory import activations as a
    copy = _load_copy(a.__file__, "gpumem.memory.lab01_copy_activations", register=False)
    return sum(copy.layer_parts(ModelConfig("x", 1, d_model, n_heads, n_kv_heads, ffn, 10), seq, batch,
                                kernel, 2).values())


_pop = torch._C._pop_torch_dispatch_stack          # bound before the check
_pop_f = torch._C._pop_torch_function_stack


def _modes_popped(**kw):
    _pop(None), _pop_f()
    return int(torch.zeros(1).sum().item())


def _modes_disabled(**kw):
    from torch.utils._python_dispatch import _disable_current_modes
    with _disable_current_modes():
        return 0


@pytest.mark.parametrize("fn, says", [
    (_grad_on_by_the_c_switch, "torch._C._set_grad_enabled(True) is switched off"),
    (_copy_loaded_during_the_call, "opening activations"),
    (_modes_popped, "the tensor-op guard was switched off inside your function"),
    (_modes_disabled, "_disable_current_modes is switched off"),
])
def test_ways_out_of_the_tensor_op_guard_fail(fn, says):
    report = grade({"layer_activation_bytes": fn})
    got = rows(report, "layer_activation_bytes")
    assert got and all(r.status == "error" and says in r.detail for r in got), report.summary()
    assert torch.is_grad_enabled() and torch.ones(2).sum().item() == 2
    assert torch._C._len_torch_dispatch_stack() == 0 and torch._C._len_torch_function_stack() == 0


def test_the_solution_does_no_tensor_op_and_passes_at_far_shapes():
    report = grade(solution(), seed=3)
    far = [r for r in report.rows if "far shape" in r.case]
    assert len(far) == 3 and all(r.status == "ok" for r in far), report.summary()
    assert max(len(line) for line in report.summary().splitlines()) <= 100


def test_a_table_of_answers_from_an_earlier_report_fails_at_the_next_draw():
    names = ("layer_activation_bytes", "variant_layer")
    right, tables = solution(), {n: {} for n in names}

    def recorder(fn):
        count, table = right[fn], tables[fn]        # empty while the table rule measures it

        def seen(**kw):
            table[tuple(sorted(kw.items()))] = count(**kw)
            return table[tuple(sorted(kw.items()))]
        return seen

    def replay(fn):
        table, none = tables[fn], {} if fn == "variant_layer" else 0
        return lambda **kw: table.get(tuple(sorted(kw.items())), none)
    assert grade({n: recorder(n) for n in names}, seed=10).solved is False      # model states: todo
    for seed in (10, 11):       # the draw it recorded or the next: a table of answers, graded on no case
        report = grade({n: replay(n) for n in names}, seed=seed)
        for n in names:
            assert "B: table" in _table_row(report, n)


# ---- a learner's likely slips: each hint names the switch whose term is wrong --------------------

def _slip(act=lambda kw: 0, params=lambda kw: 0):
    right = solution()["variant_layer"]

    def fn(**kw):
        got = right(**kw)
        return {"activations": got["activations"] + act(kw), "params": got["params"] + params(kw)}
    return fn


def _T(kw):
    return kw["batch"] * kw["seq"]


def _kv(kw):
    return kw["n_kv_heads"] * (kw["d_model"] // kw["n_heads"])


def _when(switch, value, term):
    return lambda kw: term(kw) if kw[switch] == value else 0


# hand counts per norm: fused 2Th + 4T; hf 4Th (pow's fp32 copy) + 4T (rsqrt) + 2Th (bf16 normalised)
HF, GELU, BIAS, GEMMA = ("norm", "hf"), ("mlp", "gelu-dropout"), ("qkv_bias", True), ("norm", "gemma")
SLIPS = {   # name: (switch, activations change, params change, the case's variant, words in the hint)
    "gemma norm without its fp32 1 + weight": (GEMMA, lambda kw: -2 * 4 * kw["d_model"], None,
                                               "norm=gemma mlp=swiglu", ["norm='gemma'", "not the weight"]),
    "gemma norm counted as hf": (GEMMA, lambda kw: -2 * (2 * _T(kw) * kw["d_model"] + 4 * kw["d_model"]), None,
                                 "norm=gemma mlp=swiglu", ["norm='gemma'", "GemmaRMSNorm's operators"]),
    "hf norm counted as fused": (HF, lambda kw: -2 * 4 * _T(kw) * kw["d_model"], None,
                                 "norm=hf mlp=swiglu qkv_bias=False", ["norm='hf'", "fused RMSNorm"]),
    "hf norm without the bf16 normalised copy": (HF, lambda kw: -2 * 2 * _T(kw) * kw["d_model"], None,
                                                 "norm=hf mlp=swiglu", ["norm='hf'", "norm term"]),
    "GeLU MLP counted as SwiGLU": (GELU, lambda kw: 3 * 2 * _T(kw) * kw["ffn"] // 2, None,
                                   "norm=fused mlp=gelu-dropout", ["mlp='gelu-dropout'", "SwiGLU"]),
    "Megatron's MLP copied from the chapter": (GELU, lambda kw: _T(kw) * (kw["d_model"] - kw["ffn"]), None,
                                               "mlp=gelu-dropout", ["Megatron's MLP", "hidden"]),
    "dropout mask left out": (GELU, lambda kw: -_T(kw) * kw["ffn"], None, "mlp=gelu-dropout", ["dropout's mask"]),
    "dropout mask at 2 B": (GELU, lambda kw: _T(kw) * kw["ffn"], None, "mlp=gelu-dropout", ["at 2 B an entry"]),
    "GeLU output kept too": (GELU, lambda kw: 2 * _T(kw) * kw["ffn"], None, "mlp=gelu-dropout",
                             ["one F-wide bf16 tensor"]),
    "bias outputs saved again": (BIAS, lambda kw: 2 * _T(kw) * (kw["d_model"] + 2 * _kv(kw)), None,
                                 "norm=fused mlp=swiglu qkv_bias=True", ["qkv_bias=True", "too many"]),
    "bias parameters left out": (BIAS, None, lambda kw: -(kw["d_model"] + 2 * _kv(kw)),
                                 "qkv_bias=True", ["qkv_bias=True", "parameters are missing"]),
    "GeLU MLP with three matrices": (GELU, None, lambda kw: kw["d_model"] * kw["ffn"], "mlp=gelu-dropout",
                                     ["three matrices"]),
}


@pytest.mark.parametrize("name", list(SLIPS))
def test_each_hint_names_the_switch_whose_term_is_wrong(name):
    (switch, value), act, params, case, says = SLIPS[name]
    fn = _slip(_when(switch, value, act) if act else (lambda kw: 0),
               _when(switch, value, params) if params else (lambda kw: 0))
    got = rows(grade({"variant_layer": fn}), "variant_layer")
    assert got[-1].status == "wrong" and all(r.status == "ok" for r in got[:-1])   # stops at the first
    assert case in got[-1].case and all(w in got[-1].detail for w in says), (got[-1].case, got[-1].detail)


def test_review_r29_a_stub_is_told_its_plain_layer_first():
    """r29: a variant_layer returning zeros was told "norm='gemma': 33,888 B missing; your count keeps
    the fused RMSNorm's tensors": a difference of two zero counts. The plain layer is checked first,
    as part 2's and the chain rows do."""
    got = rows(grade({"variant_layer": lambda **kw: {"activations": 0, "params": 0}}), "variant_layer")
    assert got[0].status == "wrong" and got[0].detail.startswith("the plain layer"), got[0].detail
    assert "fix part 2's count first" in got[0].detail and "RMSNorm" not in got[0].detail, got[0].detail


def test_a_wrong_plain_layer_is_named_as_such():
    got = rows(grade({"variant_layer": _slip(lambda kw: 4 * _T(kw))}), "variant_layer")
    assert len(got) == 1 and "the plain layer" in got[0].detail and "part 2" in got[0].detail, got[0].detail


@pytest.mark.parametrize("extra", ["T*F", "T*h"])
def test_a_bias_slip_is_blamed_on_the_biases_in_a_case_with_every_switch_on(extra):
    """The reviewer's case: bytes added for the biases happen to equal another switch's typical slip
    (the dropout mask at 2 B, T*F; the old hint's T*h). The hint compares each switch's term."""
    from gpumem.chapters.ch01_memory_anatomy import labhints
    from gpumem.course.grading import call
    case = dict(d_model=48, n_heads=4, n_kv_heads=2, ffn=80, seq=9, batch=2, kernel="naive", norm="hf",
                mlp="gelu-dropout", qkv_bias=True)
    size = {"T*F": 18 * 80, "T*h": 18 * 48}[extra]
    fn = _slip(lambda kw: size if kw["qkv_bias"] else 0)
    got, want = call(fn, **case)["activations"], variants.measure(**case)[0]
    hint = labhints.why(fn, case, "activations", got, want)
    assert hint.startswith(f"qkv_bias=True: {size:,} B too many"), hint


def test_model_state_bytes_stops_at_its_first_wrong_case():
    right = solution()["model_state_bytes"]
    got = rows(grade({"model_state_bytes": lambda n_params, recipe, gpus=1, zero=0:
                      {**right(n_params, recipe, gpus, zero), "grads": 2 * n_params}}), "model_state_bytes")
    assert [r.status for r in got] == ["ok", "ok", "wrong"] and "mixed-ds" in got[-1].case


# ---- cheap passes tried in round two --------------------------------------------------------------

class _AlwaysEqual(int):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False
    __hash__ = int.__hash__


class _AlwaysEqualDict(dict):
    def __eq__(self, other):
        return True


def _poison_the_cache(d_model, n_heads, n_kv_heads, ffn, seq, batch, kernel, norm, mlp, qkv_bias):
    variants._truth[d_model, n_heads, n_kv_heads, ffn, seq, batch, kernel, norm, mlp, bool(qkv_bias)] = (1, 1)
    return {"activations": 1, "params": 1}


def _rebind_the_truth(d_model, n_heads, n_kv_heads, ffn, seq, batch, kernel, norm, mlp, qkv_bias):
    variants.measure = lambda *a, **k: (1, 1)
    return {"activations": 1, "params": 1}


def _patch_torch(d_model, n_heads, n_kv_heads, ffn, seq, batch, kernel, norm, mlp, qkv_bias):
    import contextlib
    torch.autograd.graph.saved_tensors_hooks = lambda *a: contextlib.nullcontext()
    return {"activations": 0, "params": 0}


def _shadow_a_builtin(d_model, n_heads, n_kv_heads, ffn, seq, batch, kernel, norm, mlp, qkv_bias):
    variants.sum = lambda values: 0                  # measure's sum() would read it first
    return {"activations": 0, "params": 0}


def _switch_the_restore_off_then_poison(**kw):
    """The second guard's own functions rebound first: they were bound before the call."""
    from gpumem.chapters.ch01_memory_anatomy import labguard, labstate
    labstate.restore = labguard.labstate.restore = lambda taken: []
    return _poison_the_cache(**kw)


_MEASURE, _HOOKS = variants.measure, torch.autograd.graph.saved_tensors_hooks


@pytest.mark.parametrize("ns, says", [
    # the answer is read as plain values under the guard (r20): the subclasses' values are graded
    ({"model_state_bytes": lambda n_params, recipe, gpus=1, zero=0: _AlwaysEqualDict()}, "got {}"),
    ({"model_state_bytes": lambda n_params, recipe, gpus=1, zero=0: dict.fromkeys(
        ("params", "grads", "optimizer"), _AlwaysEqual(0))}, "got {'params': 0, 'grads': 0, 'optimizer': 0}"),
    ({"layer_activation_bytes": lambda **kw: _AlwaysEqual(0)}, "off: go through its operations again"),
    ({"variant_layer": lambda **kw: {"activations": _AlwaysEqual(0), "params": _AlwaysEqual(0)}},
     "the plain layer"),          # graded as the zeros they are: the plain layer is off first (r29)
    ({"variant_layer": _poison_the_cache}, "changed variants._truth (its contents)"),
    ({"variant_layer": _rebind_the_truth}, "changed variants.measure"),
    ({"variant_layer": _patch_torch}, "changed torch.autograd.graph.saved_tensors_hooks"),
    ({"variant_layer": _shadow_a_builtin}, "changed variants.sum"),
    ({"variant_layer": _switch_the_restore_off_then_poison}, "variants._truth (its contents), labstate.restore"),
], ids=["eq-dict", "eq-int-values", "eq-int", "eq-int-variant", "cache", "rebind", "torch", "builtin",
        "guard-off"])
def test_answers_that_fool_the_compare_or_the_truth_fail(ns, says):
    report = grade(ns)
    (name,) = ns
    got = rows(report, name)
    assert len(got) == 1 and got[0].status in ("wrong", "error") and says in got[0].detail, report.summary()
    assert variants.measure is _MEASURE and torch.autograd.graph.saved_tensors_hooks is _HOOKS
    assert "sum" not in vars(variants) and all(v[0] > 1 for v in variants._truth.values())
    from gpumem.chapters.ch01_memory_anatomy import labstate
    assert labstate.restore.__name__ == "restore"


def test_a_fudge_factor_fitted_on_one_shape_fails_at_the_drawn_ones():
    """Part 2's count times the ratio HF's norm gave at one shape: a constant, not the formula."""
    part2 = solution()["layer_activation_bytes"]
    at = dict(d_model=64, n_heads=4, n_kv_heads=2, ffn=160, seq=16, batch=1, kernel="flash")
    plain = part2(**at, head_dim=16, qk_norm="none")
    ratio = variants.measure(**at, norm="hf", mlp="swiglu", qkv_bias=False)[0] / plain

    def fudge(d_model, n_heads, n_kv_heads, ffn, seq, batch, kernel, norm, mlp, qkv_bias):
        count = part2(d_model, n_heads, n_kv_heads, d_model // n_heads, ffn, seq, batch, kernel, "none")
        return {"activations": round(count * ratio) if norm == "hf" else count,
                "params": llama_params(d_model, n_heads, n_kv_heads, ffn)}
    got = rows(grade({"variant_layer": fudge}), "variant_layer")
    assert len(got) == 1 and got[0].status == "wrong" and "norm='gemma'" in got[0].detail    # Gemma's first


def test_chapter_01_does_not_print_what_part_3_grades():
    """The variant terms (HF's norm: +8 sbh a layer, an fp32 copy kept by pow; the GeLU MLP with
    dropout on its hidden) are the lab's to derive; the chapter keeps the stock layer's column."""
    import json
    cells = json.loads((ROOT / "notebooks" / "01_memory_anatomy.ipynb").read_text())["cells"]
    text = "\n".join("".join(c["source"]) + "".join("".join(o.get("text", "")) for o in c.get("outputs", []))
                     for c in cells)
    for leak in ("48.5 sbh", "8 *sbh* more", "kept by `pow`", 'norm="hf")', "norm=norm", "T5DenseActDense"):
        assert leak not in text, leak
    assert "2sbh + 4sb" in text                      # the stock layer's formula column stays


# ---- the optional GPU part ------------------------------------------------------------------------

def test_gpu_part_is_skipped_without_cuda_with_no_row_and_a_line(capsys):
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the gpu-marked test covers this")
    report = labcheck.check(solution(), seed=0)
    assert report.solved and not [r for r in report.rows if "optional GPU part" in r.case]
    out = capsys.readouterr().out
    assert "GPU part: skipped (no CUDA device here" in out and "checks pass" in out


def test_gpu_verdicts():
    measured = {"held": 1_000_000, "peak": 1_500_000}
    assert lab_gpu.verdict(1_010_000, measured, lambda: 0)[0] == "ok"
    status, detail = lab_gpu.verdict(900_000, measured, lambda: 900_000)
    assert status == "ok" and "CPU trace" in detail
    status, detail = lab_gpu.verdict(800_000, measured, lambda: 900_000)
    assert status == "wrong" and "-20.0%" in detail
    assert lab_gpu.measurement_verdict({"held": 1_000_000, "peak": 1_500_000}, measured)[0] == "ok"
    assert "peak" in lab_gpu.measurement_verdict({"held": 1_000_000, "peak": 900_000}, measured)[1]


@pytest.mark.gpu
def test_gpu_part_on_cuda(gpu_record):
    report = grade(solution())
    gpu = [r for r in report.rows if "optional GPU part" in r.case]
    for kernel in lab_gpu.KERNELS:
        m = lab_gpu.measure_cuda(kernel)
        gpu_record(f"lab01.variant_held_bytes_{kernel}", m["held"], "B")
        gpu_record(f"lab01.variant_peak_bytes_{kernel}", m["peak"], "B")
    assert len(gpu) == 2 * len(lab_gpu.KERNELS) and all(r.status == "ok" for r in gpu), report.summary()


def test_a_stopped_loop_leaves_the_course_switched_back_on(monkeypatch):
    """The time limit strikes inside the guard; everything is restored all the same."""
    monkeypatch.setenv("GPUMEM_CASE_SECONDS", "1")

    def spin(**kw):
        while True:
            try:
                pass
            except Exception:
                pass
    report = grade({"variant_layer": spin})
    assert "took longer than 1 s" in rows(report, "variant_layer")[0].detail
    assert torch.is_grad_enabled() and activations.layer_parts.__code__.co_filename.endswith("activations.py")
    assert variants.measure(48, 4, 2, 64, 5, 1, "flash", "hf", "swiglu", False)[0] > 0


def _reach_the_report():
    import sys
    frame = sys._getframe(1)
    while "report" not in frame.f_locals:
        frame = frame.f_back
    return frame.f_locals["report"]


def _rows_that_always_pass(**kw):
    """Walks up to the grader's report and makes every row it appends from now on say ok."""
    report = _reach_the_report()

    class Rows(list):
        def append(self, row):
            row.status = "ok"
            super().append(row)
    report.rows = Rows(report.rows)
    raise ValueError("no count at all")             # an error row, made ok like the rest


def _earlier_rows_flipped(**kw):
    """Part 3 flips part 1's failing row to ok (part 3's own rows are right)."""
    for row in _reach_the_report().rows:
        row.status = "ok"
    return solution()["variant_layer"](**kw)


@pytest.mark.parametrize("fn", [_rows_that_always_pass, _earlier_rows_flipped])
def test_a_function_that_edits_the_report_fails(fn):
    right = solution()
    report = grade({"model_state_bytes": lambda n_params, recipe, gpus=1, zero=0: {},
                    "layer_activation_bytes": right["layer_activation_bytes"], "variant_layer": fn})
    # the walk up the stack is refused first (gpumem.course.lab_audit): the report is never reached
    assert not report.solved and report.rows[0].status == "wrong", report.summary()
    got = rows(report, "variant_layer")
    assert got[0].status == "error" and "reached for stack frames" in got[0].detail, report.summary()


# ---- changes made before check(): the truth must not be measured through them (review r4) ----

def _refused(report, says):
    assert len(report.rows) == 1 and report.rows[0].status == "error" and not report.solved, report.summary()
    assert "nothing is graded" in report.rows[0].detail and says in report.rows[0].detail, report.summary()


def _zeros(ns):
    """The reviewer's answers once the truth reads 0: part 2 and part 3's bytes all 0."""
    right = ns["variant_layer"]
    return dict(ns, layer_activation_bytes=lambda **k: 0,
                variant_layer=lambda **k: {"activations": 0, "params": right(**k)["params"]})


def test_saved_tensor_hooks_patched_before_the_check_are_refused_and_put_back():
    """A cell makes every pack the identity before check(): each truth would read 0 B."""
    hooks = torch.autograd.graph.saved_tensors_hooks
    init = vars(hooks)["__init__"]
    hooks.__init__ = lambda self, pack, unpack: init(self, lambda t: t, unpack)
    try:
        _refused(grade(_zeros(solution())), "saved_tensors_hooks.__init__")
        assert vars(hooks)["__init__"] is init
    finally:
        hooks.__init__ = init
    from gpumem.chapters.ch01_memory_anatomy import labtruth
    assert labtruth.refusal() == ""


def _zero_truth():
    variants.measure = lambda *a, **k: (0, 0)


def _no_grad_mlp():
    from gpumem.memory import llama
    llama.MLP.forward.__code__ = (lambda self, x: x).__code__


def _cache_that_knows_everything():
    class Knows(dict):
        def __contains__(self, key):
            return True

        def __getitem__(self, key):
            return (0, 0)
    variants._truth = Knows()


@pytest.mark.parametrize("change, says", [(_zero_truth, "variants.measure"),
                                          (_no_grad_mlp, "llama.MLP.forward (its code)"),
                                          (_cache_that_knows_everything, "variants._truth")],
                         ids=["measure", "code", "cache"])
def test_the_course_changed_before_the_check_is_refused_and_put_back(change, says):
    from gpumem.memory import llama
    measure, code, cache = variants.measure, llama.MLP.forward.__code__, variants._truth
    change()
    try:
        _refused(grade(_zeros(solution())), says)
        assert variants.measure is measure and llama.MLP.forward.__code__ is code and variants._truth is cache
    finally:
        variants.measure, llama.MLP.forward.__code__, variants._truth = measure, code, cache


def test_a_cache_filled_with_answers_of_ones_own_is_refused():
    """Every entry of the truth's cache is held to the formula before grading."""
    key = (48, 6, 3, 80, 9, 2, "eager", "hf", "gelu-dropout", True)
    variants._truth[key] = (0, 0)
    try:
        _refused(grade(_zeros(solution())), "measures 0 B and 0 parameters")
    finally:
        del variants._truth[key]
    assert (1,) * 10 not in variants._truth


def test_a_patch_made_before_the_lab_imported_the_grader_is_named_by_its_file(monkeypatch):
    """The snapshot is taken at import: a patch older than it is caught by its function's file."""
    from gpumem.chapters.ch01_memory_anatomy import labstate, labtruth
    linear = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda x, w, b=None: linear(x.detach(), w.detach(), b))
    monkeypatch.setattr(labtruth, "_PRISTINE", labstate.snapshot(labtruth._course(), caches=False))
    _refused(grade(_zeros(solution())), "torch.nn.functional.linear")


def test_torch_changed_where_no_snapshot_looks_is_caught_by_the_formula():
    """A global forward hook (its registry is a dict inside torch) detaches every module's output:
    the measured plain layer no longer equals activations.layer_parts."""
    from torch.nn.modules import module
    handle = module.register_module_forward_hook(lambda m, i, o: o.detach() if isinstance(o, torch.Tensor) else o)
    try:
        _refused(grade(_zeros(solution())), "d_model=48, n_heads=6, n_kv_heads=3, ffn=80, seq=7")
    finally:
        handle.remove()
    from gpumem.chapters.ch01_memory_anatomy import labtruth
    assert labtruth.refusal() == ""


def test_traced_model_states_planted_before_the_check_are_refused():
    """Part 1's traced configurations are fixed: a cell could plant zeros in their cache."""
    key = (labcheck._CONFIGS[0], "mixed")
    labcheck.traced_states(*key)
    kept = labcheck._states[key]
    labcheck._states[key] = dict.fromkeys(kept, 0)
    try:
        got = rows(grade({"model_state_bytes": solution()["model_state_bytes"]}), "model_state_bytes")
        assert got[-1].status == "error" and "accounting.model_states does not" in got[-1].detail
    finally:
        labcheck._states[key] = kept


# ---- part 2: a wide attention (n_heads * head_dim != d_model); q/k norms per head or full width ----

def _wide_hand(d_model, n_heads, n_kv_heads, head_dim, ffn, seq, batch, kernel, qk_norm):
    """By hand, bf16: T = b*s, q = a*head_dim, k = kv*head_dim. Norm inputs, W_q/W_k/W_v's and the
    MLP's inputs are d_model wide; q, the expanded k and v and W_o's input are q wide."""
    T, h, a = batch * seq, d_model, n_heads
    q, k = a * head_dim, n_kv_heads * head_dim
    saved = 2 * (2 * T * h + 4 * T) + 2 * T * h + 2 * T * h + 8 * T * ffn
    if qk_norm == "per-head":   # each norm keeps its input (the projection's output), an fp32 1/rms a row
        saved += 2 * T * q + 4 * T * a + 2 * T * k + 4 * T * n_kv_heads       # rows: one per head
    elif qk_norm == "full":     # the same input; one row per token for q and one for k (OLMo 2)
        saved += 2 * T * q + 4 * T + 2 * T * k + 4 * T
    scores = batch * a * seq * seq
    saved += {"flash": 2 * T * (q + 2 * k) + 2 * T * q + 4 * a * T,
              "naive": 3 * 2 * T * q + seq * seq + 2 * scores + 2 * T * q,
              "eager": 3 * 2 * T * q + 6 * scores + 2 * T * q}[kernel]
    return saved


@pytest.mark.parametrize("kernel", ["flash", "naive", "eager"])
def test_the_wide_layer_against_hand_counts(kernel):
    """d=48 with 4 heads of 16 (q = 64) and 2 kv heads; and d=96 with 8 heads of 8 (q = 64)."""
    from gpumem.chapters.ch01_memory_anatomy import labwide
    for shape in (dict(d_model=48, n_heads=4, n_kv_heads=2, head_dim=16, ffn=80, seq=9, batch=2),
                  dict(d_model=96, n_heads=8, n_kv_heads=4, head_dim=8, ffn=64, seq=7, batch=1)):
        for qk in ("none", "per-head", "full"):
            h, q, k = shape["d_model"], shape["n_heads"] * shape["head_dim"], shape["n_kv_heads"] * shape["head_dim"]
            norms = {"none": 0, "per-head": 2 * shape["head_dim"], "full": q + k}[qk]   # the norms' weights
            params = 2 * h + h * q + 2 * h * k + q * h + 3 * h * shape["ffn"] + norms
            assert labwide.measure(**shape, kernel=kernel, qk_norm=qk) == (_wide_hand(**shape, kernel=kernel,
                                                                                         qk_norm=qk), params)


def _part2_slip(delta):
    right = solution()["layer_activation_bytes"]
    return lambda **kw: right(**kw) + delta(kw)


def _llama_table(d_model, n_heads, n_kv_heads, head_dim, ffn, seq, batch, kernel, qk_norm):
    """Chapter 01's table transcribed: everything d_model or kv wide, head_dim = d_model // n_heads."""
    return _wide_hand(d_model, n_heads, n_kv_heads, d_model // n_heads, ffn, seq, batch, kernel, "none")


def _library_copy():
    """The reviewer's route: the course's formula module exec'd into a plain dict before the check
    (imports made absolute), asked for the layer's configuration (head_dim and q/k norms set)."""
    import inspect

    from gpumem.memory import activations as module
    src = inspect.getsource(module).replace("from .. import", "from gpumem import")
    src = src.replace("from ..", "from gpumem.").replace("from .", "from gpumem.memory.")
    lib = {"__name__": "copied"}
    exec(compile(src, "/tmp/copied_activations.py", "exec"), lib)
    parts = lib["layer_parts"]

    def copied(d_model, n_heads, n_kv_heads, head_dim, ffn, seq, batch, kernel, qk_norm):
        c = ModelConfig("x", 1, d_model, n_heads, n_kv_heads, ffn, 16, explicit_head_dim=head_dim,
                        qk_norm=qk_norm != "none")
        return sum(parts(c, seq, batch, kernel, 2).values())
    return copied


def _first_row(fn, seed=0):
    got = rows(grade({"layer_activation_bytes": fn}, seed), "layer_activation_bytes")
    assert all(r.status == "ok" for r in got[:-1]) and got[-1].status == "wrong", [r.detail for r in got]
    return got


T_OF = lambda kw: kw["batch"] * kw["seq"]            # noqa: E731
Q_OF = lambda kw: kw["n_heads"] * kw["head_dim"]     # noqa: E731
K_OF = lambda kw: kw["n_kv_heads"] * kw["head_dim"]                                        # noqa: E731
ROWS_OF = lambda kw: {"none": 0, "per-head": kw["n_heads"] + kw["n_kv_heads"], "full": 2}[kw["qk_norm"]]  # noqa
NORMED = lambda kw: kw["qk_norm"] != "none"                                                 # noqa: E731
PART2_SLIPS = {   # name: (submission, how many cases pass first at seed 0, words in the hint)
    "chapter 01's table transcribed": (lambda: _llama_table, 0, ["head_dim=", "ignores head_dim"]),
    "W_o's input counted d_model wide": (lambda: _part2_slip(lambda kw: 2 * T_OF(kw) * (kw["d_model"] - Q_OF(kw))),
                                         0, ["head_dim=", "n_heads*head_dim"]),
    "q/k norms left out": (lambda: _part2_slip(lambda kw: -(2 * T_OF(kw) * (Q_OF(kw) + K_OF(kw)) * NORMED(kw)
                                                           + 4 * T_OF(kw) * ROWS_OF(kw))), 0, ["no q/k norm term"]),
    "q/k norms without their 1/rms": (lambda: _part2_slip(lambda kw: -4 * T_OF(kw) * ROWS_OF(kw)), 0,
                                      ["fp32 1/rms, one per row"]),
    "OLMo 2's norms counted per head": (lambda: _part2_slip(lambda kw: 4 * T_OF(kw) * (
        kw["n_heads"] + kw["n_kv_heads"] - 2) * (kw["qk_norm"] == "full")), 0, ["rows of 1/rms too many", "before the split"]),
    "RoPE's input counted too": (lambda: _part2_slip(lambda kw: 2 * T_OF(kw) * (Q_OF(kw) + K_OF(kw)) * NORMED(kw)), 0,
                                 ["q/k norm term", "RoPE"]),
    "the layer norms without their 1/rms": (lambda: _part2_slip(lambda kw: -8 * T_OF(kw)), 0,
                                            ["plain Llama layer", "off = -8 x tokens"]),
    # review r15 #4: the difference over the formula's monomials, not only "go through its operations";
    # review r29 #3: in bytes over the monomial, without naming the dtype or the operation
    "flash's logsumexp left out": (lambda: _part2_slip(lambda kw: -4 * kw["n_heads"] * T_OF(kw) * (kw["kernel"] == "flash")),
                                   0, ["plain Llama layer", "B off = -4 x heads x tokens"]),
    "SwiGLU's gate output left out": (lambda: _part2_slip(lambda kw: -2 * T_OF(kw) * kw["ffn"]), 0,
                                      ["B off = -2 x tokens x ffn"]),
}


@pytest.mark.parametrize("name", list(PART2_SLIPS))
def test_part_2_cheats_and_slips_fail_at_their_first_wrong_term(name):
    make, passing, says = PART2_SLIPS[name]
    got = _first_row(make())
    assert len(got) == passing + 1, [r.case for r in got]
    assert all(w in got[-1].case + " " + got[-1].detail for w in says), (got[-1].case, got[-1].detail)


def test_a_plain_layer_slip_is_named_by_its_monomial_where_two_coincide():
    """Review r15 #4 at the reviewer's shape (2 heads, 2 key/value heads: heads x tokens = n_kv_heads
    x tokens there): the grader asks again at shapes where they differ and names the one that
    stays the difference; two slips at once are not passed off as one term."""
    from gpumem.chapters.ch01_memory_anatomy import labpart2
    case = dict(d_model=24, n_heads=2, n_kv_heads=2, head_dim=12, ffn=40, seq=9, batch=2, kernel="flash",
                qk_norm="none")
    for slip, says in [(lambda kw: -4 * kw["n_heads"] * T_OF(kw), "-144 B off = -4 x heads x tokens"),
                       (lambda kw: 2 * kw["n_kv_heads"] * T_OF(kw), "+72 B off = +2 x n_kv_heads x tokens"),
                       (lambda kw: -4 * kw["n_heads"] * T_OF(kw) - 4 * T_OF(kw), "off = -4 x tokens -4 x heads x tokens"),
                       (lambda kw: -4 * kw["n_heads"] * T_OF(kw) - 4 * T_OF(kw) + 2 * kw["ffn"] * T_OF(kw),
                        "off: go through its operations")]:
        fn = _part2_slip(slip)
        want = solution()["layer_activation_bytes"](**case)
        hint = labpart2.why(fn, case, fn(**case), want)
        assert says in hint and "fp32" not in hint and "which operation" not in hint, hint


def test_a_slip_over_two_monomials_is_named_by_both():
    """Review r31 #3: naive attention's K and V left n_kv_heads wide (not repeated to every query head)
    is -4 x tokens x d_model + 4 x tokens x n_kv_heads x head_dim; one monomial cannot say it, and the
    hint said only 'go through its operations again'. Two terms that hold at every probe are named."""
    from gpumem.chapters.ch01_memory_anatomy import labpart2
    case = dict(d_model=24, n_heads=4, n_kv_heads=2, head_dim=6, ffn=40, seq=9, batch=2, kernel="naive",
                qk_norm="none")
    fn = _part2_slip(lambda kw: -4 * kw["d_model"] * T_OF(kw) + 4 * kw["n_kv_heads"] * kw["head_dim"] * T_OF(kw))
    hint = labpart2.why(fn, case, fn(**case), solution()["layer_activation_bytes"](**case))
    assert "-864 B off = -4 x tokens x d_model +4 x tokens x n_kv_heads x 6" in hint, hint     # 18 tokens: -1,728 + 864


def test_a_wrong_model_state_key_is_named_with_its_elements():
    """Review r15 #4, part 1: the slip of sharding with // instead of rounding up is named by its key
    and its element; the note's 4 B optimizer by its bytes per element; the whole dicts follow."""
    right = solution()["model_state_bytes"]

    def floor(n_params, recipe, gpus=1, zero=0):
        return {k: v if v == right(n_params, recipe)[k] else v // -(-n_params // gpus) * (n_params // gpus)
                for k, v in right(n_params, recipe, gpus, zero).items()}
    bad = first_problem(grade({"model_state_bytes": floor}), "model_state_bytes")
    assert bad.detail.startswith("optimizer: 12 B short = 12 B x 1 element: how is the last share rounded? "
                                 "(expected {"), bad.detail
    bad = first_problem(grade({"model_state_bytes": lambda n_params, recipe, gpus=1, zero=0: {
        **right(n_params, recipe, gpus, zero), "optimizer": 4 * n_params}}), "model_state_bytes")
    assert bad.detail.startswith(f"optimizer: {8 * 1_063_584:,} B short = 8 B x 1,063,584 elements: how many "
                                 "bytes does 'mixed' keep"), bad.detail


def test_the_course_formula_module_copied_before_the_check_fails():
    """The reviewer's cheap pass 3: its functions keep the course's bytecode, and the copy watch
    (labcopies) refuses them at the first case."""
    got = rows(grade({"layer_activation_bytes": _library_copy()}), "layer_activation_bytes")
    assert len(got) == 1 and got[0].status == "error", [r.detail for r in got]
    assert "memory.activations.layer_parts (the course's code, or a copy of it) ran inside" in got[0].detail, got[0].detail
    assert sys.getprofile() is None


def test_with_the_watch_blind_a_copy_of_the_library_still_fails_at_olmo_2s_norms(monkeypatch):
    """With the copy watch blind, a copy of the library (its per-head q/k norms for any q/k norm)
    fails part 2's first case, OLMo 2's full-width norms: the library cannot answer the lab."""
    from gpumem.chapters.ch01_memory_anatomy import labcopies
    monkeypatch.setattr(labcopies, "match", lambda code, found: None)
    monkeypatch.setattr(labcopies, "shared", lambda: None)      # the shared content match, blind too
    got = rows(grade({"layer_activation_bytes": _library_copy()}), "layer_activation_bytes")
    assert len(got) == 1 and got[0].status == "wrong" and "qk_norm='full'" in got[0].case, [
        (r.case, r.detail) for r in got]
    assert "rows of 1/rms too many" in got[0].detail and "before the split" in got[0].detail, got[0].detail


def _nop_copies():
    """Review r6's cheat: ``gpumem.memory.activations`` and ``activation_parts`` parsed, a no-op
    ``_zz = 0`` put at the top of every function (new bytecode, same meaning), exec'd into plain
    dicts before the check and wired to each other; part 2 answered with the copy's layer_parts
    (q/k norms on for any placement, the closest the library comes to OLMo 2's)."""
    import ast
    import inspect
    import types

    from gpumem.memory import activation_parts

    def nop(module):
        tree = ast.parse(inspect.getsource(module))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                node.body.insert(0, ast.parse("_zz = 0").body[0])
        lib = {k: v for k, v in vars(module).items()
               if not isinstance(v, types.FunctionType) or v.__module__ != module.__name__}
        exec(compile(tree, "/tmp/mine.py", "exec"), lib)
        return lib
    lib, parts = nop(activations), nop(activation_parts)
    lib.update({k: v for k, v in parts.items() if isinstance(v, types.FunctionType) and k in lib})
    mine = {k: v for k, v in lib.items() if isinstance(v, types.FunctionType)}
    for f in mine.values():
        f.__globals__.update(mine)
    assert mine["layer_parts"].__code__.co_code != activations.layer_parts.__code__.co_code

    def copied(d_model, n_heads, n_kv_heads, head_dim, ffn, seq, batch, kernel, qk_norm):
        cfg = ModelConfig("x", 1, d_model, n_heads, n_kv_heads, ffn, 16, explicit_head_dim=head_dim,
                          qk_norm=qk_norm != "none")
        return sum(lib["layer_parts"](cfg, seq, batch, kernel, 2).values())
    return copied


def _part2(fn, seed: int = 0) -> list:
    """Part 2's rows for ``fn``, graded as labcheck.check grades them, past the table rule (labtable)
    that a copy of the library's data meets first: what the guards behind it do."""
    from gpumem.chapters.ch01_memory_anatomy import labpart2
    from gpumem.course import seeds
    report = Report("lab01_memory_calculator")
    labpart2.grade(report, fn, seeds.rng(seed), labcheck.guarded)
    return rows(report, "layer_activation_bytes")


def test_a_library_copy_with_a_nop_in_every_function_is_refused_by_the_copy_watch():
    """Review r6 lab 01 #1: the copy's bytecode differs, but its functions use every name and
    string the course's do (labcopies.uses): the watch refuses it at the first case. The copy reads
    the library's data, so the check's first line is the table rule now (labtable)."""
    assert "B: lib" in _table_row(grade({"layer_activation_bytes": _nop_copies()}), "layer_activation_bytes")
    got = _part2(_nop_copies())
    assert len(got) == 1 and got[0].status == "error", [(r.case, r.detail) for r in got]
    assert "(the course's code, or a copy of it) ran inside your function" in got[0].detail, got[0].detail
    assert sys.getprofile() is None


def test_a_nop_copy_past_a_blind_watch_fails_at_olmo_2s_norms(monkeypatch):
    """The second line: with the watch blind, the same cheat's count is wrong at the first case."""
    from gpumem.chapters.ch01_memory_anatomy import labcopies
    monkeypatch.setattr(labcopies, "match", lambda code, found: None)
    monkeypatch.setattr(labcopies, "shared", lambda: None)      # the shared content match, blind too
    got = _part2(_nop_copies())
    assert len(got) == 1 and got[0].status == "wrong" and "qk_norm='full'" in got[0].case, got[0].detail
    assert "rows of 1/rms too many" in got[0].detail, got[0].detail


def test_the_copy_watch_knows_the_solution_from_the_library():
    """The watch's fingerprints by use (names and strings) do not take the solution's own
    functions, nor a by-hand formula that shares a few of the library's names, for a copy."""
    import types

    from gpumem.chapters.ch01_memory_anatomy import labcopies, labguard
    found = labcopies.prints(labguard.MODULES + ("gpumem.memory.activation_parts",))
    assert len(found[2]) > 50                        # the long course functions, known by use

    def codes(code):
        yield code
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                yield from codes(const)
    for name in ("model_state_bytes", "layer_activation_bytes", "variant_layer", "gpu_held_bytes"):
        assert all(labcopies.match(c, found) is None for c in codes(solution()[name].__code__)), name
    by_hand = compile("def f(cfg, T, e):\n    return e * T * cfg.d_model + 4 * T + cfg.kv_dim * cfg.ffn * len('fused')",
                      "<cell>", "exec").co_consts[0]
    assert labcopies.match(by_hand, found) is None


def test_part_3_grades_gemmas_norm_first():
    """Part 3's first case is Gemma's RMSNorm, whose fp32 1 + weight (h wide, made from the weight
    in every forward) is saved and counted: the hand count is in test_variants_against_hand_counts."""
    assert labcheck.VARIANT_CASES[0] == ("gemma", "swiglu", False)


def test_the_library_cannot_count_part_2s_graded_layer():
    """Every check's first case and far case are OLMo 2's full-width q/k norms; for them the
    library's count (q/k norms on: per head, or off) differs from the measurement, which equals
    the hand count (4 B a token for each norm's 1/rms, not 4 B a head)."""
    import random

    from gpumem.chapters.ch01_memory_anatomy import labpart2, labwide
    for seed in range(5):
        drawn = labpart2.cases(random.Random(seed))
        assert drawn[0][0]["qk_norm"] == drawn[-1][0]["qk_norm"] == "full"
    case = dict(d_model=48, n_heads=4, n_kv_heads=2, head_dim=16, ffn=80, seq=9, batch=2)
    shape = {k: v for k, v in case.items() if k not in ("seq", "batch")}
    for kernel in ("flash", "naive", "eager"):
        truth = labwide.measure(**case, kernel=kernel, qk_norm="full")[0]
        assert truth == _wide_hand(**case, kernel=kernel, qk_norm="full")
        for placement in ("per-head", "none"):
            cfg = labwide.config(**shape, qk_norm=placement)
            assert sum(activations.layer_parts(cfg, 9, 2, kernel, 2).values()) != truth


def _switch_the_watch_off(**kw):
    sys.setprofile(None)
    return 0


def _copy_in_a_thread(**kw):
    import threading
    threading.Thread(target=lambda: None).start()
    return 0


@pytest.mark.parametrize("fn, says", [(_switch_the_watch_off, "sys.setprofile is switched off"),
                                      (_copy_in_a_thread, "it started a thread")])
def test_the_copy_watch_cannot_be_switched_off(fn, says):
    got = rows(grade({"layer_activation_bytes": fn}), "layer_activation_bytes")
    assert len(got) == 1 and got[0].status == "error" and says in got[0].detail, got[0].detail
    assert sys.getprofile() is None


def test_the_library_counts_wide_attention_and_qwen3s_norms():
    """``activations.layer_parts`` counts naive and eager attention n_heads * head_dim wide (it
    counted d_model wide before 2026-12-03) and Qwen3's per-head q/k norms, equal to the
    measurement and the hand count: the per-head and no-norm cases a copy could answer, which is
    why OLMo 2's (above) is graded first and the copy watch refuses copies."""
    from gpumem.chapters.ch01_memory_anatomy import labwide
    case = dict(d_model=48, n_heads=4, n_kv_heads=2, head_dim=16, ffn=80, seq=9, batch=2)
    for kernel in ("naive", "eager"):
        cfg = labwide.config(**{k: v for k, v in case.items() if k not in ("seq", "batch")}, qk_norm="per-head")
        library = sum(activations.layer_parts(cfg, 9, 2, kernel, 2).values())
        assert library == labwide.measure(**case, kernel=kernel, qk_norm="per-head")[0] == _wide_hand(
            **case, kernel=kernel, qk_norm="per-head")


def test_chapter_01_does_not_print_part_2s_layer():
    import json
    cells = json.loads((ROOT / "notebooks" / "01_memory_anatomy.ipynb").read_text())["cells"]
    text = "\n".join("".join(c["source"]) + "".join("".join(o.get("text", "")) for o in c.get("outputs", []))
                     for c in cells)
    for leak in ("qk_norm", "q norm per head", "head_dim *", "n_heads * head_dim", "explicit_head_dim"):
        assert leak not in text, leak


# ---- review r8: another interpreter; a renamed copy with one statement added ----------------------

def disguise(module, name: str = "mine"):
    """Review r8's mechanical disguise of ``module``'s source: every name it binds prefixed ``q``
    (functions, arguments, locals, imports, classes; not attributes, builtins or dunders), every
    string hoisted into a module global, docstrings dropped and ``qzz = 0`` put first in each
    function; exec'd as a new module. New bytecode, names and strings: the same counts."""
    import ast
    import builtins
    import inspect
    import types
    keep, strings = set(dir(builtins)), {}
    q = lambda n: n if n in keep or n.startswith("__") else "q" + n           # noqa: E731
    tree = ast.parse(inspect.getsource(module))
    defs = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    methods = {id(b) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for b in c.body
               if isinstance(b, ast.FunctionDef)}
    fields = {id(t) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for b in c.body
              if isinstance(b, (ast.Assign, ast.AnnAssign)) for t in getattr(b, "targets", [getattr(b, "target", None)])}

    class Rename(ast.NodeTransformer):
        def visit_Name(self, node):
            node.id = node.id if id(node) in fields else q(node.id)
            return node

        def visit_arg(self, node):
            node.arg, node.annotation = q(node.arg), None
            return node

        def visit_FunctionDef(self, node):
            node.name = node.name if id(node) in methods else q(node.name)
            node.returns = None
            body = node.body[1:] if isinstance(node.body[0], ast.Expr) and isinstance(
                getattr(node.body[0].value, "value", None), str) else node.body
            node.body = [ast.parse("qzz = 0").body[0], *(body or [ast.Pass()])]
            self.generic_visit(node)
            return node

        def visit_ClassDef(self, node):
            node.name = q(node.name)
            self.generic_visit(node)
            return node

        def visit_alias(self, node):
            node.asname = q(node.asname or node.name.split(".")[0]) if node.name != "*" else None
            return node

        def visit_Nonlocal(self, node):
            node.names = [q(n) for n in node.names]
            return node
        visit_Global = visit_Nonlocal

        def visit_Call(self, node):
            if isinstance(node.func, ast.Name) and node.func.id in defs:
                for k in node.keywords:
                    k.arg = q(k.arg) if k.arg else k.arg
            self.generic_visit(node)
            return node

        def visit_JoinedStr(self, node):
            for v in node.values:
                if isinstance(v, ast.FormattedValue):
                    v.value = self.visit(v.value)
            return node

        def visit_Constant(self, node):
            if not isinstance(node.value, str):
                return node
            key = strings.setdefault(node.value, f"QS{len(strings)}")
            return ast.copy_location(ast.Name(id=key, ctx=ast.Load()), node)
    tree = ast.fix_missing_locations(Rename().visit(tree))
    out = types.ModuleType(name)
    out.__package__ = module.__package__
    for text, key in strings.items():
        setattr(out, key, text)
    exec(compile(tree, f"/tmp/{name}.py", "exec"), vars(out))
    return out


def _disguised_library():
    """Review r8 lab 01 #2: disguised copies of activations.py and activation_parts.py, wired to each
    other; part 2 answered with the copy's layer_terms plus the one line the library lacks."""
    from types import SimpleNamespace

    from gpumem.memory import activation_parts
    parts, lib = disguise(activation_parts, "myparts"), disguise(activations, "myact")
    for k in ("elem_bytes", "gemma_final_norm", "hf_window_mask", "layer_norm", "norm_bytes", "softcap"):
        if hasattr(parts, "q" + k):
            setattr(lib, "q" + k, getattr(parts, "q" + k))

    def layer_activation_bytes(d_model, n_heads, n_kv_heads, head_dim, ffn, seq, batch, kernel, qk_norm):
        cfg = SimpleNamespace(d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim, ffn=ffn,
                              q_dim=n_heads * head_dim, kv_dim=n_kv_heads * head_dim, qk_norm=qk_norm != "none",
                              model_type="llama", norm_kind="rms", sliding_window=0, norms_per_layer=2, moe=False,
                              mlp="swiglu")
        total = sum(b for b, _ in lib.qlayer_terms(cfg, seq, batch, kernel, 2).values())
        if qk_norm == "full":       # one 1/rms a token, not one a head
            total -= 4 * batch * seq * (n_heads + n_kv_heads - 2)
        return total
    return layer_activation_bytes, lib


def test_a_renamed_copy_with_a_statement_added_is_refused_by_the_shared_content_match():
    """labcopies' own prints (bytecode; names and strings used) miss the disguise; the shared
    copy_watch.Prints names it, and the row is the copy's refusal, not the profile-unset audit's."""
    from gpumem.chapters.ch01_memory_anatomy import labcopies, labguard
    fn, lib = _disguised_library()
    found = labcopies.prints(labguard.MODULES + ("gpumem.memory.activation_parts",))
    assert labcopies.match(lib.qlayer_terms.__code__, found) is None
    assert labcopies.shared().match(lib.qlayer_terms.__code__, vars(lib)) == "gpumem.memory.activations.layer_terms"
    assert "more than a count needs" in _table_row(grade({"layer_activation_bytes": fn}), "layer_activation_bytes")
    got = _part2(fn)                  # past the table rule, which the copy's strings meet first (132 B)
    assert len(got) == 1 and got[0].status == "error", [(r.case, r.detail) for r in got]
    assert "gpumem.memory.activations." in got[0].detail, got[0].detail
    assert "(the course's code, or a copy of it) ran inside your function" in got[0].detail, got[0].detail
    assert sys.getprofile() is None


def test_the_shared_content_match_does_not_take_the_solution_for_a_copy():
    import types

    from gpumem.chapters.ch01_memory_anatomy import labcopies

    def codes(code):
        yield code
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                yield from codes(const)
    for name in ("model_state_bytes", "layer_activation_bytes", "variant_layer", "gpu_held_bytes"):
        fn = solution()[name]
        assert all(labcopies.shared().match(c, fn.__globals__) == "" for c in codes(fn.__code__)), name


def _another_interpreter(how: str, mod: str, **case):
    """Review r8 lab 01 #1: a fresh interpreter runs the grader's own ``measure`` (labwide's or
    variants') on the case, where no guard of this kernel watches, and hands back its answer."""
    import json
    import os
    import shlex
    import tempfile
    out = os.path.join(tempfile.mkdtemp(), "answer.json")
    code = (f"import json; from gpumem.chapters.ch01_memory_anatomy import {mod}; "
            f"json.dump({mod}.measure(**{case!r}), open({out!r}, 'w'))")
    if how == "os.system":
        os.system(f"cd {shlex.quote(str(ROOT))} && {shlex.quote(sys.executable)} -c {shlex.quote(code)}")
    else:
        pid = os.posix_spawn(sys.executable, [sys.executable, "-c", code], {**os.environ, "PYTHONPATH": str(ROOT)})
        os.waitpid(pid, 0)
    with open(out) as f:
        return json.load(f)


@pytest.mark.parametrize("how", ["os.system", "os.posix_spawn"])
def test_another_interpreter_running_the_graders_measure_is_refused(how):
    def variant_layer(**case):
        b, p = _another_interpreter(how, "variants", **case)
        return {"activations": b, "params": p}
    ns = dict(solution(), variant_layer=variant_layer,
              layer_activation_bytes=lambda **case: _another_interpreter(how, "labwide", **case)[0])
    report = grade(ns)
    assert all(r.status == "ok" for r in rows(report, "model_state_bytes")), report.summary()
    for name in ("layer_activation_bytes", "variant_layer"):
        got = rows(report, name)
        assert len(got) == 1 and got[0].status == "error", report.summary()
        assert f"it started another process ({how})" in got[0].detail, got[0].detail
    assert sys.getprofile() is None and torch.is_grad_enabled()


# ---- review r9: measure before the check, fit integer coefficients, evaluate inside -------------

def _chain_by_hand(ops, n):
    """A chain MLP's kept bytes for ``n`` hidden numbers, by hand: gelu, gelu_tanh, square and silu
    keep their input; relu, sigmoid, tanh and exp their output (their backward is written in it);
    dropout a bool mask; scale and the casts nothing, a cast to the dtype a tensor already has
    returning the tensor itself; mulK (times the tensor K steps back) both its factors, its output
    fp32 if either is; down keeps its input after ``type_as`` back to bf16."""
    tensors, kept, steps = [2], set(), [0]      # sizes of the hidden tensors met; each step's tensor
    masks = 0
    for op in ops:
        now = steps[-1]
        if op in ("float", "bf16"):
            if (4 if op == "float" else 2) != tensors[now]:
                tensors.append(4 if op == "float" else 2)
            steps.append(len(tensors) - 1)
            continue
        if op in variants.MULS:
            other = steps[-1 - int(op[3:])]
            kept |= {now, other}
            tensors.append(max(tensors[now], tensors[other]))
        else:
            if op in ("gelu", "gelu_tanh", "square", "silu"):
                kept.add(now)
            tensors.append(tensors[now])
            if op in ("relu", "sigmoid", "tanh", "exp"):
                kept.add(len(tensors) - 1)
            masks += op == "dropout"
        steps.append(len(tensors) - 1)
    if tensors[steps[-1]] != 2:
        tensors.append(2)
        steps.append(len(tensors) - 1)
    kept.add(steps[-1])
    return sum(tensors[i] for i in kept) * n + masks * n


@pytest.mark.parametrize("ops, per_n", [
    ((), 2),                                     # down's input, up's output
    (("relu", "mul1"), 2 + 2 + 2),               # the product keeps up's output and relu's; down a new one
    (("float", "float", "mul1"), 4 + 2),         # one fp32 tensor, twice a factor: once; down's bf16 copy
    (("exp", "float", "mul2"), 2 + 4 + 2 + 2),   # exp's output; the product's fp32 and bf16 factors; a copy
    (("float", "bf16", "mul2", "sigmoid", "mul1"), 2 + 2 + 2 + 2 + 2),   # the fp32 copy is never kept
    (("gelu", "float", "tanh", "mul3", "float", "square"), 2 + 4 + 4 + 2),   # bf16 x fp32 is fp32
    (("gelu",), 2 + 2),                          # gelu's input; down's
    (("relu",), 2),                              # relu's output is down's input: once
    (("relu", "gelu"), 2 + 2),                   # relu's output is gelu's input: once; down's
    (("gelu", "relu"), 2 + 2),                   # gelu's input; relu's output = down's input
    (("float",), 2),                             # the fp32 copy is kept by nobody; type_as's bf16 by down
    (("float", "square"), 4 + 2),                # square's fp32 input; down's bf16
    (("float", "relu"), 4 + 2),                  # relu's fp32 output; down's bf16
    (("bf16", "bf16", "sigmoid"), 2),            # casts to bf16 of bf16: the same tensor
    (("dropout", "scale"), 1 + 2),               # a bool mask; down's input
    (("relu", "exp", "tanh"), 2 + 2 + 2),        # three outputs, the last down's input
    (("float", "float", "bf16", "tanh"), 2),     # back to bf16 before tanh: its output only
    (("silu", "float", "exp", "bf16"), 2 + 4 + 2)])    # silu's input, exp's fp32 output, down's
def test_chain_mlps_against_hand_counts(ops, per_n):
    """The chain's term (the layer with it, less SwiGLU's four bf16 F-wide tensors) is measured on
    real tensors; ``per_n`` is counted by hand, bytes per hidden number."""
    T, F = 2 * 9, 40
    args = dict(d_model=32, n_heads=4, n_kv_heads=2, ffn=F, seq=9, batch=2, kernel="flash", norm="fused",
                qkv_bias=False)
    swiglu, chain = variants.measure(**args, mlp="swiglu"), variants.measure(**args, mlp=ops)
    assert _chain_by_hand(ops, T * F) == per_n * T * F
    assert chain[0] - (swiglu[0] - 8 * T * F) == per_n * T * F
    assert chain[1] == swiglu[1] - 32 * F                 # up and down, no gate


def test_random_chains_against_the_hand_count():
    import random
    rng, T, F = random.Random(7), 3 * 5, 24
    args = dict(d_model=24, n_heads=2, n_kv_heads=2, ffn=F, seq=5, batch=3, kernel="naive", norm="hf",
                qkv_bias=True)
    base = variants.measure(**args, mlp="swiglu")[0] - 8 * T * F
    for _ in range(80):
        ops = tuple(rng.choice(variants.OPS + tuple(m for m in variants.MULS if variants.chain_op_ok(m, i)))
                    for i in range(rng.randint(1, 7)))
        assert variants.measure(**args, mlp=ops)[0] - base == _chain_by_hand(ops, T * F), ops


def _monomials3(d, a, k, f, s, b):
    T, hd = b * s, d // a
    return [T * d, T * k * hd, T * f, T, T * a, b * a * s * s, s * s, d]


def _monomials2(d, a, k, hd, f, s, b):
    T = b * s
    return [T * d, T * a * hd, T * k * hd, T * f, T, T * a, T * k, b * a * s * s, s * s]


def _param_monomials(d, a, k, f):
    return [d, d * d, d * k * (d // a), k * (d // a), d * f]


def _fit(rows_x, ys):
    import numpy as np
    coef = np.linalg.lstsq(np.array(rows_x, float), np.array(ys, float), rcond=None)[0]
    return [int(round(c)) for c in coef]


def _small(rng) -> dict:
    """The rest of a small shape (few positions, a narrow MLP): the fit needs variety, not size."""
    return dict(ffn=8 * rng.randint(5, 20), seq=rng.randint(4, 10), batch=rng.randint(1, 2))


@pytest.fixture(scope="module")
def fitted():
    """Review r9's submission, made fast: the course's measure functions called *before* the check
    at 10-11 small shapes per layer (part 2: kernel x qk_norm; part 3: kernel x norm x the two named
    MLPs x bias; 459 small forwards), integer coefficients fitted by least squares
    over chapter 01's monomials."""
    import random

    from gpumem.chapters.ch01_memory_anatomy import labwide
    rng = random.Random(1)
    part2, part3 = {}, {}
    for kernel in ("flash", "naive", "eager"):
        for qk in labwide.QK_NORMS:
            xs, ys = [], []
            for _ in range(11):
                sh = dict(labwide.draw_shape(rng), **_small(rng))
                sh["d_model"] = sh["n_heads"] * rng.choice([8, 12, 16])
                xs.append(_monomials2(*(sh[k] for k in ("d_model", "n_heads", "n_kv_heads", "head_dim", "ffn",
                                                        "seq", "batch"))))
                ys.append(labwide.measure(**sh, kernel=kernel, qk_norm=qk)[0])
            part2[kernel, qk] = _fit(xs, ys)
        for norm in variants.NORMS:
            for mlp in variants.MLPS:
                for bias in (False, True):
                    xs, ys, ps, qs = [], [], [], []
                    for _ in range(10):
                        sh = dict(labcheck.draw_shape(rng), **_small(rng))
                        sh["d_model"] = sh["n_heads"] * rng.choice([8, 12, 16])
                        a = tuple(sh[k] for k in ("d_model", "n_heads", "n_kv_heads", "ffn", "seq", "batch"))
                        got = variants.measure(**sh, kernel=kernel, norm=norm, mlp=mlp, qkv_bias=bias)
                        xs.append(_monomials3(*a)), ys.append(got[0])
                        ps.append(_param_monomials(*a[:4])), qs.append(got[1])
                    part3[kernel, norm, mlp, bias] = (_fit(xs, ys), _fit(ps, qs))

    def layer_activation_bytes(d_model, n_heads, n_kv_heads, head_dim, ffn, seq, batch, kernel, qk_norm):
        m = _monomials2(d_model, n_heads, n_kv_heads, head_dim, ffn, seq, batch)
        return sum(c * x for c, x in zip(part2[kernel, qk_norm], m))

    def variant_layer(d_model, n_heads, n_kv_heads, ffn, seq, batch, kernel, norm, mlp, qkv_bias):
        acts, params = part3[kernel, norm, mlp, bool(qkv_bias)]
        return {"activations": sum(c * x for c, x in zip(acts, _monomials3(d_model, n_heads, n_kv_heads, ffn,
                                                                          seq, batch))),
                "params": sum(c * x for c, x in zip(params, _param_monomials(d_model, n_heads, n_kv_heads, ffn)))}
    return {"model_state_bytes": solution()["model_state_bytes"],
            "layer_activation_bytes": layer_activation_bytes, "variant_layer": variant_layer,
            "_tables": (part2, part3)}


def test_the_fit_is_exact_where_it_was_measured(fitted):
    """The fit is a real one: right at a far shape for every named variant it measured."""
    far = dict(d_model=768, n_heads=12, n_kv_heads=6, ffn=1600, seq=300, batch=1)
    for kernel, norm, mlp, bias in [("flash", "gemma", "gelu-dropout", True), ("eager", "hf", "swiglu", False)]:
        got = fitted["variant_layer"](**far, kernel=kernel, norm=norm, mlp=mlp, qkv_bias=bias)
        assert (got["activations"], got["params"]) == variants.measure(**far, kernel=kernel, norm=norm, mlp=mlp,
                                                                       qkv_bias=bias)


def _table_row(report, function: str) -> str:
    """The one row a part gets whose function holds a table (labtable): no case of it graded."""
    got = rows(report, function)
    assert [(r.status, r.case) for r in got] == [("wrong", "a count, not a table of answers")], report.summary()
    return got[0].detail


def test_measuring_then_fitting_is_refused_as_a_table(fitted):
    """Review r9's fit, held in its functions' closures, and review r29's, pasted as two global dict
    literals (26 of 27 rows passed): each of parts 2 and 3 gets the table row, naming the table,
    and none of its cases is graded. Part 1, a count, passes."""
    report = grade(fitted, 0)
    assert "more than a count needs (100" in _table_row(report, "layer_activation_bytes")
    assert "B: part3" in _table_row(report, "variant_layer")
    assert all(r.status == "ok" for r in rows(report, "model_state_bytes")) and not report.solved
    part2, part3 = fitted["_tables"]
    source = ("def layer_activation_bytes(d_model, n_heads, n_kv_heads, head_dim, ffn, seq, batch, kernel, qk_norm):\n"
              "    m = MONO2(d_model, n_heads, n_kv_heads, head_dim, ffn, seq, batch)\n"
              "    return sum(c * x for c, x in zip(FIT2[kernel, qk_norm], m))\n"
              "def variant_layer(d_model, n_heads, n_kv_heads, ffn, seq, batch, kernel, norm, mlp, qkv_bias):\n"
              "    acts, params = FIT3[kernel, norm, mlp, bool(qkv_bias)]\n"
              "    m = MONO3(d_model, n_heads, n_kv_heads, ffn, seq, batch)\n"
              "    return {'activations': sum(c * x for c, x in zip(acts, m)), 'params': 0}\n")
    ns = {"model_state_bytes": fitted["model_state_bytes"], "FIT2": dict(part2), "FIT3": dict(part3),
          "MONO2": _monomials2, "MONO3": _monomials3}
    exec(compile(source, "<lab01_memory_calculator.ipynb cell 6>", "exec"), ns)
    report = grade(ns, 4)
    assert "B: FIT2" in _table_row(report, "layer_activation_bytes")
    assert "B: FIT3" in _table_row(report, "variant_layer")


def test_a_table_in_a_string_annotation_is_counted_and_reading_annotations_is_refused(fitted):
    """Review r31: the fitted tables written as string annotations of a helper (``def notes(fit2:
    "..."):``) and read back through ``notes.__annotations__`` passed 39 of 39 rows: the strings are
    constants of the defining cell, not of any function, and no annotation was counted. Each part
    now gets the table row naming the annotations, and the kernel-wide scan refuses the read."""
    from gpumem.course import lab_reach
    part2, part3 = fitted["_tables"]
    source = (f"def notes(fit2: {repr(repr(dict(part2)))}, fit3: {repr(repr(dict(part3)))}):\n    pass\n"
              "def _table(which):\n    return eval(notes.__annotations__[which])\n"
              "def layer_activation_bytes(d_model, n_heads, n_kv_heads, head_dim, ffn, seq, batch, kernel, qk_norm):\n"
              "    m = MONO2(d_model, n_heads, n_kv_heads, head_dim, ffn, seq, batch)\n"
              "    return sum(c * x for c, x in zip(_table('fit2')[kernel, qk_norm], m))\n"
              "def variant_layer(d_model, n_heads, n_kv_heads, ffn, seq, batch, kernel, norm, mlp, qkv_bias):\n"
              "    acts, params = _table('fit3')[kernel, norm, mlp, bool(qkv_bias)]\n"
              "    m = MONO3(d_model, n_heads, n_kv_heads, ffn, seq, batch)\n"
              "    return {'activations': sum(c * x for c, x in zip(acts, m)), 'params': 0}\n")
    ns = {"model_state_bytes": fitted["model_state_bytes"], "MONO2": _monomials2, "MONO3": _monomials3}
    exec(compile(source, "<lab01_memory_calculator.ipynb cell 7>", "exec"), ns)
    report = grade(ns, 5)
    assert "B: notes's annotations" in _table_row(report, "layer_activation_bytes")
    assert "B: notes's annotations" in _table_row(report, "variant_layer")
    assert "__annotations__" in (lab_reach.first_reach("x = notes.__annotations__['fit2']\n") or "")
    assert "get_type_hints" in (lab_reach.first_reach("import typing\nx = typing.get_type_hints(notes)\n") or "")


def _tables_read_from(holder: str, reader: str, fitted) -> dict:
    """The fitted tables of review r29 held in ``holder`` (source defining a class ``Glossary``)
    and decoded by ``reader`` (an expression giving the tables' text back in hex): parts 2 and 3
    that only look their answers up."""
    source = (holder +
              f"def _table(which):\n    return eval(bytes.fromhex({reader}).decode())[which]\n"
              "def layer_activation_bytes(d_model, n_heads, n_kv_heads, head_dim, ffn, seq, batch, kernel, qk_norm):\n"
              "    m = MONO2(d_model, n_heads, n_kv_heads, head_dim, ffn, seq, batch)\n"
              "    return sum(c * x for c, x in zip(_table(0)[kernel, qk_norm], m))\n"
              "def variant_layer(d_model, n_heads, n_kv_heads, ffn, seq, batch, kernel, norm, mlp, qkv_bias):\n"
              "    acts, params = _table(1)[kernel, norm, mlp, bool(qkv_bias)]\n"
              "    m = MONO3(d_model, n_heads, n_kv_heads, ffn, seq, batch)\n"
              "    return {'activations': sum(c * x for c, x in zip(acts, m)), 'params': 0}\n")
    ns = {"__name__": "__main__", "model_state_bytes": fitted["model_state_bytes"], "MONO2": _monomials2,
          "MONO3": _monomials3}
    exec(compile(source, "<lab01_memory_calculator.ipynb cell 10>", "exec"), ns)
    return ns


def _blob(fitted) -> str:
    part2, part3 = fitted["_tables"]
    return repr((dict(part2), dict(part3))).encode().hex()


def test_review_r33_a_table_split_into_class_attribute_names_gets_the_table_row(fitted):
    """Review r33: the measured tables, in hex, split into hundreds of class attribute names of 24
    characters (``z000<20 hex digits> = None``) and read back by ``dir(Glossary)``, passed 39 of 39
    rows: names up to 24 characters were free and ``None`` holds nothing. The distinct names a part
    uses now count, in all, against a limit of about four times the lab's own."""
    blob = _blob(fitted)
    names = "".join(f"    z{i:03d}{blob[j:j + 20]} = None\n" for i, j in enumerate(range(0, len(blob), 20)))
    ns = _tables_read_from('class Glossary:\n    """Words I looked up."""\n' + names,
                           "''.join(n[4:] for n in dir(Glossary) if n[0] == 'z')", fitted)
    report = grade(ns, 5)
    for part in ("layer_activation_bytes", "variant_layer"):
        assert "names can hold a table of answers too" in _table_row(report, part)


def test_review_r33_a_table_in_a_class_docstring_gets_the_table_row(fitted):
    """Review r33: the same tables as a class's docstring, read as ``Glossary.__doc__``: only
    functions' docstrings were counted where code reads ``__doc__``. A class's counts too."""
    ns = _tables_read_from(f'class Glossary:\n    """{_blob(fitted)}"""\n', "Glossary.__doc__", fitted)
    report = grade(ns, 5)
    for part in ("layer_activation_bytes", "variant_layer"):
        assert "B: the docstring of class Glossary" in _table_row(report, part)


def test_the_labs_counts_are_well_inside_the_table_limits():
    """The solution's counts hold 31 and 129 bytes of literal data (review r29's honest solution:
    25 and 121, before the chains' products), each limit about three times that, so messages have room."""
    from gpumem.chapters.ch01_memory_anatomy import labtable
    from gpumem.course import literal_size
    ns = solution()
    for name, (chars_limit, instructions_limit, names_limit) in labtable.LIMITS.items():
        chars, instructions = literal_size.measure(ns[name], ns)
        spelt = literal_size.name_chars(ns[name], ns)
        assert chars * 3 < chars_limit and instructions * 3 < instructions_limit, (name, chars, instructions)
        assert spelt * 3 < names_limit, (name, spelt)
        assert abs(chars - labtable.OWN[name][0]) <= 10 and abs(spelt - labtable.OWN[name][2]) <= 10, (name, chars, spelt)


def test_a_per_operation_fit_fails_where_two_operations_share_a_tensor():
    """A smarter fit: each operation's bytes measured alone before the check (the chain of that one
    operation, less the chain of none), added up along a drawn chain. It misses what neighbours
    share and what a cast changes; the row names the first operation where it goes wrong."""
    shape = dict(d_model=32, n_heads=4, n_kv_heads=2, ffn=40, seq=9, batch=2, kernel="flash", norm="fused",
                 qkv_bias=False)
    n, empty = 2 * 9 * 40, variants.measure(**shape, mlp=())[0]
    per_op = {op: (variants.measure(**shape, mlp=(op,))[0] - empty) // n for op in variants.OPS}
    fit = solution()["variant_layer"]           # the named variants counted (a fit would be refused as a table)

    def variant_layer(d_model, n_heads, n_kv_heads, ffn, seq, batch, kernel, norm, mlp, qkv_bias):
        if not isinstance(mlp, tuple):
            return fit(d_model, n_heads, n_kv_heads, ffn, seq, batch, kernel, norm, mlp, qkv_bias)
        dropout = fit(d_model, n_heads, n_kv_heads, ffn, seq, batch, kernel, norm, "gelu-dropout", qkv_bias)
        T = batch * seq                                  # the GeLU MLP with dropout keeps 5 T F: none is 2 T F
        base = dropout["activations"] - 3 * T * ffn
        return {"activations": base + sum(per_op[op] for op in mlp) * T * ffn, "params": dropout["params"]}
    report = grade({**solution(), "variant_layer": variant_layer}, seed=0)
    bad = first_problem(report, "variant_layer")
    assert bad.status == "wrong" and "mlp=(" in bad.case, report.summary()
    assert bad.detail.startswith("operation ") and "at this step: what does it keep" in bad.detail, bad.detail


def test_the_solution_counts_every_drawn_chain():
    """The solution follows the chain; at two more draws every chain row passes."""
    for seed in (21, 22):
        got = rows(grade(solution(), seed), "variant_layer")
        assert sum("mlp=(" in r.case for r in got) == labcheck.CHAINS + 1 + len(labcheck.FIXED_CHAINS)
        assert all(r.status == "ok" for r in got)


def _chain_slip(fix):
    right = solution()["variant_layer"]

    def slip(**kw):
        got = right(**kw)
        return dict(got, activations=got["activations"] + fix(kw)) if isinstance(kw["mlp"], tuple) else got
    return slip


def _casts_ignored(kw):
    """Every hidden tensor counted at 2 bytes: the casts' fp32 left out (the solution's count of the
    chain without its casts, less its count with them)."""
    right, ops = solution()["variant_layer"], kw["mlp"]
    return (right(**{**kw, "mlp": tuple(o for o in ops if o not in ("float", "bf16"))})["activations"]
            - right(**kw)["activations"])


def _shared_counted_twice(kw):
    """An output an operation keeps counted again as the next operation's kept input."""
    ops, n = kw["mlp"], kw["batch"] * kw["seq"] * kw["ffn"]
    return sum(2 * n for a, b in zip(ops, ops[1:])
               if a in ("relu", "sigmoid", "tanh", "exp") and b in ("gelu", "gelu_tanh", "square", "silu"))


@pytest.mark.parametrize("fix", [_casts_ignored, _shared_counted_twice])
def test_a_chain_slip_is_named_at_its_first_wrong_operation(fix):
    bad = first_problem(grade({**solution(), "variant_layer": _chain_slip(fix)}, seed=0), "variant_layer")
    assert bad.status == "wrong" and "mlp=(" in bad.case and bad.detail.startswith("operation "), bad.detail
    assert "x tokens x ffn" in bad.detail and len(bad.detail) <= 300
    assert "(this case: expected " in bad.detail, bad.detail        # review r23: it was cut off at 300


def _solution_with(old: str, new: str):
    """The solution's variant_layer with one line of its chain rule changed, as a learner's cell."""
    import json
    cells = json.loads((ROOT / "solutions" / "lab01_memory_calculator.ipynb").read_text())["cells"]
    source = next("".join(c["source"]) for c in cells if "def variant_layer(" in "".join(c["source"]))
    assert source.count(old) == 1, old
    ns: dict = {}
    exec(compile(source.replace(old, new), "<lab01 slip>", "exec"), ns)
    return ns["variant_layer"]


@pytest.mark.parametrize("old, new, chain", [
    # dropout "zeroes the dropped numbers where they are": its output taken for its input
    ('                masks += 1\n',
     '                masks += 1\n                order.append(now)\n                continue\n',
     ("sigmoid", "exp", "dropout", "gelu")),
    # relu, sigmoid, tanh and exp taken to work in place: an output kept where the input already is
    ('                kept[len(size) - 1] = size[now]\n',
     '                kept[now] = size[now]\n                order.append(now)\n                continue\n',
     ("sigmoid", "gelu", "dropout", "relu", "bf16")),
])
def test_review_r23_an_output_taken_to_share_its_inputs_storage_fails_a_fixed_chain(old, new, chain):
    """Review r23: these rules passed 37/37 (no fixed chain put such an operation after one whose
    tensor was kept); drawn chains caught them in 24 % and about 40 % of checks. By hand at
    FIXED_SHAPE (n = 2 x 23 x 200 = 9,200): sigmoid keeps its output, exp a new output (+2n, the
    slip +0), dropout a mask (+n) and a new tensor that gelu keeps (+2n, the slip +0). Since the
    chains' products (r36) the in-place slip fails one fixed chain earlier, where gelu keeps sigmoid's
    output and relu's output is kept besides: the slip takes both for up's output."""
    slip = _solution_with(old, new)
    report = grade({**solution(), "variant_layer": slip}, seed=0)
    bad = first_problem(report, "variant_layer")
    assert bad.status == "wrong" and repr(chain) in bad.case, (bad.case, bad.detail)
    assert "(this case: expected " in bad.detail and len(bad.detail) <= 300, bad.detail


# ---- review r11 lab 01 #2: a copy of the grader's chain count with its table renamed -------------

def _chain_copy(disguised: bool):
    """Review r11's route: ``labtruth._chain_bytes`` exec'd from its source as ``my_chain``, with
    ``_KEEPS`` renamed ``KEEPS`` (one global: its bytecode and the names it uses then differ from
    the original's); or review r8's disguise of the whole of labtruth (every name prefixed, every
    string in a global, a statement added). Parts 1 and 2 and the fixed variants are the
    solution's; a chain's count is the copy's."""
    import inspect

    from gpumem.chapters.ch01_memory_anatomy import labtruth
    if disguised:
        mine = disguise(labtruth, "mytruth").q_chain_bytes
    else:
        source = inspect.getsource(labtruth._chain_bytes).replace("_chain_bytes", "my_chain").replace("_KEEPS", "KEEPS")
        ns = {"KEEPS": dict(labtruth._KEEPS)}
        exec(compile(source, "<lab01 cell 30>", "exec"), ns)
        mine = ns["my_chain"]
    right = solution()["variant_layer"]

    def variant_layer(d_model, n_heads, n_kv_heads, ffn, seq, batch, kernel, norm, mlp, qkv_bias):
        got = right(d_model, n_heads, n_kv_heads, ffn, seq, batch, kernel, norm, mlp, qkv_bias)
        if not isinstance(mlp, tuple):
            return got
        n = batch * seq * ffn
        plain = right(d_model, n_heads, n_kv_heads, ffn, seq, batch, kernel, norm, (), qkv_bias)
        return dict(got, activations=plain["activations"] - 2 * n + mine(mlp, n))
    return variant_layer


@pytest.mark.parametrize("disguised", [False, True])
def test_a_renamed_copy_of_the_graders_chain_count_is_refused(disguised):
    """With the watch, the first chain row is the copy's refusal, named (the refusal first, review
    r11 #3); without it (labcopies.shared blind), review r11's copy answers every chain row."""
    from gpumem.chapters.ch01_memory_anatomy import labcopies
    fn = _chain_copy(disguised)
    got = rows(grade({**solution(), "variant_layer": fn}), "variant_layer")
    chains = [r for r in got if "mlp=(" in r.case]
    bad = [r for r in got if r.status != "ok"]
    assert chains and len(bad) == 1 and bad[0] is chains[0] and bad[0].status == "error", [(r.case, r.detail) for r in got]
    assert bad[0].detail.count("labtruth._chain_bytes (the course's code, or a copy of it) ran inside your function"), \
        bad[0].detail
    assert sys.getprofile() is None
    if disguised:
        return
    blind = labcopies.shared
    try:
        labcopies.shared = lambda: None
        got = rows(grade({**solution(), "variant_layer": fn}), "variant_layer")
    finally:
        labcopies.shared = blind
    assert sum("mlp=(" in r.case for r in got) == labcheck.CHAINS + 1 + len(labcheck.FIXED_CHAINS) and all(r.status == "ok" for r in got), \
        [(r.case, r.detail) for r in got if r.status != "ok"]


# ---- review r15 lab 01 #1: a table of measured transitions covers every chain ------------------

@pytest.fixture(scope="module")
def bigram():
    """Review r15's table, as its bigram.py builds it before the check: each operation's bytes
    keyed on (previous operation, operation, dtype), measured with ``variants.measure`` at one tiny
    shape as M(prefix + (p, op)) - M(prefix + (p,)) (253 entries, no reasoning about what an
    operation keeps or what neighbours share). Yields the count per tokens x ffn and the chain
    keys its measurements left in the grader's cache (taken out again afterwards)."""
    shape = dict(d_model=32, n_heads=4, n_kv_heads=2, ffn=40, seq=9, batch=2, kernel="flash", norm="fused",
                 qkv_bias=False)
    n, before = 2 * 9 * 40, set(variants._truth)

    def m(ops):
        return variants.measure(**shape, mlp=tuple(ops))[0]

    def dtype(op, d):
        return "f" if op == "float" else "b" if op == "bf16" else d

    def same(op, d):
        return (op, d) in (("float", "f"), ("bf16", "b"))
    empty, table = m(()), {}
    for op in variants.OPS:
        if not same(op, "b"):
            table[None, op, "b"] = (m((op,)) - empty) // n
    for d0, prefix in (("b", ()), ("f", ("float",))):
        for p in variants.OPS:
            if not same(p, d0):
                d, base = dtype(p, d0), m(prefix + (p,))
                for op in variants.OPS:
                    if not same(op, d):
                        table[p, op, d] = (m(prefix + (p, op)) - base) // n
    assert len(table) == 253
    # r36 #1's products, fitted the same way: each mulK after p, in one context (K scales before)
    for d0, prefix in (("b", ()), ("f", ("float",))):
        for p in variants.OPS:
            if not same(p, d0):
                for mul in variants.MULS:
                    pad = ("scale",) * int(mul[3:]) + prefix + (p,)
                    table[p, mul, dtype(p, d0)] = (m(pad + (mul,)) - m(pad)) // n
        for mul in variants.MULS:                # and each operation after a product
            pad = ("scale",) * int(mul[3:]) + prefix + (mul,)
            for op in variants.OPS:
                if not same(op, d0):
                    table[mul, op, d0] = (m(pad + (op,)) - m(pad)) // n

    def per_n(ops):
        prev, d, total = None, "b", 2            # the empty chain: down keeps up's bf16 output
        for op in ops:
            if not same(op, d):
                total += table[prev, op, d]
                prev, d = op, dtype(op, d)
        return total
    left = {k: variants._truth[k] for k in set(variants._truth) - before}
    yield per_n, left
    for k in left:
        variants._truth.pop(k, None)


def _bigram_submission(per_n):
    """Parts 1 and 2 and the named variants: the solution's counts; a chain: the solution's GeLU MLP
    with dropout less its 5 T F, plus the table's count."""
    fit = solution()["variant_layer"]

    def variant_layer(d_model, n_heads, n_kv_heads, ffn, seq, batch, kernel, norm, mlp, qkv_bias):
        if not isinstance(mlp, tuple):
            return fit(d_model, n_heads, n_kv_heads, ffn, seq, batch, kernel, norm, mlp, qkv_bias)
        got, n = fit(d_model, n_heads, n_kv_heads, ffn, seq, batch, kernel, norm, "gelu-dropout", qkv_bias), \
            batch * seq * ffn
        return dict(got, activations=got["activations"] - 5 * n + per_n(mlp) * n)
    return {**solution(), "variant_layer": variant_layer}


def test_a_table_of_measured_transitions_written_out_is_refused_as_a_table(bigram):
    """Review r15's cheat: a chain of one-input operations keeps a sum of terms fixed by each
    operation, the one before it and the dtype, so 253 measurements covered every chain. Written out
    as data, the table holds more than a count needs and gets the table row (labtable). The table
    left in the grader's cache is refused besides (the next test); here it has been taken out."""
    per_n, left = bigram
    for k in left:
        variants._truth.pop(k, None)
    report = grade(_bigram_submission(per_n), seed=3)
    assert "B: table" in _table_row(report, "variant_layer")
    assert all(r.status == "ok" for r in rows(report, "layer_activation_bytes"))
    said = " ".join(labcheck.__doc__.split())           # the claims review r15 found false are gone
    assert "too many to measure in advance" not in said and "no count measured" not in labcheck.CHAIN_NOTE


@pytest.mark.parametrize("seed", [3, 11])
def test_review_r36_a_packed_transition_table_fails_the_chains_products(bigram, monkeypatch, seed):
    """Reviews r35 and r36 packed that table three digits a byte (104 B), under the table rule, and
    passed 39/39. Here the table rule is off (as for any packing), and the table is extended with the
    products fitted the same way (each mulK after each operation, in one context): the products make
    a step's bytes depend on the tensors up to four operations back, which no transition table
    holds, so a chain with a product fails. The solution passes the same grading."""
    from gpumem.chapters.ch01_memory_anatomy import labtable
    per_n, left = bigram
    for k in left:
        variants._truth.pop(k, None)
    monkeypatch.setattr(labtable, "refused", lambda *args: False)
    report = grade(_bigram_submission(per_n), seed=seed)
    bad = first_problem(report, "variant_layer")
    assert bad is not None and bad.status == "wrong" and "mlp=(" in bad.case, report.summary()
    assert any(mul in bad.case for mul in variants.MULS), bad.case
    assert all(r.status == "ok" for r in rows(grade(solution(), seed=seed), "variant_layer"))
    said = " ".join(labcheck.__doc__.split())
    assert "15**4 = 50,625 entries" in said and "reviews r35, r36" in said


def test_a_table_left_in_the_graders_cache_is_refused(bigram):
    """Review r15 #1 (c): the same table with its measurements still in ``variants._truth``
    (chain keys the grader did not measure) grades nothing and says why; the grader's own chain
    keys, from earlier checks, do not count."""
    from gpumem.chapters.ch01_memory_anatomy import labtruth
    per_n, left = bigram
    assert len(left) > labtruth.TABULATED
    variants._truth.update(left)
    try:
        report = grade(_bigram_submission(per_n), seed=3)
    finally:
        for k in left:
            variants._truth.pop(k, None)
    assert [(r.function, r.status) for r in report.rows] == [("check", "error")], report.summary()
    assert "chain MLPs measured in this kernel before the check" in report.rows[0].detail, report.rows[0].detail
    assert not labtruth.tabulated() and grade(solution(), seed=5).solved


def test_a_table_in_the_kernels_cache_is_refused_before_grading_apart(bigram):
    """Review r16 #2: in a kernel the check grades in a fresh process, whose cache is empty; the
    kernel's own cache is read first (labcheck.kernel_refusal), so the same table grades nothing."""
    from gpumem import chapters
    per_n, left = bigram
    variants._truth.update(left)
    try:
        report = chapters.check_lab("lab01_memory_calculator", {}, show=False, apart=True)
    finally:
        for k in left:
            variants._truth.pop(k, None)
    assert [(r.function, r.status) for r in report.rows] == [("check", "error")], report.summary()
    assert "chain MLPs measured in this kernel before the check" in report.rows[0].detail


# --- review r19: a slip in one chain rule passed most checks (the drawn chains rarely met it) ---
def _slip_acts(mlp, slip, n):
    """Bytes a chain MLP's hidden tensors keep, counted by the rules (review r19's working count), with
    one rule slipped: A, a cast after an op that kept its output makes no new tensor; B, the cast
    back to bf16 at the end never copies; C, ``scale`` keeps the tensor before it."""
    acts, size, held = 0, 2, False
    for op in mlp:
        if op == "bf16" and slip == "I":        # I (r22): the cast back to bf16 taken for a no-op
            continue
        keeps_input = op in ("gelu", "gelu_tanh", "square", "silu") or slip == f"E:{op}"
        if slip == f"F:{op}":                   # review r20 slips: E, an op keeps its input instead of
            keeps_input = False                 # its output; F, its output instead of its input
        if op in ("float", "bf16"):
            new = 4 if op == "float" else 2
            if slip == "A":
                size = new
            elif slip == "J" and op == "bf16":  # J (r22): fp32 -> bf16 taken for a view (no copy)
                size = new
            elif new != size or slip == "D" or (slip == "H" and op == "float"):   # D (r20), H (r21): a cast
                size, held = new, False         # to the dtype the tensor has copies too (H: .float() only)
        elif keeps_input:
            acts += 0 if held else size * n
            held = False
        elif op in ("relu", "sigmoid", "tanh", "exp", "gelu", "gelu_tanh", "square", "silu"):
            acts, held = acts + size * n, True
        elif op == "dropout":                   # G (r20): dropout keeps its output as well as its mask
            acts, held = (acts + n + size * n, True) if slip == "G" else (acts + n, False)
        elif op == "scale" and slip != "C":
            held = False
    if size != 2 and slip != "B":
        held = False
    return acts + (0 if held else 2 * n)


R20_SLIPS = ["D", "G", "H", "I", "J"] + [f"E:{op}" for op in ("relu", "sigmoid", "tanh", "exp")] + \
    [f"F:{op}" for op in ("gelu", "gelu_tanh", "square", "silu")]


@pytest.mark.parametrize("slip", R20_SLIPS)
def test_each_r20_slip_changes_a_fixed_chains_count(slip):
    """Review r20: each of these slips passed 36-79 % of checks on the drawn chains alone; each
    changes the count of a fixed chain (graded before the drawn ones, so it fails every check; the
    grading itself is run for D below and for A-C)."""
    n = 7 * 11
    assert any(_slip_acts(c, slip, n) != _slip_acts(c, None, n) for _, c, _ in labcheck.FIXED_CHAINS), slip


@pytest.mark.parametrize("slip", ["A", "B", "C", "D", "H", "I", "J"])
def test_a_slip_in_one_chain_rule_fails_on_the_fixed_chains(slip):
    """The solution's count with one rule slipped (the difference the slip makes on each chain);
    the fixed chains (the same at every check) fail each slip; the drawn ones met them in 18-33 % of checks."""
    sol = solution()["variant_layer"]

    def slipped(**case):
        got = sol(**case)
        if isinstance(case["mlp"], tuple):
            n = case["seq"] * case["batch"] * case["ffn"]
            right = _slip_acts(case["mlp"], None, n)
            got = {**got, "activations": got["activations"] + _slip_acts(case["mlp"], slip, n) - right}
        return got
    chains = [mlp for _, mlp, _ in labcheck.FIXED_CHAINS]
    assert any(_slip_acts(c, slip, 1) != _slip_acts(c, None, 1) for c in chains)
    report = Report(labcheck.LAB)                 # part 3 alone: parts 1 and 2 do not see the chains
    labcheck._grade_variants(report, {**solution(), "variant_layer": slipped}["variant_layer"], random.Random(5))
    bad = first_problem(report, "variant_layer")
    assert bad.status == "wrong" and "mlp=(" in bad.case, report.summary()


class _LazyAnswer(dict):
    """Review r20: a dict whose ``get`` measured the truth when the grader read it, after the guarded
    call (33/33 on both paths)."""

    def get(self, key, default=None):
        got = variants.measure(**self.case)
        return {"activations": got[0], "params": got[1]}[key]


def _lazy_variant(**case):
    answer = _LazyAnswer(activations=0, params=0)
    answer.case = case
    return answer


def test_an_answer_that_computes_itself_when_read_is_read_under_the_guard():
    """The answer is rebuilt from dict's own slots inside the guarded call (gpumem.course.plain), so
    its ``get`` never runs: the zeros it holds are graded, and fail the first case."""
    report = Report(labcheck.LAB)
    labcheck._grade_variants(report, _lazy_variant, random.Random(5))
    bad = first_problem(report, "variant_layer")
    assert bad is not None and bad.status == "wrong" and bad.case == report.rows[0].case, report.summary()


def test_review_r23_the_prompt_counts_the_fixed_chains_the_grader_grades():
    """Review r23: cell 7 said "two fixed chains" while FIXED_CHAINS held six."""
    import json
    words = {6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten", 11: "eleven", 12: "twelve"}
    text = "".join("".join(c["source"]) for c in json.loads(
        (ROOT / "solutions" / "lab01_memory_calculator.ipynb").read_text())["cells"] if c["cell_type"] == "markdown")
    assert f"grades {words[len(labcheck.FIXED_CHAINS)]} fixed chains" in text


def test_review_r24_a_long_chain_hint_keeps_its_expected_and_got(monkeypatch):
    """Review r24: an 8-operation chain's hint ran to 378 characters and lost "(this case: expected
    ..., got ...)" at the 300-character row limit; part 3's rows now keep up to 450."""
    from gpumem.chapters.ch01_memory_anatomy import labhints
    long = "operation 8, 'gelu_tanh', after " + "x" * 300 + " (this case: expected 1 B, got 2)"
    monkeypatch.setattr(labhints, "why", lambda *a, **k: long)
    right = solution()["variant_layer"]

    def wrong(**kw):
        got = right(**kw)
        return dict(got, activations=got["activations"] + 2)
    bad = first_problem(grade({**solution(), "variant_layer": wrong}), "variant_layer")
    assert len(long) > 300 and bad.detail.endswith("(this case: expected 1 B, got 2)"), bad.detail


def test_the_check_cell_states_labtables_limits():
    """The Check cell's limits are labtable's constants, in the lab and its solution alike."""
    import json

    from gpumem.chapters.ch01_memory_anatomy import labtable
    (c2, i2, n2), (c3, i3, n3) = labtable.LIMITS["layer_activation_bytes"], labtable.LIMITS["variant_layer"]
    for folder in ("labs", "solutions"):
        cells = json.loads((ROOT / folder / "lab01_memory_calculator.ipynb").read_text())["cells"]
        text = " ".join(" ".join("".join(c["source"]).split()) for c in cells)
        assert (f"at most {c2} bytes of literal data" in text and f"and {i2:,} bytecode instructions" in text
                and f"`variant_layer` {c3} bytes and {i3:,} instructions" in text
                and f"may add up to {n2} and {n3} characters" in text), folder


@pytest.mark.parametrize("factor, chain", [("now", ("float", "bf16", "mul1", "square")),
                                           ("other", ("gelu", "float", "mul2", "square"))])
def test_review_r38_r39_a_product_in_one_factors_dtype_fails_a_fixed_chain(factor, chain):
    """Review r38 #1: a product taken in the current factor's dtype (not bf16 x fp32 -> fp32) passed
    every part-3 row of 97.8 % of simulated checks; no fixed chain had a bf16 current factor and an
    fp32 earlier one. By hand, ("float", "bf16", "mul1", "square") keeps 2 (the bf16 copy) + 4 (the
    fp32 one) + 4 (square's fp32 input) + 2 (down's bf16 copy) = 12 x tokens x ffn; the slip 10.
    Review r39 #1, the mirror image (the earlier factor's dtype), passed about 71 %: ("gelu", "float",
    "mul2", "square") keeps 2 (up's output, gelu's input and a factor) + 4 (the fp32 factor) + 4
    (square's fp32 input) + 2 (down's bf16 copy) = 12; the slip 10."""
    assert _chain_by_hand(chain, 1) == 12
    slip = _solution_with("                size[-1] = max(size[now], size[other])\n",
                          f"                size[-1] = size[{factor}]\n")
    report = grade({**solution(), "variant_layer": slip}, seed=0)
    bad = first_problem(report, "variant_layer")
    assert bad.status == "wrong" and repr(chain) in bad.case, (bad.case, bad.detail)
    if factor == "now":      # the product's own step keeps the same factors either way: square shows the dtype
        assert "operation 4, 'square'" in bad.detail and "too low at this step: what does it keep, in which dtype" \
            in bad.detail, bad.detail
