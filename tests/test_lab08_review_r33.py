"""Lab 08, review r33: the re-run's input counted twice is asked about, not read as a missing
projection input; a wrong activation_peak is named for the base-on-CPU rung too, not the reserve;
the projections question only for an excess of projection-input widths, a norm question for the
trace's plain norms, and no hint for an excess of no known kind; part 3's slip-specific hints are
questions that state no rule.

The slips are the review's (/tmp/r33/lab08/-mistakes5 and probe_acts.py), written here on the
solution's source or its functions; the bytes they move are counted by hand from the dimensions.
"""

import json
import os
import random

import pytest

from conftest import ROOT
from gpumem.chapters.ch08_finetuning import lab_acts, lab_draw, lab_parts
from test_lab08_adversarial import LAB, grade, solution
from test_lab08_review_r31 import _RULES


@pytest.fixture(autouse=True)
def _tests_count_as_cells(monkeypatch):
    """This file's learners' functions, the slipped cells compiled as "<string>", and
    test_lab08_adversarial's count as cells while graded."""
    import test_lab08_adversarial
    cells = (__file__, test_lab08_adversarial.__file__, "<cheat cell>", "<string>")
    monkeypatch.setenv("GPUMEM_TEST_CELLS", os.pathsep.join(cells))


def _slipped(old: str, new: str) -> dict:
    """The solution's namespace with its activation_peak, base_on_cpu and choose_recipe cells run again
    ("<string>"), ``old`` replaced by ``new`` in the one that holds it: base_on_cpu and choose_recipe
    call the slipped activation_peak, as a learner's notebook does."""
    ns = dict(solution())
    cells = json.loads((ROOT / "solutions" / f"{LAB}.ipynb").read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    assert sum(s.count(old) for s in sources) == 1, old
    for name in ("activation_peak", "base_on_cpu", "choose_recipe"):
        src = next(s for s in sources if f"def {name}(" in s)
        exec(compile(src.replace(old, new), "<string>", "exec"), ns)
    return ns


def _rows(ns: dict, function: str, seeds=(0, 1)) -> list[str]:
    return [r.detail for s in seeds for r in grade(ns, s).rows if r.function == function and r.status != "ok"]


RERUN = "the re-run layer's input is the checkpoint's own tensor: is it counted twice?"
PROJECTIONS = "which projections read a tensor that another operator already saves?"
NORMS = "what does a fused RMSNorm save on a GPU, against the trace's plain one?"


def test_the_rerun_input_counted_twice_is_asked_about():
    """Finding 1 (-mistakes5): the re-run's moment counts every layer's checkpointed input, L x 2Th
    for (L - 1) x 2Th, so the re-run layer's input is there twice: every row that fails is a
    checkpointed one, 2Th too high, and asks whether that input is counted twice; none says a
    projection's input is missing."""
    ns = _slipped("(L - 1) * kept + layer", "L * kept + layer")
    rows = _rows(ns, "activation_peak")
    assert rows and all("every layer checkpointed" in d and "too high" in d and d.endswith(RERUN) for d in rows), rows
    assert not any("projection" in d for d in rows), rows


def test_the_projection_input_hint_is_for_a_count_too_low():
    """Finding 1: full fine-tuning 2Th short in the re-run (L x 2Th without checkpointing) is told each
    projection's input; 2Th too high without checkpointing is not."""
    model, seq, batch, setups = lab_acts.acts_cases(random.Random(0))[-1]
    ft, policy, dropout, parts = setups[0]
    T, h, L = seq * batch, model["d_model"], model["n_layers"]
    assert not ft.lora and policy == "full" and parts["peak"] == parts["recompute_peak"]
    short = lab_parts._acts_hint(ft, "full", parts["peak"] - 2 * T * h, parts, model, seq, batch)
    assert short.startswith("full fine-tuning saves each projection's input"), short
    plain = lab_acts.peak_parts(lab_draw.config(model), ft, seq, batch, "none")
    assert lab_parts._acts_hint(ft, "none", plain["peak"] - L * 2 * T * h, plain, model, seq, batch) == short
    assert "projection's input" not in lab_parts._acts_hint(ft, "none", plain["peak"] + L * 2 * T * h, plain,
                                                            model, seq, batch)


def test_a_wrong_activation_peak_is_named_for_the_base_on_the_cpu():
    """Finding 2 (-mistakes5, the review's near miss): t4 with 192 GiB, L=41, h=6,144, seq 4096 x 4,
    QLoRA NF4 block 32: the answer is the base on the CPU, checkpointed, by 2,236 B; the learner's
    activation_peak (the re-run's input twice, 2Th = 201,326,592 B) puts it over, and its chooser
    returns None. The row names activation_peak first, not the reserve."""
    from gpumem.chapters.ch08_finetuning import lab_choose, scale
    from gpumem.course.grading import Report, Row
    from gpumem.memory import gpus
    ns = _slipped("(L - 1) * kept + layer", "L * kept + layer")
    model = {"n_layers": 41, "d_model": 6144, "n_heads": 48, "n_kv_heads": 48, "head_dim": 128, "ffn": 20224,
             "vocab": 9469, "tie_embeddings": False}
    rungs, seq, batch, host = lab_draw.ladder(32, True), 4096, 4, 192 * 2**30
    figures = lab_draw.totals(model, seq, batch, rungs)
    want = lab_draw.answer(figures, scale.usable("t4"), host)
    assert want == ("qlora-cpu", "full") and 0 <= scale.usable("t4") - lab_draw.total(figures, want) < 2 * 4096 * 4 * 6144
    assert ns["choose_recipe"](model, gpus.get("t4").capacity, host, seq, batch, rungs) is None
    report = Report(LAB)
    report.rows.append(Row("activation_peak", "a drawn case", "wrong", "its rows"))
    lab_choose.grade_choose(report, ns["choose_recipe"], [(want, "t4", host, model, seq, batch, figures, rungs)], ns)
    row = report.rows[-1]
    assert row.status == "wrong" and row.detail.startswith("your activation_peak is wrong (see its rows): fix that "
                                                           "first; "), row.detail
    assert "reserve" not in row.detail, row.detail


def test_plain_norms_get_the_norm_question():
    """Finding 3: every RMSNorm counted as the trace's plain one (its fp32 input, 4h B a token more than
    the fused 2h + 4; 6h + 4 with a trained weight, by the trace's 724 at h = 120): the rows ask what a
    fused RMSNorm saves, not which projections; on every setup without dropout the hint is that
    question (none at a LoRA forward's end, where 2Th is also a frozen head's input; the projections
    question after it where the bytes are also projections' inputs: q + F = 4h in the re-run)."""
    ns = _slipped("norm = 2 * h + 4 ", "norm = (4 if ft.lora else 6) * h + 4 ")
    rows = _rows(ns, "activation_peak")
    assert rows and all(NORMS in d for d in rows), rows
    slip = ns["activation_peak"]
    for seed in (0, 1, 2):
        for model, seq, batch, setups in lab_acts.acts_cases(random.Random(seed)):
            for ft, policy, dropout, parts in setups:
                if dropout:
                    continue
                got = slip(dict(model), ft, seq, batch, policy, 0.0)
                said = lab_parts._acts_hint(ft, policy, got, parts, model, seq, batch)
                at_end = policy == "full" and parts["peak"] == parts["forward_peak"]
                assert got > parts["peak"] and (said.startswith(NORMS) or (said == "" and ft.lora and at_end)), (
                    ft, policy, said)


@pytest.mark.parametrize("slip", ["head input", "12,345 B"])
def test_an_excess_of_no_known_kind_gets_no_question(slip):
    """Finding 3: LoRA with its frozen head's input counted (2h a token, once), or any setup 12,345 B
    too high: no row asks about projections or tells QLoRA's peft cast."""
    if slip == "head input":
        ns = _slipped("outside = rope + T * norm    ", "outside = rope + T * (norm + 2 * h)")
    else:
        ns = dict(solution())
        right = ns["activation_peak"]
        ns["activation_peak"] = lambda *a, **k: right(*a, **k) + 12_345
    rows = _rows(ns, "activation_peak")
    assert rows and not any(w in d for d in rows for w in ("projection", "4-bit", "?")), rows


def _offload_rows(slip, seeds=(0, 1)) -> list[str]:
    ns = solution()
    right, roles = ns["base_on_cpu"], ns["role_bytes"]

    def base_on_cpu(model, ft, seq, batch, policy):
        got = right(model, ft, seq, batch, policy)
        h, V, L = model["d_model"], model["vocab"], model["n_layers"]
        root = 2 * (V * h * (1 if model["tie_embeddings"] else 2) + h)
        r = roles(model, ft)
        block = (got["pcie"] - root) // (2 * L)                    # one block's copy, as it crosses
        return got | slip(got, root, block, r["grads"] // L, r["quant_constants"])
    ns["base_on_cpu"] = base_on_cpu
    return [r.detail for s in seeds for r in grade(ns, s).rows if r.function == "base_on_cpu" and r.status != "ok"]


@pytest.mark.parametrize("slip, key, said", [
    ("once", "pcie", "how many times does a block's copy cross in one step, and does the re-run need a third?"),
    ("thrice", "pcie", "how many times does a block's copy cross in one step, and does the re-run need a third?"),
    ("no root", "pcie", "what does FSDP gather besides the blocks, and how long does it stay gathered?"),
    ("one block", "gpu", "how many blocks does FSDP hold while it prefetches?"),
    ("no constants", "gpu", "which of QLoRA's roles are not FSDP parameters?")])
def test_part_3s_slips_get_questions_not_rules(slip, key, said):
    """Finding 4: a block's copy crossing once or three times a step, the root unit not crossing, one
    block held on the GPU (its adapters' gradients with it), QLoRA's NF4 constants left off the GPU:
    each row asks the question and says none of the rules cell 13 asks for."""
    change = {"once": lambda g, root, block, grads, const: {"pcie": (g["pcie"] - root) // 2 + root},
              "thrice": lambda g, root, block, grads, const: {"pcie": (g["pcie"] - root) * 3 // 2 + root},
              "no root": lambda g, root, block, grads, const: {"pcie": g["pcie"] - root},
              "one block": lambda g, root, block, grads, const: {"gpu": g["gpu"] - block - grads},
              "no constants": lambda g, root, block, grads, const: {"gpu": g["gpu"] - const}}[slip]
    rows = _offload_rows(change)
    assert rows and all(f", {key}: " in d and d.endswith(said) for d in rows), rows
    if slip == "no constants":
        assert all(d.startswith("QLoRA") for d in rows), rows
    assert not any(w in d for d in rows for w in _RULES + ("prefetched", "crosses", "forward and backward")), rows
