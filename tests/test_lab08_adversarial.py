"""Lab 08: the cheapest submissions that skip the idea fail, each with a row saying what was skipped.

The hand counts here (peft's 41,943,040 trainable parameters for Llama-3-8B at r = 16 on all seven
projections; QLoRA's 4 + 8/64 + 32/(64 x 256) bits) come from the published figures, not from the
grader; the drawn cases are checked for what the lab promises (answers that vary, GQA, heads whose
width is not d_model).
"""

import contextlib
import functools
import inspect
import io
import random

import pytest

from conftest import ROOT
from gpumem import chapters
from gpumem.chapters.ch08_finetuning import lab_acts, lab_cases, lab_draw
from gpumem.memory import finetune
from test_labs import notebook_namespace

LAB = "lab08_finetune_recipe"
LLAMA3_8B = {"n_layers": 32, "d_model": 4096, "n_heads": 32, "n_kv_heads": 8, "head_dim": 128,
             "ffn": 14336, "vocab": 128256, "tie_embeddings": False}
_SOLVED: dict = {}


@pytest.fixture(autouse=True)
def _tests_count_as_cells(monkeypatch):
    """The learners' functions these tests write live in this file or in strings they compile ("<cheat
    cell>", "<string>"), not in notebook cells: while graded, lab 08 runs only cells' and installed
    code (lab_guard.allowed), so these count as cells here, and the tests written before that rule
    still test what they test (only here: "<mine>" and a module elsewhere stay refused, as
    test_code_from_a_string_or_a_file_is_refused checks)."""
    import os
    monkeypatch.setenv("GPUMEM_TEST_CELLS", os.pathsep.join((__file__, "<cheat cell>", "<string>")))


def solution() -> dict:
    if not _SOLVED:
        with contextlib.redirect_stdout(io.StringIO()):
            _SOLVED.update(notebook_namespace(ROOT / "solutions" / f"{LAB}.ipynb"))
    return dict(_SOLVED)


def grade(ns: dict, seed: int = 8):
    from gpumem.chapters.ch08_finetuning import labcheck
    from gpumem.course.grader_seal import refuse_if_changed
    refuse_if_changed(LAB)
    return labcheck.check(ns, show=False, rng=random.Random(seed))


def walk(ns: dict, usable=lambda capacity: capacity - 2**30 - int(0.05 * capacity), policies=("none", "full"),
         states=None):
    """A chooser that walks the ladder with the namespace's own counts (``states``: role_bytes' total
    unless given), ``usable`` bytes of a capacity and ``policies`` within a rung."""
    role_bytes, acts, cpu = ns["role_bytes"], ns["activation_peak"], ns["base_on_cpu"]
    states = states or (lambda model, ft: sum(role_bytes(model, ft).values()))

    def choose_recipe(model, capacity, host_ram, seq, batch, ladder=lab_draw.LADDER):
        room = usable(capacity)
        for ft in ladder.values():
            for p in policies:
                if ft.offload:
                    need = cpu(model, ft, seq, batch, p)
                    if need["gpu"] <= room and need["host"] <= host_ram:
                        return ft, p
                elif states(model, ft) + acts(model, ft, seq, batch, p) <= room:
                    return ft, p
        return None
    return choose_recipe


def first_problem(report, function: str):
    bad = [r for r in report.rows if r.function == function and r.status != "ok"]
    assert bad, report.summary()
    return bad[0]


def test_solution_passes_on_many_draws():
    ns = solution()
    for seed in range(3):
        report = grade(ns, seed)
        assert report.solved, report.summary()


def test_solution_matches_published_figures():
    ns = solution()
    lora = ns["role_bytes"](LLAMA3_8B, lab_draw.LADDER["lora"])
    assert lora["adapter_weights"] == 4 * 41_943_040          # peft print_trainable_parameters, fp32
    n = 8_030_261_248                                          # Llama-3-8B's parameters (Meta)
    full = ns["role_bytes"](LLAMA3_8B, lab_draw.LADDER["full"])
    assert sum(full.values()) == 16 * n
    q = ns["role_bytes"](LLAMA3_8B, lab_draw.LADDER["qlora"])
    quantised = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
    bits = 4 + 8 / 64 + 32 / (64 * 256)                        # QLoRA section 3: 4.127 bits
    constants = q["base_weights"] - 2 * (n - quantised) + q["quant_constants"]
    assert abs(constants - quantised * bits / 8) < 32 * 7 * 1200   # + bitsandbytes' per-tensor extras


def test_cases_vary_and_cover_the_dimensions():
    """... and every draw has a case the library gets wrong: its answer is None while gpumem's
    count of its qlora rung (fp32 absmaxes, block 32 or 64) fits, checked with the library itself
    (outside any guard) against the usable bytes by hand."""
    from gpumem.memory import gpus
    rng = random.Random(3)
    answers, odd = set(), 0
    for _ in range(5):       # each draw has three rungs of four: every rung over five draws (this seed)
        cases = lab_cases.choose_cases(rng)
        answers |= {c[0] for c in cases}
        assert len({c[0] for c in cases}) >= 4 and None in {c[0] for c in cases}
        assert {c[0][1] for c in cases if c[0]} == {"none", "full"}          # both policies, every draw
        assert len({c[0][0] for c in cases if c[0]}) >= 3
        assert {("qlora-cpu", "none"), ("qlora-cpu", "full")} <= {c[0] for c in cases}   # the base on the CPU
        for _, card, host_ram, model, seq, batch, figures, rungs in (c for c in cases if c[0] is None):
            cap = gpus.get(card).capacity
            usable = cap - 2**30 - int(0.05 * cap)
            q = rungs["qlora"]
            assert (q.nf4_block, q.double_quant) in ((32, False), (64, False))
            states, acts, _ = figures["qlora"]
            assert figures["qlora-cpu"][2] > host_ram                             # the host cannot hold it
            lib = sum(finetune.finetune_states(lab_draw.config(model), q).values()) + acts["full"]
            assert lib <= usable < states + min(acts.values())
        for model, _ in lab_draw.states_cases(rng):
            odd += model["n_heads"] * model["head_dim"] != model["d_model"]
            assert model["n_heads"] % model["n_kv_heads"] == 0 and model["n_heads"] >= 4
            assert model["head_dim"] in (64, 128) and model["d_model"] % 128 == 0
    assert {a[0] for a in answers if a} == set(lab_draw.LADDER) and None in answers and odd >= 3
    with pytest.raises(TypeError):
        lab_draw.LADDER["full"] = lab_draw.LADDER["qlora"]     # the notebook's LADDER is the grader's: read-only


def test_library_call_is_refused():
    from gpumem.memory import models
    ns = solution()
    ns["role_bytes"] = lambda model, ft: finetune.finetune_states(
        models.ModelConfig(name="m", n_layers=model["n_layers"], d_model=model["d_model"], n_heads=model["n_heads"],
                           n_kv_heads=model["n_kv_heads"], ffn=model["ffn"], vocab=model["vocab"],
                           explicit_head_dim=model["head_dim"], tie_embeddings=model["tie_embeddings"]), ft)
    row = first_problem(grade(ns), "role_bytes")
    assert "count it yourself" in row.detail and "finetune_states" in row.detail


def test_library_reserve_is_refused():
    from gpumem.memory import gpus
    ns = solution()
    ns["choose_recipe"] = walk(ns, lambda capacity: gpus.usable(capacity))
    row = first_problem(grade(ns), "choose_recipe")
    assert "count it yourself" in row.detail and "usable" in row.detail


def test_chapter_reserve_is_refused_and_is_the_lab_s():
    """The lab's reserve is chapter 08's single-GPU one (context + 5 %, no NCCL): the grader's usable
    bytes equal the hand count, and the learner may not borrow the chapter's function."""
    from gpumem.chapters.ch08_finetuning import scale
    from gpumem.memory import gpus
    h100 = 81_559 * 2**20
    assert scale.usable("h100-80gb") == h100 - 2**30 - int(0.05 * h100)
    ns = solution()
    names = {gpus.get(c).capacity: c for c in lab_draw.CARDS}
    ns["choose_recipe"] = walk(ns, lambda capacity: scale.usable(names[capacity]))
    row = first_problem(grade(ns), "choose_recipe")
    assert "count it yourself" in row.detail and "usable" in row.detail


def test_copied_source_is_refused():
    ns = solution()
    mine: dict = {"__name__": "mine"}
    source = inspect.getsource(finetune).replace("from . import accounting", "from gpumem.memory import accounting")
    source = source.replace("from .finetune_setup", "from gpumem.memory.finetune_setup")
    exec(compile(source, "<mine>", "exec"), mine)
    cfg = lab_draw.config
    ns["role_bytes"] = lambda model, ft: mine["finetune_states"](cfg(model), ft)
    row = first_problem(grade(ns), "role_bytes")
    assert "count it yourself" in row.detail


def test_answer_table_fails():
    ns = solution()
    ladder = lab_draw.LADDER
    table = {"t4": "qlora", "l4": "qlora", "a100-40gb": "lora", "a100-80gb": "lora", "h100-80gb": "lora",
             "h200": "full-8bit"}
    from gpumem.memory import gpus
    by_capacity = {gpus.get(c).capacity: r for c, r in table.items()}
    ns["choose_recipe"] = lambda model, capacity, host_ram, seq, batch, ladder: (ladder[by_capacity[capacity]], "full")
    report = grade(ns)
    assert sum(r.status != "ok" for r in report.rows if r.function == "choose_recipe") >= 2
    wrong = [r.detail for r in report.rows if r.function == "choose_recipe" and r.status != "ok"]
    assert all("fits" in d or "usable" in d for d in wrong), wrong


def test_swapped_roles_fail_with_the_role_named():
    ns = solution()
    right = ns["role_bytes"]

    def swapped(model, ft):
        got = right(model, ft)
        got["optimizer_moments"] += got["master"]      # master counted as optimizer state: total unchanged
        got["master"] = 0
        return got
    ns["role_bytes"] = swapped
    row = first_problem(grade(ns), "role_bytes")
    assert "master" in row.detail and "wrong role" in row.detail


def test_nf4_at_four_bits_fails():
    ns = solution()
    right = ns["role_bytes"]
    ns["role_bytes"] = lambda model, ft: {**right(model, ft), "quant_constants": 0}
    row = first_problem(grade(ns), "role_bytes")
    assert "quant_constants" in row.detail and "absmax per ft.nf4_block" in row.detail


def test_the_papers_block_of_64_everywhere_fails():
    """A role_bytes that reads neither ft.nf4_block nor ft.double_quant (QLoRA's defaults, as the
    lab spelled them out before) is wrong on the drawn setups, and told which choice it missed."""
    ns = solution()
    right = ns["role_bytes"]
    ladder_qlora = lab_draw.LADDER["qlora"]

    def defaults(model, ft):
        if ft.base_dtype != "nf4":
            return right(model, ft)
        got = right(model, lab_draw.LabFinetune(**{**ft.__dict__, "nf4_block": 64, "double_quant": True}))
        assert ladder_qlora.nf4_block == 64
        return got
    ns["role_bytes"] = defaults
    row = first_problem(grade(ns), "role_bytes")
    assert "quant_constants" in row.detail and "ft.nf4_block is" in row.detail


def test_lora_with_d_model_everywhere_fails():
    ns = solution()
    right = ns["role_bytes"]

    def square(model, ft):
        got = right(model, ft)
        if ft.adapter == "lora":
            n_a = model["n_layers"] * len(ft.lora_targets) * ft.lora_rank * 2 * model["d_model"]
            e = 4 if ft.adapter_dtype == "fp32" else 2
            got["adapter_weights"] = got["grads"] = e * n_a
        return got
    ns["role_bytes"] = square
    row = first_problem(grade(ns), "role_bytes")
    assert "adapter_weights" in row.detail and "d_model wide on both sides?" in row.detail    # review r35 #1:
    assert "n_kv_heads" not in row.detail and "head_dim" not in row.detail                   # no width stated


def test_todo_lab_reports_todo_and_registry_has_it():
    assert chapters.lab_checks()[LAB].endswith("labcheck:check")
    report = grade(notebook_namespace(ROOT / "labs" / f"{LAB}.ipynb"))
    assert not report.solved and not report.problems and set(report.todo) == {
        "role_bytes", "activation_peak", "base_on_cpu", "choose_recipe"}


@pytest.mark.parametrize("seed", [1])
def test_seal_refuses_a_patched_grader(seed):
    from gpumem.chapters.ch08_finetuning import labcheck
    from gpumem.course.grader_seal import GraderChanged, changed
    original = labcheck.states_problem
    labcheck.states_problem = lambda got, want, ft: ""
    try:
        assert any("labcheck.states_problem" in n for n in changed())
        with pytest.raises(GraderChanged):
            chapters.check_lab(LAB, solution(), show=False)
    finally:
        labcheck.states_problem = original


def test_hostile_answers_get_rows_not_exceptions(monkeypatch):
    monkeypatch.setenv("GPUMEM_CASE_SECONDS", "1")
    ns = solution()
    ns["role_bytes"] = lambda model, ft: [1, 2, 3]
    ns["choose_recipe"] = lambda model, capacity, host_ram, seq, batch, ladder: "lora"
    report = grade(ns)
    assert "expected a dict role -> bytes" in first_problem(report, "role_bytes").detail
    assert "a rung's own Finetune" in first_problem(report, "choose_recipe").detail
    ns["choose_recipe"] = lambda model, capacity, host_ram, seq, batch, ladder: (ladder["lora"], "selective")
    assert "is not 'none' or 'full'" in first_problem(grade(ns), "choose_recipe").detail
    ns["choose_recipe"] = lambda model, capacity, host_ram, seq, batch, ladder: ladder["lora"]      # the old interface
    assert "'none' or 'full'" in first_problem(grade(ns), "choose_recipe").detail

    def hang(model, ft):
        while True:
            pass
    ns = solution()
    ns["role_bytes"] = hang
    rows = [r for r in grade(ns).rows if r.function == "role_bytes"]
    assert all(r.status == "error" for r in rows) and "longer than" in rows[0].detail


# The expert review's cheats (reviews23/expert_08.md): the drawn answers sit in the grader's frames
# while the learner's call runs, and another interpreter runs the library unguarded.
_FRAME_WALKS = {
    "sys._getframe": "f = sys._getframe(1)",
    "inspect": "import inspect; f = inspect.currentframe().f_back",
    "a traceback": "f = _tb_frame()",
    "a generator": "f = _gen_frame()",
}
_WALK = '''
import sys
def _tb_frame():
    try:
        raise ValueError
    except ValueError as e:
        return e.__traceback__.tb_frame
def _gen_frame():
    def g():
        yield box[0].gi_frame.f_back
    box = [g()]
    return next(box[0])
def _up(f, pred):
    while f is not None:
        if pred(f.f_locals):
            return f.f_locals
        f = f.f_back
def role_bytes(model, ft):
    {get}
    return dict(_up(f, lambda l: l.get("ft") is ft and isinstance(l.get("want"), dict))["want"])
def choose_recipe(model, capacity, host_ram, seq, batch, ladder):
    {get}
    w = _up(f, lambda l: "want" in l and "figures" in l)["want"]
    return None if w is None else (ladder[w[0]], w[1])
'''


@pytest.mark.parametrize("route", sorted(_FRAME_WALKS))
def test_reading_the_answers_off_the_graders_frames_is_refused(route):
    ns = notebook_namespace(ROOT / "labs" / f"{LAB}.ipynb")
    exec(compile(_WALK.replace("{get}", _FRAME_WALKS[route]), "<cheat cell>", "exec"), ns)
    report = grade(ns)
    assert not report.solved
    for function in ("role_bytes", "choose_recipe"):
        row = first_problem(report, function)
        assert "stack frames or the collector" in row.detail, row.detail


def test_running_the_library_in_another_process_is_refused():
    ns = notebook_namespace(ROOT / "labs" / f"{LAB}.ipynb")
    src = '''
import json, subprocess, sys
def role_bytes(model, ft):
    code = ("import json,sys; from gpumem.memory.finetune import Finetune, finetune_states;"
            "from gpumem.chapters.ch08_finetuning.lab_draw import config;"
            "m, f = json.loads(sys.argv[1]); f['lora_targets']=tuple(f['lora_targets']);"
            "print(json.dumps(finetune_states(config(m), Finetune(**f))))")
    out = subprocess.run([sys.executable, "-c", code, json.dumps([model, ft.__dict__])],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)
'''
    exec(compile(src, "<cheat cell>", "exec"), ns)
    row = first_problem(grade(ns), "role_bytes")
    assert "started another process (subprocess.Popen)" in row.detail, row.detail


def test_a_namedtuple_made_inside_the_call_is_not_taken_for_a_frame_walk():
    """collections.namedtuple looks at its caller's frame for a module name: benign, allowed."""
    ns = solution()
    inner = ns["role_bytes"]

    def role_bytes(model, ft):
        from collections import namedtuple
        namedtuple("Dims", "h a")(model["d_model"], model["n_heads"])
        return inner(model, ft)
    ns["role_bytes"] = role_bytes
    assert all(r.status == "ok" for r in grade(ns).rows if r.function == "role_bytes")


# The review's cheat C: gpumem copied and every expression wrapped in an identity call defeats
# any fingerprint. The graded QLoRA setups are ones gpumem does not count (an NF4 block other than
# 64, double quantisation on or off), so such a copy is wrong, not refused.
def _nf4_held(n: int, block: int, double: bool) -> int:
    """Bytes bitsandbytes keeps beside an n-element weight's codes, read off real tensors (CPU)."""
    import torch
    import bitsandbytes.functional as bnbf
    _, s = bnbf.quantize_4bit(torch.ones(n, dtype=torch.bfloat16), blocksize=block,
                              compress_statistics=double, quant_type="nf4")
    held = [s.absmax, s.code] + ([s.offset, s.state2.absmax, s.state2.code] if double else [])
    return sum(t.numel() * t.element_size() for t in held)


@pytest.mark.parametrize("n", [96 * 1000, 64 * 256 * 3 + 1, 448 * 1088])
def test_grader_nf4_constants_match_bitsandbytes(n):
    for block in (32, 64, 128, 256, 512):
        for double in (True, False):
            assert lab_draw.nf4_constants(n, block, double) == _nf4_held(n, block, double), (n, block, double)


def test_library_is_wrong_on_every_drawn_qlora_setup():
    rng = random.Random(23)
    for _ in range(3):
        for model, cases in lab_draw.states_cases(rng):
            qlora = [(ft, want) for ft, want in cases if ft.base_dtype == "nf4"]
            assert len(qlora) == 2 and {ft.double_quant for ft, _ in qlora} == {True, False}
            for ft, want in qlora:
                assert ft.nf4_block != finetune.NF4_BLOCK
                assert finetune.finetune_states(lab_draw.config(model), ft) != want
                fields = {k: v for k, v in ft.__dict__.items() if k in finetune.Finetune.__dataclass_fields__}
                assert finetune.finetune_states(lab_draw.config(model), finetune.Finetune(**fields)) != want


_IDENTITY = '''
import ast, pathlib, sys
class Wrap(ast.NodeTransformer):
    def visit(self, node):
        node = super().visit(node)
        kinds = (ast.BinOp, ast.Call, ast.Compare, ast.BoolOp, ast.Dict, ast.Tuple, ast.Attribute, ast.Subscript, ast.List)
        if isinstance(node, kinds) and type(getattr(node, "ctx", ast.Load())) is ast.Load and not getattr(node, "_w", 0):
            call = ast.Call(func=ast.Name("_i_", ast.Load()), args=[node], keywords=[])
            call._w = 1
            return call
        return node
    def visit_Call(self, node):
        return node if isinstance(node.func, ast.Name) and node.func.id == "_i_" else self.generic_visit(node)
for p in pathlib.Path(sys.argv[1]).glob("*.py"):
    t = ast.parse(p.read_text())
    keep = (ast.Import, ast.ImportFrom)
    t.body = [s if isinstance(s, keep) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
              else Wrap().visit(s) for s in t.body]
    t.body.insert(1, ast.parse("_i_ = lambda v: v").body[0])
    ast.fix_missing_locations(t)
    p.write_text(ast.unparse(t))
'''


@pytest.fixture(scope="module")
def wrapped_copy(tmp_path_factory):
    """gpumem's memory layer copied and every expression wrapped in an identity call (cheat C)."""
    import shutil
    import subprocess
    import sys
    tmp = tmp_path_factory.mktemp("cheat_c")
    copy = tmp / "gpumem_copy"
    shutil.copytree(ROOT / "gpumem", copy, ignore=shutil.ignore_patterns("__pycache__", "chapters", "app*"))
    (tmp / "wrap.py").write_text(_IDENTITY)
    subprocess.run([sys.executable, str(tmp / "wrap.py"), str(copy / "memory")], check=True)
    return str(tmp)


_COPY_CELL = '''
import sys; sys.path.insert(0, _sys_path)
from gpumem_copy.memory import finetune as _f, models as _m
def library_bytes(model, ft):
    cfg = _m.ModelConfig(name="x", n_layers=model["n_layers"], d_model=model["d_model"], n_heads=model["n_heads"],
        n_kv_heads=model["n_kv_heads"], ffn=model["ffn"], vocab=model["vocab"], explicit_head_dim=model["head_dim"],
        tie_embeddings=model["tie_embeddings"])
    if _patch:
        _f.NF4_BLOCK = getattr(ft, "nf4_block", 64)
    return _f.finetune_states(cfg, _f.Finetune(**{k: v for k, v in ft.__dict__.items() if k in _f.Finetune.__dataclass_fields__}))
def choose_recipe(model, capacity, host_ram, seq, batch, ladder):
    usable = capacity - GiB - int(0.05 * capacity)
    for ft in ladder.values():
        for p in ("none", "full"):
            if ft.offload:
                need = base_on_cpu(model, ft, seq, batch, p)
                if need["gpu"] <= usable and need["host"] <= host_ram:
                    return ft, p
            elif sum(library_bytes(model, ft).values()) + activation_peak(model, ft, seq, batch, p) <= usable:
                return ft, p
'''


def _grade_with_copy(ns: dict, sys_path: str, patch: bool):
    """Cheat C graded as if the copy's files were cells: the origin rule (lab_guard.allowed) refuses
    a copy in files of its own, which test_code_from_a_string_or_a_file_is_refused checks; these
    tests check the second line of defence, the drawn setups gpumem does not count."""
    import os
    import pathlib
    import sys
    ns.update(_sys_path=sys_path, _patch=patch)
    exec(compile(_COPY_CELL, "<cheat cell>", "exec"), ns)
    before = os.environ["GPUMEM_TEST_CELLS"]
    os.environ["GPUMEM_TEST_CELLS"] = os.pathsep.join([before, *map(str, pathlib.Path(sys_path).rglob("*.py"))])
    try:
        return grade(ns)
    finally:
        os.environ["GPUMEM_TEST_CELLS"] = before
        sys.modules.pop("gpumem_copy", None)
        for name in [m for m in sys.modules if m.startswith("gpumem_copy.")]:
            sys.modules.pop(name)


@pytest.mark.parametrize("patch_block", [False, True])
def test_identity_wrapped_copy_of_gpumem_is_wrong(wrapped_copy, patch_block):
    """Cheat C, as the reviewer ran it (8/8 before): now every role_bytes row fails, on the drawn
    QLoRA setups. Patching the copy's NF4 block to the drawn one is not enough either: the setup
    without double quantisation keeps fp32 absmaxes, which the copy's formula has no place for."""
    ns = notebook_namespace(ROOT / "labs" / f"{LAB}.ipynb")
    exec("def role_bytes(model, ft):\n    return library_bytes(model, ft)", ns)
    report = _grade_with_copy(ns, wrapped_copy, patch_block)
    rows = [r for r in report.rows if r.function == "role_bytes"]
    assert not report.solved and len(rows) == 3
    for row in rows:
        assert row.status == "wrong" and "QLoRA" in row.detail, row.detail
        assert ("quant_constants" in row.detail or "dequant_buffer" in row.detail), row.detail


@pytest.mark.parametrize("patch_block", [True])
def test_a_copy_of_the_librarys_chooser_is_wrong(wrapped_copy, patch_block):
    """The review's point on choose_recipe (5/5 with a copy of gpumem's counts before): each case
    has its own ladder, whose qlora rung carries a drawn NF4 block and double-quantisation choice,
    and the None case's rung keeps fp32 absmaxes where gpumem's count (block 64, double quantised)
    would fit it. A correct role_bytes beside a chooser that sums the library's (rewritten) counts,
    its NF4 block even patched to the rung's, fails that row, and the row names the NF4 choice it
    did not count."""
    ns = solution()
    report = _grade_with_copy(ns, wrapped_copy, patch_block)
    assert all(r.status == "ok" for r in report.rows if r.function == "role_bytes"), report.summary()
    wrong = [r for r in report.rows if r.function == "choose_recipe" and r.status != "ok"]
    assert wrong and not report.solved, report.summary()
    for row in wrong:
        assert row.detail.startswith("qlora with every layer checkpointed needs") and "over" in row.detail, row.detail
        assert "(no double quantisation)" in row.detail and "count its quant_constants" in row.detail, row.detail


def test_an_untied_head_everywhere_fails_on_the_tied_model():
    """Every check draws a tied model (the second), and its case label says so."""
    ns = solution()
    right = ns["role_bytes"]
    ns["role_bytes"] = lambda model, ft: right({**model, "tie_embeddings": False}, ft)
    for seed in (0, 1, 2):
        row = first_problem(grade(ns, seed), "role_bytes")
        assert " tied" in row.case and "V=" in row.case and "base_weights" in row.detail


def test_moments_always_fp32_fails_on_bf16_adapters():
    """torch AdamW keeps m and v in the adapters' dtype: bf16 adapters, bf16 moments."""
    ns = solution()
    right = ns["role_bytes"]

    def fp32_moments(model, ft):
        got = right(model, ft)
        if ft.lora and ft.optimizer == "adamw" and ft.adapter_dtype == "bf16":
            got["optimizer_moments"] *= 2
        return got
    ns["role_bytes"] = fp32_moments
    for seed in (0, 1):
        row = first_problem(grade(ns, seed), "role_bytes")
        assert "bf16 adapters" in row.detail and "optimizer_moments" in row.detail


def test_small_errors_are_given_in_bytes():
    ns = solution()
    right = ns["role_bytes"]
    ns["role_bytes"] = lambda model, ft: {**right(model, ft), "grads": right(model, ft)["grads"] + 4096}
    row = first_problem(grade(ns), "role_bytes")
    assert "off by +4,096 B" in row.detail and "x the right count" not in row.detail


def test_a_missing_reserve_is_named_not_the_nf4_constants():
    """A chooser that compares against the whole capacity: where its rung fits the reported bytes
    but not the usable ones, the row names the reserve first; the NF4 note comes after it, only
    where gpumem's own count of the qlora rung would fit (review r10: it used to come alone)."""
    ns = solution()
    ns["choose_recipe"] = walk(ns, lambda capacity: capacity)
    details = []
    for seed in range(4):
        details += [r.detail for r in grade(ns, seed).rows if r.function == "choose_recipe" and r.status != "ok"]
    assert details
    reserve = [d for d in details if "reserve" in d]
    assert reserve and all(d.find("quant_constants") == -1 or d.index("reserve") < d.index("quant_constants")
                           for d in reserve), reserve



@pytest.mark.parametrize("policy", ["none", "full"])
def test_one_policy_for_every_rung_fails(policy):
    """The configuration is graded: a chooser that always checkpoints (the safe habit) or never
    does fails the cases whose answer has the other policy, every draw having both; the row says
    the rung fits without checkpointing, or by how much it is over without it."""
    ns = solution()
    ns["choose_recipe"] = walk(ns, policies=(policy,))
    for seed in (0, 1):
        row = first_problem(grade(ns, seed), "choose_recipe")
        if policy == "full":
            assert "fits without checkpointing too" in row.detail or "earlier rung" in row.detail, row.detail
        else:
            assert "fits" in row.detail, row.detail


def test_cheapest_setup_fails():
    """The fewest bytes (QLoRA, checkpointed) is not the answer: faithfulness comes first."""
    ns = solution()
    ns["choose_recipe"] = lambda model, capacity, host_ram, seq, batch, ladder: (ladder["qlora"], "full")
    details = [r.detail for r in grade(ns).rows if r.function == "choose_recipe" and r.status != "ok"]
    assert len(details) >= 3 and any("earlier rung of the ladder fits too" in d for d in details), details


def test_an_answer_equal_to_everything_fails():
    """Review r9's lying values, on lab 08: a Finetune subclass whose == is always True was compared
    by its own method after the guard (the grader's ``got == right``); the answer is now rebuilt as
    the course's own class inside the guard, and an object of any other type is refused by name."""
    from gpumem.memory.finetune import Finetune

    class Yes(Finetune):
        def __eq__(self, other):
            return True
        __hash__ = Finetune.__hash__

    class Always:
        def __eq__(self, other):
            return True
    ns = solution()
    ns["choose_recipe"] = lambda model, capacity, host_ram, seq, batch, ladder: (Yes(), "full")
    details = [r.detail for r in grade(ns).rows if r.function == "choose_recipe" and r.status != "ok"]
    assert len(details) >= 4 and all("is not a rung of this case's ladder" in d or "fits" in d or "over" in d
                                     for d in details), details
    ns["choose_recipe"] = lambda model, capacity, host_ram, seq, batch, ladder: Always()
    assert "return plain values" in first_problem(grade(ns), "choose_recipe").detail


def test_a_process_started_before_the_check_is_refused():
    """Review r9 (labs 05 and 06, 11/13 and 11/11): a helper process started by the learner's cells
    before the check answered through a pipe, with no guard in it. Now any live child process of
    the kernel (multiprocessing's own helpers aside) refuses each graded call, by name."""
    import subprocess
    import sys
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        row = first_problem(grade(solution()), "role_bytes")
        assert "a process your cells started is running" in row.detail and str(helper.pid) in row.detail
    finally:
        helper.kill()
        helper.wait()
    assert grade(solution()).solved


@pytest.mark.parametrize("usable", ["capacity - int(0.05 * capacity)", "capacity - 2 * GiB",
                                    "capacity - GiB", "capacity - 10**9 - int(0.05 * capacity)"])
def test_a_reserve_left_out_fails_every_draw(usable):
    """Review r10 (12 and 13 of 20 draws passed): every check has a 'gib' case where the setup
    before the answer misses the usable bytes by less than 2^30 - 10^9 B (review r22: 1 GB read for
    1 GiB passed 7 of 40 draws when that case was a 'context' one, within 1 GiB), and a 'share' case
    (40 GB and up) where it misses by less than 5 % of capacity less 1 GiB. The solution's chooser
    with the CUDA context left out, a flat 2 GiB reserve, the 5 % left out, or 1 GB for 1 GiB fails
    each of five draws, and the row points at the reserve, not at the NF4 count its role_bytes got right."""
    import json
    ns = solution()
    cells = json.loads((ROOT / "solutions" / f"{LAB}.ipynb").read_text())["cells"]
    source = next("".join(c["source"]) for c in cells if "def choose_recipe" in "".join(c["source"]))
    assert "capacity - GiB - int(0.05 * capacity)" in source
    ns.update(_cell_function(source.replace("capacity - GiB - int(0.05 * capacity)", usable), "choose_recipe"))
    for seed in range(5):
        report = grade(ns, seed)
        wrong = [r for r in report.rows if r.status != "ok"]
        assert wrong and all(r.function == "choose_recipe" for r in wrong), (seed, report.summary())
        assert all("the card reports" in r.detail or "of the card's" in r.detail     # a reserve too small, or
                   or "a reserve larger than" in r.detail for r in wrong), (seed, wrong)  # 2 GiB > a T4's reserve


def _dequant_by_hand(model: dict, ft) -> int:
    """QLoRA's dequantised matrix: the largest projection in bf16, and with 8-bit absmaxes their fp32
    rebuild (one per nf4_block weights): bitsandbytes' dequantize_4bit."""
    h, F = model["d_model"], model["ffn"]
    big = max(h * F, h * model["n_heads"] * model["head_dim"])
    return 2 * big + (4 * -(-big // ft.nf4_block) if ft.double_quant else 0)


def test_tight_cases_by_hand():
    """Each check's two tight cases, by hand from the grader's own figures: the setup before the
    answer is over the usable bytes (capacity - 2^30 - 5 % of capacity, rounded down) by at most
    the kind's window, on the kind's cards."""
    from gpumem.memory import gpus
    for seed in range(4):
        cases = lab_cases.choose_cases(random.Random(seed))
        kinds = set()
        for want, card, host_ram, model, seq, batch, figures, rungs in cases:
            if want is None or want == lab_draw.SETUPS[0]:
                continue
            cap = gpus.get(card).capacity
            usable = cap - 2 ** 30 - int(0.05 * cap)
            before = lab_draw.SETUPS[lab_draw.SETUPS.index(want) - 1]
            over = lab_draw.total(figures, before) - usable
            if 0 < over <= 2 ** 30 - 10 ** 9:
                kinds.add("gib")
            if card not in ("t4", "l4") and 0 < over <= int(0.05 * cap) - 2 ** 30:
                kinds.add("share")
            if before == ("qlora", "full") and 0 < over <= _dequant_by_hand(model, rungs["qlora"]):
                kinds.add("buffer")
        assert kinds == {"gib", "share", "buffer"}, (seed, kinds)


def _cell_function(source: str, name: str, i: int = 90):
    """``name`` from ``source`` run as a notebook cell (as tests/test_labs.py names cells)."""
    import linecache
    ns = solution()
    filename = f"<{LAB}.ipynb cell {i}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), ns)
    return ns


def test_code_from_a_string_or_a_file_is_refused(tmp_path):
    """Review r10 cheat S2 (8/8 on 11 of 11 draws): the library rewritten by a generic AST pass (every
    a + b an operator call) escapes a content match, but not the origin rule: while graded only code
    of notebook cells and of installed files runs. Here the solution's own role_bytes, rewritten by
    the same kind of pass and compiled from a string, and then loaded from a module file the
    learner wrote, are refused by name; the solution itself, as cells, passes."""
    import ast
    import json
    import operator
    import sys
    cells = json.loads((ROOT / "solutions" / f"{LAB}.ipynb").read_text())["cells"]
    source = next("".join(c["source"]) for c in cells if "def role_bytes" in "".join(c["source"]))

    class Calls(ast.NodeTransformer):
        def visit_BinOp(self, node):
            self.generic_visit(node)
            name = {ast.Add: "add", ast.Mult: "mul", ast.FloorDiv: "floordiv", ast.Sub: "sub"}.get(type(node.op))
            return ast.Call(ast.Attribute(ast.Name("_op", ast.Load()), name, ast.Load()), [node.left, node.right], []) \
                if name else node
    tree = ast.fix_missing_locations(Calls().visit(ast.parse(source)))
    ns = solution()
    ns["_op"] = operator
    exec(compile(tree, "<mine>", "exec"), ns)
    rows = [r for r in grade(ns, 3).rows if r.function == "role_bytes"]
    assert rows and all(r.status == "error" and "role_bytes from <mine>" in r.detail
                        and "neither a notebook cell nor an installed library" in r.detail for r in rows), rows
    (tmp_path / "my_counts.py").write_text("from gpumem.memory.finetune import ROLES, Finetune\n" + source)
    sys.path.insert(0, str(tmp_path))
    try:
        import my_counts
        ns = solution()
        ns["role_bytes"] = my_counts.role_bytes
        rows = [r for r in grade(ns, 3).rows if r.function == "role_bytes"]
        assert rows and all(r.status == "error" and "my_counts.py" in r.detail for r in rows), rows
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("my_counts", None)
    ns = _cell_function("from dataclasses import dataclass\n@dataclass\nclass Box:\n    n: int\n"
                        "_rb = role_bytes\ndef role_bytes(model, ft):\n    return _rb(model, Box(1) and ft)\n", "role_bytes")
    assert all(r.status == "ok" for r in grade(ns, 3).rows), "a cell's own dataclass is a cell's code"


def test_cells_under_a_symlinked_temporary_folder_are_cells(tmp_path):
    """Review r11: ipykernel names a cell tempfile.gettempdir()/ipykernel_<pid>/<n>.py without
    resolving the folder; on macOS that folder is behind a symlink, and matching the resolved form
    alone refused the solution's cells (0/8). With TMPDIR a symlink, both forms are a cell's name."""
    import subprocess
    import sys
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    code = ("import os, tempfile; from gpumem.chapters.ch08_finetuning import lab_guard as g; "
            "t = tempfile.gettempdir(); print(bool(g._CELL.fullmatch(os.path.join(t, 'ipykernel_12', '34.py'))), "
            "bool(g._CELL.fullmatch(os.path.join(os.path.realpath(t), 'ipykernel_12', '34.py'))), "
            "bool(g._CELL.fullmatch(os.path.join(t, 'mine', '34.py'))))")
    out = subprocess.run([sys.executable, "-c", code], env={**__import__("os").environ, "TMPDIR": str(tmp_path / "link")},
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout.split()
    assert out == ["True", "True", "False"], out


# Issues 21 and 23 (review r11 defects 3 and 4, r10 #9): the activations are the learner's to count,
# the frozen base can go to the CPU, and a chooser that skips role_bytes' count fails.
def _lora_acts_skipping(piece: str):
    """The solution's activation_peak with one of chapter 08's pieces left out, by hand."""
    ns = solution()
    right = ns["activation_peak"]

    def activation_peak(model, ft, seq, batch, policy, dropout=0.0):
        if not ft.lora or dropout:
            return right(model, ft, seq, batch, policy, dropout)
        h, F, L, V, T = model["d_model"], model["ffn"], model["n_layers"], model["vocab"], seq * batch
        q = model["n_heads"] * model["head_dim"]
        if piece == "base":          # "the frozen base saves nothing": only the adapters' inputs and A outputs
            if policy == "full":
                return right(model, ft, seq, batch, policy)
            return L * T * (2 * (3 * h + q + 2 * h + F) + 14 * ft.lora_rank) + 10 * T * V + 8
        if piece == "copies":        # every adapter input shared, as on a 4-bit base
            return right(model, lab_draw.LabFinetune(**{**ft.__dict__, "base_dtype": "nf4"}), seq, batch, policy)
        k = model["n_kv_heads"] * model["head_dim"]      # "casts": fp32 adapters' bf16 casts left out
        casts = 2 * L * ft.lora_rank * (2 * (h + q) + 2 * (h + k) + 3 * (h + F)) if ft.adapter_dtype == "fp32" else 0
        return right(model, ft, seq, batch, policy) - casts
    ns["activation_peak"] = activation_peak
    return ns


@pytest.mark.parametrize("piece, said", [
    ("base", "the frozen base's activations are still saved"),
    ("copies", "your adapted projections' saved inputs are short"),     # review r28 #2: not "three copies"
    ("casts", "missing: the adapters' bf16 casts")])
def test_activations_that_skip_a_piece_fail(piece, said):
    """The chapter's two warnings and its casts, each left out of an otherwise right count: an
    activation_peak row fails, naming the piece (the peaks are the engine's; the pieces by hand)."""
    ns = _lora_acts_skipping(piece)
    for seed in (0, 1):
        row = first_problem(grade(ns, seed), "activation_peak")
        assert "LoRA r=" in row.detail and said in row.detail, (seed, row.detail)
        assert "three copies" not in row.detail and "o its own" not in row.detail, row.detail   # review r28 #2


def test_llama3_8b_activations_by_hand():
    """Llama-3-8B, 2,048 tokens, LoRA r16 with fp32 adapters, no checkpointing, counted from the
    chapter's pieces written out here (bytes per token of one layer), against the solution."""
    h, F, V, L, T, r = 4096, 14336, 128256, 32, 2048, 16
    q, k = 4096, 1024
    layer = (2 * (2 * h + 4) + 2 * (q + 2 * k) + 2 * q + 4 * 32 + 6 * F          # norms, core, gate/silu/up
             + 2 * (5 * h + q + F) + 7 * 2 * r)                                   # 7 input copies, A outputs
    casts = 2 * L * r * (2 * (h + q) + 2 * (h + k) + 3 * (h + F))
    want = T * (L * layer - (2 * h + 4)) + 4 * T * 128 + T * (2 * h + 4) + 10 * T * V + 8 + casts
    got = solution()["activation_peak"](LLAMA3_8B, lab_draw.LADDER["lora"], T, 1, "none")
    assert got == want == finetune.finetune_activation_bytes(lab_draw.config(LLAMA3_8B), lab_draw.LADDER["lora"],
                                                             T, 1)["peak"]


def test_base_on_cpu_by_hand_and_the_chapters():
    """Llama-3-70B QLoRA r16 at the paper's NF4 choice, its base on the CPU: PCIe and the GPU's
    weights by hand (codes, norms, fp32 adapters of a block), beside chapter 08's base_offloaded."""
    from gpumem.chapters.ch08_finetuning import scale
    from gpumem.memory import models
    m = {"n_layers": 80, "d_model": 8192, "n_heads": 64, "n_kv_heads": 8, "head_dim": 128, "ffn": 28672,
         "vocab": 128256, "tie_embeddings": False}
    h, F, r = 8192, 28672, 16
    block = (2 * h * h + 2 * h * 1024 + 3 * h * F) // 2 + 2 * 2 * h + 4 * r * (2 * 2 * h + 2 * (h + 1024) + 3 * (h + F))
    got = solution()["base_on_cpu"](m, lab_draw.LADDER["qlora-cpu"], 2048, 1, "full")
    ch = scale.base_offloaded(models.get("llama-3-70b"), lab_draw.LADDER["qlora"], "full", 2048, 1)
    root = 2 * (2 * 128256 * h + h)
    assert got["pcie"] == 2 * 80 * block + root == ch["passes"] * ch["streamed"] + ch["root"] == ch["copied"]
    assert (got["gpu"], got["host"]) == (ch["gpu"], ch["host"])
    assert ch["root"] == 2 * (2 * 128256 * h + h)                 # embedding, head, final norm in bf16


@pytest.mark.parametrize("cheat, key, said", [
    ("gpu", "gpu", "the GPU holds more than the activations while the base is on the CPU: what else must be there?"),
    ("once", "pcie", "how many times does a block's copy cross in one step"),       # review r33 #4: questions
    ("no root", "pcie", "what does FSDP gather besides the blocks"),
    ("host", "host", "which roles are FSDP parameters?")])       # review r31 #1: a question, not the rule
def test_base_on_cpu_that_skips_a_piece_fails(cheat, key, said):
    ns = solution()
    right, roles, acts = ns["base_on_cpu"], ns["role_bytes"], ns["activation_peak"]

    def base_on_cpu(model, ft, seq, batch, policy):
        got = right(model, ft, seq, batch, policy)
        if cheat == "gpu":          # only the activations stay: root, blocks, constants forgotten
            return {**got, "gpu": acts(model, ft, seq, batch, policy)}
        root = 2 * (model["vocab"] * model["d_model"] * (1 if model["tie_embeddings"] else 2) + model["d_model"])
        if cheat == "once":
            return {**got, "pcie": (got["pcie"] - root) // 2 + root}
        if cheat == "no root":
            return {**got, "pcie": got["pcie"] - root}
        return {**got, "host": sum(roles(model, ft).values())}
    ns["base_on_cpu"] = base_on_cpu
    row = first_problem(grade(ns, 2), "base_on_cpu")
    assert f", {key}: " in row.detail and said in row.detail and "base on the CPU" in row.detail, row.detail


@pytest.mark.parametrize("cheat", ["no host", "no offload rung", "no gpu check"])
def test_a_chooser_that_skips_the_host_or_the_cpu_rung_fails(cheat):
    """Every draw has a case only the base on the CPU fits, and a None case whose host cannot hold
    it: a chooser that never checks the host's RAM, or stops at QLoRA on the GPU, fails, told so."""
    ns = solution()
    right = ns["choose_recipe"]

    def choose_recipe(model, capacity, host_ram, seq, batch, ladder):
        if cheat == "no host":
            return right(model, capacity, 10**15, seq, batch, ladder)
        if cheat == "no gpu check":     # the base on the CPU taken as soon as the host holds it
            usable = capacity - 2**30 - int(0.05 * capacity)
            for ft in ladder.values():
                for p in ("none", "full"):
                    if ft.offload and ns["base_on_cpu"](model, ft, seq, batch, p)["host"] <= host_ram:
                        return ft, p
                    if not ft.offload and sum(ns["role_bytes"](model, ft).values()) + ns["activation_peak"](
                            model, ft, seq, batch, p) <= usable:
                        return ft, p
            return None
        return right(model, capacity, host_ram, seq, batch, {k: v for k, v in ladder.items() if not v.offload})
    ns["choose_recipe"] = choose_recipe
    for seed in (0, 1):
        wrong = [r.detail for r in grade(ns, seed).rows if r.function == "choose_recipe" and r.status != "ok"]
        said = {"no host": "fits the GPU, but the host must hold", "no offload rung": "qlora-cpu (base on the CPU)",
                "no gpu check": "the GPU still holds base_on_cpu's gpu bytes"}[cheat]
        assert wrong and any(said in d for d in wrong), wrong


def test_a_rough_per_parameter_chooser_fails_most_draws():
    """Review r11 defect 3 (7/8 on 6 of 6 seeds, 4 of 5 choose rows): textbook bytes per parameter
    (16 / 10.03 / 2 + 16 per adapter element / QLoRA's 0.5159), no role_bytes, with the right
    activations, reserve and base-on-CPU counts. Now two or more choose rows fail on each draw,
    each naming what the count skipped (the NF4 choice, or role_bytes' own count)."""
    ns = solution()
    acts, cpu = ns["activation_peak"], ns["base_on_cpu"]

    def states(model, ft):
        h, F, L = model["d_model"], model["ffn"], model["n_layers"]
        q, k = model["n_heads"] * model["head_dim"], model["n_kv_heads"] * model["head_dim"]
        lin = L * (2 * h * q + 2 * h * k + 3 * h * F)
        n = lin + model["vocab"] * h * (1 if model["tie_embeddings"] else 2)
        n_a = L * ft.lora_rank * ((h + q) * 2 + (h + k) * 2 + (h + F) * 3)
        if not ft.lora:
            return 16 * n if ft.optimizer == "adamw" else 10.03 * n
        return (2 * n if ft.base_dtype == "bf16" else 0.5159 * lin + 2 * (n - lin)) + 16 * n_a
    ns["choose_recipe"] = walk(ns, states=states)
    assert acts and cpu
    for seed in (0, 1, 2):
        wrong = [r.detail for r in grade(ns, seed).rows if r.function == "choose_recipe" and r.status != "ok"]
        assert len(wrong) >= 2, (seed, wrong)
        assert all("quant_constants" in d or "role_bytes counts them right" in d or "dequant_buffer" in d
                   for d in wrong), (seed, wrong)


def test_the_depth_search_is_the_engines_count():
    """lab_draw.in_depth (the cases' search) extrapolates from two depths: it equals totals, the
    engine's and truth's bytes, at every depth tried, so the drawn answers are the engine's."""
    rng = random.Random(11)
    for _ in range(4):
        model, seq, batch = lab_draw.draw_model(rng, wide=True), rng.choice(lab_draw.SEQS), rng.choice((1, 4))
        rungs = lab_draw.ladder(*rng.choice(lab_draw.NF4_CHOICES))
        fig = lab_draw.in_depth(model, seq, batch, rungs)
        for depth in (2, 9, 80, 160):
            assert fig(depth) == lab_draw.totals(dict(model, n_layers=depth), seq, batch, rungs)


def test_a_reserve_too_large_fails():
    """Review r11 minor (a reserve 0.5 GiB too large passed 9 of 10 draws): every check has a case
    whose answer fits by less than a quarter GiB (capacity - 2^30 - 5 %, by hand), so the solution's
    chooser with 1.5 GiB of context fails, and the row says the answer fits by that little."""
    from gpumem.memory import gpus
    for seed in (0, 1):
        near = [c for c in lab_cases.choose_cases(random.Random(seed)) if c[0] is not None]
        gaps = [gpus.get(card).capacity - 2**30 - int(0.05 * gpus.get(card).capacity) - lab_draw.total(figures, want)
                for want, card, host_ram, model, seq, batch, figures, rungs in near]
        assert any(0 <= g <= 2**28 for g in gaps), (seed, gaps)
    ns = solution()
    ns["choose_recipe"] = walk(ns, lambda capacity: capacity - int(1.5 * 2**30) - int(0.05 * capacity))
    for seed in (0, 1):
        wrong = [r.detail for r in grade(ns, seed).rows if r.function == "choose_recipe" and r.status != "ok"]
        assert wrong and any("a reserve larger than 1 GiB + 5 % of capacity misses it" in d for d in wrong), wrong


def test_every_check_has_a_peak_set_by_the_re_run():
    """Review r12 #2: with a large vocabulary the loss's logits set a checkpointed peak, so a count
    that forgets the last layer's re-run passed 155 of 200 checks; now each check has a checkpointed
    case whose re-run sets the peak, and that count fails it, the re-run named."""
    for seed in range(40):
        model, seq, batch, setups = lab_acts.acts_cases(random.Random(seed))[-1]
        assert [ft.lora for ft, *_ in setups] == [False, True], setups     # full fine-tuning too (review r14 5.2)
        for ft, policy, dropout, parts in setups:
            assert policy == "full" and parts["peak"] == parts["recompute_peak"] > parts["forward_peak"]
    ns = solution()
    right = ns["activation_peak"]

    def activation_peak(model, ft, seq, batch, policy, dropout=0.0):     # the forward's end only (review r12's slip)
        if policy == "none":
            return right(model, ft, seq, batch, policy, dropout)
        h, L, V, T = model["d_model"], model["n_layers"], model["vocab"], seq * batch
        outside = 4 * seq * model["head_dim"] + T * (2 * h + 4 + (0 if ft.lora else 2 * h))
        casts = 0
        if ft.lora and ft.adapter_dtype == "fp32":
            q, k, F = model["n_heads"] * model["head_dim"], model["n_kv_heads"] * model["head_dim"], model["ffn"]
            casts = 2 * L * ft.lora_rank * (2 * (h + q) + 2 * (h + k) + 3 * (h + F))
        return L * 2 * T * h + outside + 10 * T * V + 8 + casts
    ns["activation_peak"] = activation_peak
    row = first_problem(grade(ns, 0), "activation_peak")
    assert "checkpointed" in row.detail and "re-run" in row.detail, row.detail
    assert "RoPE's tables" not in row.detail and "loss scalars" not in row.detail, row.detail   # review r28 #2


@pytest.mark.parametrize("how", ["pool", "raw"])
def test_a_thread_started_before_the_check_cannot_run_the_truth(how):
    """Review r12 #1: a worker started before the check (its stack all gpumem's and the standard
    library's, so not a learner's thread), or a raw _thread saved before the check, ran the grader's
    truth for every function: 14/14 from the blank lab. The blocked functions now refuse in every
    thread while a call is graded (their code is swapped for a refusing stub, then restored)."""
    import _thread
    import concurrent.futures.thread as cft
    import queue
    import sys
    import threading
    import weakref
    from gpumem.course import grading
    from gpumem.memory.finetune import finetune_activation_bytes
    ns = solution()
    start = _thread.start_new_thread
    pool = cft.ThreadPoolExecutor(max_workers=1)
    if how == "pool":          # the review's disguise: the worker's stack starts in gpumem's own code
        out, err = sys.stdout, sys.stderr
        worker = threading.Thread(target=grading.call, daemon=True,
                                  args=(cft._worker, weakref.ref(pool), pool._work_queue, None, ()))
        worker.start()
        pool._threads.add(worker)
        pool.submit(int).result()                  # the worker runs before the check
        sys.stdout, sys.stderr = out, err

    def run(f, *args):
        if how == "pool":
            return pool.submit(f, *args).result()
        out = queue.Queue()
        start(lambda: out.put(_call(f, *args)), ())
        got = out.get(timeout=30)
        if isinstance(got, BaseException):
            raise got
        return got

    ns["role_bytes"] = lambda model, ft: run(lab_draw.truth, lab_draw.config(model), ft)
    ns["activation_peak"] = lambda model, ft, seq, batch, policy, dropout=0.0: run(
        finetune_activation_bytes, lab_draw.config(model), ft, seq, batch, "flash", policy)["peak"]
    row = first_problem(grade(ns, 5), "role_bytes")
    assert "from a thread the grader does not watch" in row.detail and "lab_draw.truth" in row.detail, row.detail
    assert lab_draw.truth.__code__.co_name == "truth"          # restored after the call
    pool.shutdown()


def _call(f, *args):
    try:
        return f(*args)
    except BaseException as e:          # handed back to the graded call
        return e


def test_a_row_keeps_its_whole_hint():
    """Review r12 #4: rows were cut at 300 characters, inside the hint (the setup alone takes ~110);
    lab 08's rows now keep 700: a dequantised buffer without the fp32 absmax rebuild is told the whole
    rule."""
    ns = solution()
    right = ns["role_bytes"]

    def role_bytes(model, ft):
        r = right(model, ft)
        if ft.base_dtype == "nf4":           # the largest matrix in bf16, the absmaxes forgotten
            h, F = model["d_model"], model["ffn"]
            q, k = model["n_heads"] * model["head_dim"], model["n_kv_heads"] * model["head_dim"]
            r["dequant_buffer"] = 2 * max(h * q, h * k, q * h, h * F)
        return r
    ns["role_bytes"] = role_bytes
    row = first_problem(grade(ns, 7), "role_bytes")
    assert row.detail.endswith("fp32 ones are used as they are") and " B (-" in row.detail, row.detail
    rows = [r.detail for r in grade(_acts_cheat("ignored"), 7).rows if "lora_dropout is" in r.detail]
    assert rows and all(len(d) > 300 and d.endswith("count those, not the input") for d in rows), rows


# Review r12 #5: part 2's prompt gives rules and a trace, not the terms; lora_dropout, which the
# prompt does not count, is drawn in every check, and its truth is checked against peft itself.
TRACED = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24, "vocab_size": 256,
          "hidden_act": "silu", "max_position_embeddings": 64, "tie_word_embeddings": False}


def _layer_bytes(rows, i: int) -> int:
    """Bytes autograd saved in layer i, a dropout's saved tensor counted as CUDA's bool mask (1 B an
    element): on a CPU F.dropout saves a noise tensor in its input's dtype instead."""
    import math
    return sum(math.prod(shape) if role == "dropout" else b
               for module, role, shape, dtype, b, op in rows if f".layers.{i}." in module)


@pytest.mark.parametrize("dtype, targets", [("fp32", finetune.FT_TARGETS), ("bf16", finetune.FT_TARGETS),
                                            ("bf16", ("o", "down")), ("fp32", ("k", "up"))])
def test_dropout_bytes_are_a_real_traces(dtype, targets):
    """What lora_dropout adds to layer 0 and to a later layer, from peft's model run on the CPU
    (lora_trace.saved_by_role: saved_tensors_hooks on transformers' Llama) with the dropout at 0.1
    and at 0, against the grader's :func:`lab_acts.dropout_saves` (a bf16 base: peft casts alike
    on a CPU and a GPU; only the mask's size differs, converted above)."""
    from gpumem.memory import lora_trace
    model = {"n_layers": 2, "d_model": 64, "n_heads": 4, "n_kv_heads": 2, "head_dim": 24, "ffn": 160,
             "vocab": 256, "tie_embeddings": False}
    ft = lab_draw.LabFinetune(adapter="lora", lora_rank=8, adapter_dtype=dtype, lora_targets=targets)
    rows = {p: lora_trace.saved_by_role(TRACED, ft, 40, 1, layers=2, dropout=p)[0] for p in (0.0, 0.1)}
    assert any(r[1] == "dropout" for r in rows[0.1]) and not any(r[1] == "dropout" for r in rows[0.0])
    for i in (0, 1):
        traced = _layer_bytes(rows[0.1], i) - _layer_bytes(rows[0.0], i)
        assert traced == lab_acts.dropout_saves(lab_draw.config(model), ft, 40, 1, i > 0)[0], (i, traced)


def test_dropout_is_chapter_08s_and_in_every_check():
    """The re-run layer's bytes at bf16 adapters are chapter 08's scale.dropout_extra, (14h + F) a token
    by hand (each adapter: a 2-byte copy and a 1-byte mask, 18h + 3F, for the shared 2h, 2h and
    2F); each check draws one adapter setup with dropout per model: without checkpointing on the
    three models, checkpointed on the fourth, whose peak is the re-run."""
    from gpumem.chapters.ch08_finetuning import scale
    from gpumem.memory import models
    cfg, ft = models.get("llama-3-8b"), lab_draw.LabFinetune(adapter="lora", adapter_dtype="bf16")
    assert lab_acts.dropout_saves(cfg, ft, 2048, 1, True)[0] == scale.dropout_extra(cfg, 2048, 1) \
        == (14 * 4096 + 14336) * 2048
    for seed in range(8):
        cases = lab_acts.acts_cases(random.Random(seed))
        assert len(cases) == 4
        for i, (model, seq, batch, setups) in enumerate(cases):
            drops = [(ft, p, parts) for ft, p, d, parts in setups if d]
            assert len(drops) == 1 and drops[0][0].lora and drops[0][2]["dropout"] > 0
            assert drops[0][1] == ("full" if i == 3 else "none")    # every layer's, or the re-run's
            assert i == 3 or [ft.adapter_dtype for ft, p, d, parts in setups[1:3]] == ["fp32", "bf16"]


def _acts_cheat(how: str):
    ns = solution()
    right = ns["activation_peak"]

    def activation_peak(model, ft, seq, batch, policy, dropout=0.0):
        got = right(model, ft, seq, batch, policy, 0.0 if how == "ignored" else dropout)
        if not (ft.lora and dropout) or how == "ignored":
            return got
        h, F, L, T = model["d_model"], model["ffn"], model["n_layers"], seq * batch
        q = model["n_heads"] * model["head_dim"]
        masks = T * (3 * h + q + 2 * h + F)                    # one layer's, by hand
        layers = L if policy == "none" else 1
        if how == "no masks":
            return got - layers * masks + (3 * h * T if policy == "none" else 0)
        if how == "cpu noise":                                  # the trace's fp32 noise read as the mask
            return got + 3 * (layers * masks - (3 * h * T if policy == "none" else 0))
        return got + (3 * h * T if policy == "none" else 0)     # "layer 0 masks": q, k, v's in layer 0 too
    ns["activation_peak"] = activation_peak
    return ns


@pytest.mark.parametrize("how, said", [
    ("ignored", "lora_dropout is"), ("no masks", "missing: the dropout masks"),
    ("cpu noise", "that is the CPU's dropout"), ("layer 0 masks", "layer 0's q, k and v")])
def test_a_count_that_skips_the_dropout_fails_every_check(how, said):
    """The cheapest part 2 that passes the old prompt (the dropout argument taken and ignored) and
    three slips in the dropout's count fail every check, the piece named; hand counts."""
    ns = _acts_cheat(how)
    for seed in range(2):
        report = grade(ns, seed)
        bad = [r for r in report.rows if r.function == "activation_peak" and r.status != "ok"]
        assert bad and "lora_dropout" in bad[0].detail, (seed, report.summary())
        if how != "layer 0 masks":        # checkpointed, layer 0 is not re-run: only the none policy shows it
            masks = "missing: the dropout masks"   # fp32 adapters on a bf16 base: dropout ignored = masks missing
            assert len(bad) >= 3 and all(said in r.detail or how == "ignored" and masks in r.detail
                                         for r in bad), (seed, [r.detail for r in bad])
        else:
            assert any(said in r.detail for r in bad), (seed, [r.detail for r in bad])


def test_the_old_transcribed_part_2_fails():
    """Review r12 #5's transcription: the part-2 solution the old prompt dictated term by term (five
    arguments, no dropout) gets no activation_peak row right."""
    ns = solution()
    right = ns["activation_peak"]
    ns["activation_peak"] = lambda model, ft, seq, batch, policy: right(model, ft, seq, batch, policy)
    rows = [r for r in grade(ns, 2).rows if r.function == "activation_peak"]
    assert rows and all(r.status != "ok" for r in rows), [r.detail for r in rows]


def test_a_second_import_of_the_library_cannot_run_the_truth():
    """Review r14 #1: a cell imported gpumem's modules a second time (sys.modules set aside, then
    restored), and each graded call ran that copy's truth in a raw thread: 15/15 from the blank lab,
    since the guard swapped only the functions it found in the loaded modules. The guard now finds
    every function with a blocked function's code (the collector, at the check's start), and a
    second import of a loaded module while graded is refused."""
    import _thread
    import queue
    import sys
    mine = [k for k in sys.modules if k == "gpumem" or k.startswith("gpumem.")]
    saved = {k: sys.modules.pop(k) for k in mine}
    try:
        import gpumem.chapters.ch08_finetuning.lab_draw as copy_draw
        fresh = {k: v for k, v in sys.modules.items() if k == "gpumem" or k.startswith("gpumem.")}
    finally:
        for k in [k for k in sys.modules if k == "gpumem" or k.startswith("gpumem.")]:
            del sys.modules[k]
        sys.modules.update(saved)
    assert copy_draw is not lab_draw and fresh
    start = _thread.start_new_thread

    def run(f):
        out = queue.Queue()
        start(lambda: out.put(_call(f)), ())
        got = out.get(timeout=60)
        if isinstance(got, BaseException):
            raise got
        return got
    ns = solution()
    ns["role_bytes"] = lambda model, ft: run(lambda: copy_draw.truth(copy_draw.config(model), ft))
    row = grade(ns, 5).rows[0]
    assert row.function == "role_bytes" and row.status == "error" and "lab_draw.truth" in row.detail, row
    # a copy imported while graded (the modules set aside inside the call) is refused at its import

    def fresh_inside(model, ft):
        saved = {k: sys.modules.pop(k) for k in [k for k in sys.modules if k.startswith("gpumem.chapters.ch08")]}
        try:
            import gpumem.chapters.ch08_finetuning.lab_draw as again
            return again.truth(again.config(model), ft)
        finally:
            sys.modules.update(saved)
    ns["role_bytes"] = fresh_inside
    row = grade(ns, 5).rows[0]
    assert row.status == "error" and "it imported a second copy of gpumem.chapters.ch08_finetuning" in row.detail, row


def _engine_call(name: str, model: dict, seq: int, batch: int, policy: str):
    """A learner's call into chapter 01's activation engine (review r14 #2's probe_acts: a
    ModelConfig built from the model dict, the engine or one of its building blocks called)."""
    from gpumem.memory import activations, models
    cfg = models.ModelConfig(name="x", n_layers=model["n_layers"], d_model=model["d_model"], n_heads=model["n_heads"],
                             n_kv_heads=model["n_kv_heads"], ffn=model["ffn"], vocab=model["vocab"],
                             explicit_head_dim=model["head_dim"], tie_embeddings=model["tie_embeddings"])
    if name == "activations":
        return activations.activations(cfg, seq, batch, "flash", policy).peak
    if name in ("layer_terms", "softmax_moment"):
        return getattr(activations, name)(cfg, seq, batch, "flash", 2)
    return getattr(activations, name)(cfg, seq, batch, 2)


@pytest.mark.parametrize("name", ["activations", "layer_terms", "softmax_moment", "outside_terms", "loss_terms"])
def test_chapter_01s_activation_engine_is_refused(name):
    """Review r14 #2: chapter 01's activations.activations ran while lab 08 was graded and is full
    fine-tuning's peak byte for byte (8,126,660,616 B at seed 3, both policies); finetune_acts builds
    the other setups from its *_terms. All refuse now, called directly under the guard and inside a
    graded activation_peak."""
    from gpumem.chapters.ch08_finetuning import lab_guard
    model = lab_draw.draw_model(random.Random(3))
    with pytest.raises(RuntimeError, match=rf"count it yourself.*gpumem\.memory\.activations\.{name}\b"):
        lab_guard.guarded(_engine_call)(name, model, 2048, 2, "full")
    assert _engine_call(name, model, 2048, 2, "full") is not None     # ungraded, the engine runs (restored)
    if name != "activations":
        return
    ns = solution()
    right = ns["activation_peak"]
    ns["activation_peak"] = lambda model, ft, seq, batch, policy, dropout=0.0: (
        right(model, ft, seq, batch, policy, dropout) if ft.lora else _engine_call(name, model, seq, batch, policy))
    row = first_problem(grade(ns, 3), "activation_peak")
    assert "count it yourself" in row.detail and "activations.activations" in row.detail, row.detail


def _forward_end(model: dict, ft, seq: int, batch: int) -> int:
    """Full fine-tuning's checkpointed forward's end by hand: each layer's bf16 input (2Th), RoPE's
    tables (4 seq hd), the fused final norm's input and 1/rms (2h + 4 a token), the trained head's
    input (2h), the loss's bf16 logits, their fp32 copy and the fp32 log-softmax (10 V a token) and
    its two fp32 scalars."""
    h, L, V, T = model["d_model"], model["n_layers"], model["vocab"], seq * batch
    return L * 2 * T * h + 4 * seq * model["head_dim"] + T * (2 * h + 4 + 2 * h) + 10 * T * V + 8


def test_full_fine_tunings_re_run_is_graded_every_check():
    """Review r14 minor 5.2: the fourth model's re-run bound only an adapter setup, so full fine-tuning
    counted at the forward's end (its re-run forgotten) passed whenever the drawn vocabulary was
    large. Now the fourth model has a full fine-tuning setup whose peak is the re-run, and that
    count fails every check, the setup and the re-run named."""
    ns = solution()
    right = ns["activation_peak"]

    def activation_peak(model, ft, seq, batch, policy, dropout=0.0):
        if ft.lora or policy == "none":
            return right(model, ft, seq, batch, policy, dropout)
        return _forward_end(model, ft, seq, batch)
    ns["activation_peak"] = activation_peak
    for seed in range(3):
        model, seq, batch, setups = lab_acts.acts_cases(random.Random(seed))[-1]
        full = setups[0][3]
        assert not setups[0][0].lora and _forward_end(model, setups[0][0], seq, batch) == full["forward_peak"] < full["peak"]
        row = first_problem(grade(ns, seed), "activation_peak")
        assert row.detail.startswith("full, ") and "that is the end of the forward" in row.detail, row.detail
        assert "RoPE's tables" not in row.detail and "inputs before it" not in row.detail, row.detail  # r28 #2


def test_a_hint_replaces_the_generic_clause():
    """Review r14 minor 5.1: a small difference with a known cause reads its bytes, then the cause,
    without the generic "a small term ... is off" first; one without a known cause keeps it. The
    slip: layer 0's q/k/v dropout masks counted (3 x T x h bytes more, by hand)."""
    from gpumem.chapters.ch08_finetuning.lab_text import off_by
    assert off_by(1_001, 1_000) == ("off by +1 B (+0.100 %): a small term (per tensor, per block, per token, "
                                    "a rounding up) is off")
    assert off_by(1_001, 1_000, "the loss") == "off by +1 B (+0.100 %) -- the loss"
    assert off_by(2_000, 1_000, "the loss") == "yours is 2x the right count (too high) -- the loss"
    rows = [r for r in grade(_acts_cheat("layer 0 masks"), 0).rows if r.function == "activation_peak" and r.status != "ok"]
    said = [r.detail for r in rows if "layer 0's q, k and v" in r.detail]
    assert said and all("a small term" not in d and " B (+" in d for d in said), [r.detail for r in rows]


def _not_4bit(model: dict) -> int:
    """Parameters of the model that bitsandbytes leaves in bf16 under QLoRA, counted on transformers'
    own Llama built on the meta device (no formula of the lab's): all but the decoder layers'
    nn.Linear weights (transformers keeps lm_head unquantised; tied weights counted once). The
    attention's shape only changes those Linears, so it is built with one head (transformers
    refuses some of the drawn head counts' widths)."""
    return _not_4bit_of(tuple(sorted(model.items())))


@functools.lru_cache(maxsize=None)
def _not_4bit_of(items: tuple) -> int:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    model = dict(items)
    cfg = LlamaConfig(hidden_size=model["d_model"], intermediate_size=model["ffn"], num_hidden_layers=model["n_layers"],
                      num_attention_heads=1, num_key_value_heads=1, head_dim=model["head_dim"],
                      vocab_size=model["vocab"], tie_word_embeddings=model["tie_embeddings"])
    with torch.device("meta"):
        llama = LlamaForCausalLM(cfg)
    quantised = sum(m.weight.numel() for name, m in llama.named_modules()
                    if isinstance(m, torch.nn.Linear) and ".layers." in name)
    return sum(p.numel() for p in llama.parameters()) - quantised


def test_prepare_model_for_kbit_training_is_named():
    """Review r15 #3: the slip part 1's prompt warns of, counting peft's prepare_model_for_kbit_training
    (what it casts to fp32: 2 B more for each parameter that is not 4-bit, counted on transformers'
    Llama), is named in role_bytes' rows (not the packed codes) and in base_on_cpu's host row;
    checkpointing every layer as prepare would, under the policy 'none', is named in activation_peak's
    row; and a LoRA (bf16 base) base_on_cpu row names no NF4 constants or dequantised matrix (r15 #4.1)."""
    ns = solution()
    states, acts, cpu = ns["role_bytes"], ns["activation_peak"], ns["base_on_cpu"]

    def role_bytes(model, ft):
        r = states(model, ft)
        if ft.base_dtype == "nf4":
            r["base_weights"] += 2 * _not_4bit(model)
        return r

    def activation_peak(model, ft, seq, batch, policy, dropout):
        return acts(model, ft, seq, batch, "full" if ft.base_dtype == "nf4" else policy, dropout)

    def base_on_cpu(model, ft, seq, batch, policy):           # the QLoRA setup's host with the cast
        r = cpu(model, ft, seq, batch, policy)
        return r | {"host": r["host"] + 2 * _not_4bit(model)} if ft.base_dtype == "nf4" else r

    def lora_gpu_off(model, ft, seq, batch, policy):          # the LoRA setup's GPU off by a term unknown
        r = cpu(model, ft, seq, batch, policy)
        return r if ft.base_dtype == "nf4" else r | {"gpu": r["gpu"] + 12_345}

    slips = dict(ns, role_bytes=role_bytes, activation_peak=activation_peak, base_on_cpu=base_on_cpu)
    for seed in (3, 11):
        rows = grade(slips, seed).rows
        said = {f: [r.detail for r in rows if r.function == f and r.status != "ok"]
                for f in ("role_bytes", "activation_peak", "base_on_cpu")}
        assert len(said["role_bytes"]) == 3 and all(
            "QLoRA" in d and "you counted peft's prepare_model_for_kbit_training: its fp32 cast" in d
            and "packed codes" not in d for d in said["role_bytes"]), said["role_bytes"]
        assert said["activation_peak"] and all(
            "that is the checkpointed peak: peft's prepare_model_for_kbit_training would turn gradient "
            "checkpointing on" in d for d in said["activation_peak"]), said["activation_peak"]
        assert len(said["base_on_cpu"]) == 2 and all(
            d.startswith("QLoRA") and ", host: " in d and "prepare_model_for_kbit_training" in d
            for d in said["base_on_cpu"]), said["base_on_cpu"]
        lora = [r.detail for r in grade(dict(ns, base_on_cpu=lora_gpu_off), seed).rows if r.status != "ok"]
        assert len(lora) == 2 and all(d.startswith("LoRA") and ", gpu: off by +12,345 B" in d and "a small term" in d
                                      and "root unit" not in d      # review r31 #1: no rule for an unknown slip
                                      and "NF4" not in d and "dequantised" not in d for d in lora), lora


def test_part_4_says_its_host_margin():
    """Review r14 minor 5.3: part 4's cases keep the host's RAM lab_cases.MARGIN away from the
    base-on-CPU rung's host bytes, so a host count a few per cent off passes part 4 (part 3 refuses
    it); the prompt says so, with the grader's margin (review r22: by its size, not the module's name)."""
    import json
    for folder in ("solutions", "labs"):
        cells = json.loads((ROOT / folder / f"{LAB}.ipynb").read_text())["cells"]
        part4 = next("".join(c["source"]) for c in cells if "".join(c["source"]).startswith("## 4 "))
        text = " ".join(part4.split())
        assert f"at least {100 * lab_cases.MARGIN:.0f} % away" in text and "part 3 refuses" in text, folder
        assert "MARGIN" not in text, folder


def test_choose_cases_are_as_deep_as_published_models():
    """Review r14 minor 5.4: choose cases were 97 to 139 layers deep at d_model 6 to 7 k (L=139
    h=6,528), unlike any published model. Their depth is now 16 to 128 layers with d_model / n_layers
    between 64 and 160 (by hand: Qwen3-4B 2,560 / 36 = 71, Qwen2.5-32B 5,120 / 64 = 80, Llama-3-70B
    8,192 / 80 = 102, Llama-3-8B 4,096 / 32 = 128, Llama-3.1-405B 16,384 / 126 = 130)."""
    for h, L in ((2560, 36), (5120, 64), (8192, 80), (4096, 32)):
        low, high = lab_cases.published_depths(h)
        assert low <= L <= high, (h, L, low, high)
    assert lab_cases.published_depths(6528) == (41, 102)         # ceil(6528 / 160), 6528 // 64
    for seed in range(3):
        for want, card, host_ram, model, *_ in lab_cases.choose_cases(random.Random(seed)):
            L, h = model["n_layers"], model["d_model"]
            assert 16 <= L <= 128 and 64 <= h / L <= 160, (seed, want, L, h)


def test_review_r21_layer_0s_norm_is_named_and_reconcile_is_blocked():
    """Review r21: a count that gives layer 0's first norm its save (T (2h + 4) too many) read "a
    small term ... is off"; the row now names layer 0. ``megatron.reconcile``'s Llama column is the
    per-layer count for flash attention: it is off while graded like the other counts."""
    from gpumem.chapters.ch08_finetuning import lab_acts, lab_guard, lab_parts
    from gpumem.memory import megatron
    ft, seq = lab_draw.LADDER["lora"], 512
    parts = lab_acts.peak_parts(lab_draw.config(LLAMA3_8B), ft, seq, 1, "none")
    extra = seq * (2 * LLAMA3_8B["d_model"] + 4)
    hint = lab_parts._acts_hint(ft, "none", parts["peak"] + extra, parts, LLAMA3_8B, seq, 1)
    assert hint.startswith("counted once too often: layer 0's first norm"), hint
    assert lab_guard.BLOCKED[(megatron.__file__, "reconcile")] == "gpumem.memory.megatron.reconcile"
    from gpumem.chapters.ch08_finetuning import scale      # and what was blocked before stays blocked
    assert {n for (f, n) in lab_guard.BLOCKED if f == scale.__file__} == {"usable", "base_offloaded", "need"}


def _part(folder: str, start: str) -> str:
    """The markdown cell of the lab in ``folder`` that starts with ``start``, its whitespace folded."""
    import json
    cells = json.loads((ROOT / folder / f"{LAB}.ipynb").read_text())["cells"]
    return " ".join(next("".join(c["source"]) for c in cells if "".join(c["source"]).startswith(start)).split())


def test_review_r22_parts_3_and_4_ask_rather_than_dictate():
    """Review r22 defects 3 and 4: part 3 gave the GPU bound ("what each rule above can hold ... at
    its own worst moment, with the activations at theirs") and part 4 the walk ("each rung without
    checkpointing, then the same rung with it, before the next rung"). Part 3 now asks which moment
    is each term's worst; part 4 states the goal (what a setup gives up: fidelity, then compute) and
    leaves the search to the learner; the reserve stays, labelled the course's assumption."""
    for folder in ("solutions", "labs"):
        part3, part4 = _part(folder, "## 3 "), _part(folder, "## 4 ")
        assert "with the activations at theirs" not in part3 and "Which moment" in part3, folder
        assert "before the next rung" not in part4 and "then the same rung with it" not in part4, folder
        assert "fidelity first" in part4 and "then compute" in part4, folder
        assert "1 GiB for the CUDA context and 5 % of capacity (rounded down)" in part4, folder
        assert "stated assumption" in part4 and "gpus.Reserve" in part4, folder


def _ranked(ns: dict, compute_first: bool = False):
    """A chooser that costs every setup (the ladder backwards, checkpointed first) and returns the
    fitting one with the least (rung's place, re-run), or (re-run, rung's place) if ``compute_first``."""
    role_bytes, acts, cpu = ns["role_bytes"], ns["activation_peak"], ns["base_on_cpu"]

    def choose_recipe(model, capacity, host_ram, seq, batch, ladder=lab_draw.LADDER):
        room, fits = capacity - 2**30 - int(0.05 * capacity), []
        for place, ft in reversed(list(enumerate(ladder.values()))):
            for rerun, p in ((1, "full"), (0, "none")):
                if ft.offload:
                    need = cpu(model, ft, seq, batch, p)
                    ok = need["gpu"] <= room and need["host"] <= host_ram
                else:
                    ok = sum(role_bytes(model, ft).values()) + acts(model, ft, seq, batch, p) <= room
                if ok:
                    fits.append(((rerun, place) if compute_first else (place, rerun), ft, p))
        return min(fits, key=lambda f: f[0])[1:] if fits else None
    return choose_recipe


def test_a_chooser_that_ranks_every_setup_passes():
    """Part 4 states the goal, not the walk (review r22 defect 3), so any search that finds the goal
    passes: every setup costed, in the reverse of the ladder's order and checkpointed first, and the
    least by (rung's place, re-run) returned passes a draw. The same ranking with compute before
    fidelity (a no-re-run setup on any rung before a re-run on an earlier one) fails every draw:
    ``lab_cases.choose_cases`` redraws until one case tells the two apart (before, 9 of 30 draws had
    none). The choice is graded, not the order it was found in."""
    ns = solution()
    report = grade(dict(ns, choose_recipe=_ranked(ns)), 0)
    assert report.solved, report.summary()
    for seed in (1, 2):          # seed 1 drew no case that tells the two rankings apart before the redraw
        wrong = [r for r in grade(dict(ns, choose_recipe=_ranked(ns, True)), seed).rows if r.status != "ok"]
        assert wrong and all(r.function == "choose_recipe" and "earlier rung of the ladder fits too" in r.detail
                             for r in wrong), (seed, wrong)


def test_review_r22_the_worked_example_uses_models_chapter_08_does_not_tabulate():
    """Review r22 defect 5: part 4's example ran Llama-3-8B and 70B, whose per-rung totals and fits
    chapter 08's table prints. It now runs Mistral-7B v0.1 and Qwen2.5-72B: the cell's dimensions
    are those of the shipped config.json files, read by gpumem.memory.hf_config (a route apart from
    the cell's literals), and neither model is among chapter 08's tabulated ones."""
    from gpumem.chapters.ch08_finetuning import scale
    from gpumem.memory import hf_config
    ns = solution()
    for var, name in (("mistral_7b", "mistral-7b-v0.1"), ("qwen25_72b", "qwen2.5-72b")):
        cfg = hf_config.load(name)
        want = {"n_layers": cfg.n_layers, "d_model": cfg.d_model, "n_heads": cfg.n_heads,
                "n_kv_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim, "ffn": cfg.ffn, "vocab": cfg.vocab,
                "tie_embeddings": cfg.tie_embeddings}
        assert ns[var] == want, var
        assert not any(name.split("-")[0] in m for m in scale.MODELS), (name, scale.MODELS)
    example = _part("solutions", "Examples with your own counts")
    assert "Mistral-7B" in example and "Qwen2.5-72B" in example and "Llama-3-70B" not in example


def test_review_r23_a_qlora_cpu_near_miss_names_the_reserve_not_base_on_cpu():
    """Review r23: a chooser with a 1 GB reserve and every count right picked qlora-cpu 11 MiB over
    the usable bytes, and the row told it to compare base_on_cpu's gpu bytes (which it did). By
    hand: a 16 GiB card, usable = 16 GiB - 1 GiB - 5 % (rounded down); a need 11 MiB over that still
    fits the card, so the row names the reserve; a need over the card's bytes names base_on_cpu."""
    from gpumem.chapters.ch08_finetuning import lab_choose
    GiB, MiB = 2**30, 2**20
    capacity = 16 * GiB
    usable = capacity - GiB - capacity * 5 // 100
    near = {"qlora-cpu": (usable + 11 * MiB - 100, {"none": 100, "full": 50}, 10**9)}
    said = lab_choose.why_not(("qlora-cpu", "none"), None, near, usable, capacity=capacity)
    assert "by 11 MiB" in said and "reserve 1 GiB (2**30 B) + 5 %" in said and "base_on_cpu" not in said, said
    far = {"qlora-cpu": (capacity + MiB, {"none": 100, "full": 50}, 10**9)}
    said = lab_choose.why_not(("qlora-cpu", "none"), None, far, usable, capacity=capacity)
    assert "compare them too" in said and "reserve" not in said, said


def test_review_r23_the_reserve_method_is_named_as_it_is_called():
    """Review r23: Reserve(nccl=0).of(capacity) was refused as "gpumem.memory.gpus.of", a name that
    module does not have; the refusal now names the method."""
    from gpumem.chapters.ch08_finetuning import lab_guard
    from gpumem.memory import gpus
    name = lab_guard.BLOCKED[gpus.__file__, "of"]
    assert name == "gpumem.memory.gpus.Reserve.of" and callable(gpus.Reserve.of)


def test_review_r23_part_1_sends_the_learner_to_bitsandbytes_for_the_8bit_states():
    """Review r23: cell 2 dictated 8-bit AdamW's layout (uint8 states, an absmax per 256, fp32 under
    4,096 elements, two 256-value maps once). It now points at the installed source, which holds
    each of those (checked here, so the pointer stays true)."""
    import inspect
    import json
    from bitsandbytes.optim.optimizer import Optimizer2State
    cells = json.loads((ROOT / "solutions" / f"{LAB}.ipynb").read_text())["cells"]
    part1 = next("".join(c["source"]) for c in cells if "## 1 · Bytes by role" in "".join(c["source"]))
    assert "Optimizer2State.init_state" in part1 and "4,096" not in part1 and "256" not in part1
    source = inspect.getsource(Optimizer2State.init_state)
    assert all(s in source for s in ('min_8bit_size', 'blocksize = 256', 'torch.uint8', 'self.name2qmap["dynamic"]'))


def test_review_r24_a_gap_under_one_mib_is_given_in_bytes():
    """Review r24: a setup 300 kB over the usable bytes read "over 21.9 GB usable by 0 MiB"."""
    from gpumem.chapters.ch08_finetuning import lab_choose
    capacity = 24 * 2**30
    usable = capacity - 2**30 - capacity * 5 // 100
    figures = {"qlora-cpu": (usable + 300_000 - 100, {"none": 100, "full": 50}, 10**9)}
    said = lab_choose.why_not(("qlora-cpu", "none"), None, figures, usable, capacity=capacity)
    assert "by 300,000 B" in said and "0 MiB" not in said, said


def test_review_r24_the_8bit_maps_counted_per_tensor_are_named():
    """Review r24: init_state puts qmap1 and qmap2 in every quantised tensor's state, so counting the
    two 256-value fp32 maps (2 x 256 x 4 = 2,048 B) per tensor is the natural misreading of the new
    prompt; it got only "1.01x the right count". The row now says the maps are shared."""
    from gpumem.chapters.ch08_finetuning import labcheck as lab08
    from gpumem.memory import models
    cfg = models.get("llama-3-8b")
    ft = lab_draw.LADDER["full-8bit"]
    want = lab_draw.truth(cfg, ft)
    quantised = 7 * cfg.n_layers + 2                      # by hand: 7 projections a layer, embedding, head
    got = dict(want, optimizer_scales=want["optimizer_scales"] + 2048 * (quantised - 1))
    said = lab08.states_problem(got, want, ft)
    assert "optimizer_scales" in said and "count the two 256-value fp32 maps once" in said, said


def test_review_r25_a_qlora_near_miss_under_its_buffer_states_the_gap_once():
    """Review r25: the qlora branch for a miss smaller than the dequant buffer appended the gap again
    in MiB after `over` had stated it ("by 300,000 B by 0 MiB", "by 37 MiB by 37 MiB"). By hand: a
    need 37 MiB over the usable bytes with a 200 MiB buffer names the buffer and gives the gap once."""
    from gpumem.chapters.ch08_finetuning import lab_choose
    GiB, MiB = 2**30, 2**20
    capacity = 24 * GiB
    usable = capacity - GiB - capacity * 5 // 100
    for gap, words in ((37 * MiB, "by 37 MiB"), (300_000, "by 300,000 B")):
        figures = {"qlora": (usable + gap - 100, {"none": 100, "full": 50}, 0)}
        said = lab_choose.why_not(("qlora", "none"), None, figures, usable, capacity=capacity, buffer=200 * MiB)
        assert said.count(" by ") == 1 and words in said and "dequant_buffer alone (200 MiB" in said, said
