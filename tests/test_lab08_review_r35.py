"""Lab 08, review r35: an adapter role 2x off asks about the dtype, not the shapes, and no row states
the k/v widths; a LoRA count short of part of the loss's bytes asks what the loss keeps, not the
frozen base's saves; two slips of the same bytes are both asked about, neither stated as fact.

The slips are the review's (/tmp/r35/lab08/-mistakes6 and probe_acts.py), written here on the
solution's cells; the probe's model is draw_model(Random(7)): L=8 h=1,792 a=16 kv=2 hd=64 F=5,376
V=96,863, where, at seq 1024 x 1, a bf16 logsumexp (2 B x 1,024 x 16 heads x 8 layers) and RoPE's
tables (4 B x 1,024 x 64) are both 262,144 B.
"""

import json
import os
import random

import pytest

from conftest import ROOT
from gpumem.chapters.ch08_finetuning import lab_acts, lab_draw, lab_parts
from gpumem.course.grading import Report
from test_lab08_adversarial import LAB, grade, solution


@pytest.fixture(autouse=True)
def _tests_count_as_cells(monkeypatch):
    """The slipped cells, compiled as "<string>", and test_lab08_adversarial's count as cells."""
    import test_lab08_adversarial
    cells = (__file__, test_lab08_adversarial.__file__, "<cheat cell>", "<string>")
    monkeypatch.setenv("GPUMEM_TEST_CELLS", os.pathsep.join(cells))


def _slipped(old: str, new: str) -> dict:
    """The solution's namespace with its four graded cells run again ("<string>"), ``old`` replaced by
    ``new`` in the one that holds it (the later cells call the slipped function, as a notebook does)."""
    ns = dict(solution())
    cells = json.loads((ROOT / "solutions" / f"{LAB}.ipynb").read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    assert sum(s.count(old) for s in sources) == 1, old
    for name in ("role_bytes", "activation_peak", "base_on_cpu", "choose_recipe"):
        src = next(s for s in sources if f"def {name}(" in s)
        exec(compile(src.replace(old, new), "<string>", "exec"), ns)
    return ns


def _rows(ns: dict, function: str, seeds=(0, 1)) -> list[str]:
    return [r.detail for s in seeds for r in grade(ns, s).rows if r.function == function and r.status != "ok"]


PROBE = lab_draw.draw_model(random.Random(7))
WIDTHS = ("n_kv_heads", "head_dim", "n_heads x", "write", "reads ffn")
LOSS = "what does the loss keep, a token: in which dtypes?"
LSE = "in which dtype does flash attention keep its logsumexp?"
ROPE = "are RoPE's cos and sin tables counted?"
PROJECTIONS = "which projections read a tensor that another operator already saves?"


def _probe_rows(ns: dict, setups, seq: int = 1024, batch: int = 1, model: dict = PROBE) -> list[str]:
    """activation_peak's row on the probe's model, graded in-process on ``setups`` [(ft, policy)]."""
    cfg, report = lab_draw.config(model), Report(LAB)
    cases = [(model, seq, batch, [(ft, p, 0.0, lab_acts.peak_parts(cfg, ft, seq, batch, p)) for ft, p in setups])]
    lab_parts.grade_acts(report, ns["activation_peak"], cases)
    return [r.detail for r in report.rows if r.status != "ok"]


def test_bf16_adapters_moments_in_fp32_ask_the_dtype():
    """Finding 1 (-mistakes6): AdamW's moments of bf16 adapters counted in fp32 (8 B a parameter):
    each model's row is the bf16 setup's optimizer_moments, 2x too high, and asks in which dtype AdamW
    keeps a bf16 parameter's states; none speaks of in and out features or states a width."""
    ns = _slipped("2 * e * n_a, 4 * L", "8 * n_a, 4 * L")
    rows = _rows(ns, "role_bytes")
    assert len(rows) == 6 and all("bf16 adapters, adamw, optimizer_moments: yours is 2x" in d for d in rows), rows
    assert all(d.endswith("in which dtype does AdamW keep a bf16 parameter's states?") for d in rows), rows
    assert not any(w in d for d in rows for w in WIDTHS + ("in and out",)), rows


def test_a_wrong_width_asks_about_the_shapes_and_states_none():
    """Finding 1: k's and v's adapters counted n_heads x head_dim wide (no GQA), or every adapted matrix
    d_model wide: the adapter_weights row asks about each projection's in and out and states no width; a count
    12 parameters off, of no such width, gets no hint."""
    for old, new in (("mats[t][1] * ft.lora_rank)]", "(model['n_heads'] * model['head_dim'] if t in ('k', 'v') "
                      "else mats[t][1]) * ft.lora_rank)]"),
                     ("for i, o in mats.values()]", "for i, o in mats.values()]; mats = dict.fromkeys(mats, (h, h))")):
        rows = [d for d in _rows(_slipped(old, new), "role_bytes") if "adapter_weights" in d]
        assert rows and all(d.endswith("is every one of q, k, v, o, gate, up and down d_model wide on both sides?")
                            for d in rows), rows
        assert not any(w in d for d in rows for w in WIDTHS), rows
    rows = _rows(_slipped("2 * e * n_a, 4 * L", "2 * e * (n_a + 12), 4 * L"), "role_bytes")
    assert rows and all("optimizer_moments" in d and " -- " not in d for d in rows), rows


@pytest.mark.parametrize("name", ["lora", "qlora"])
def test_bf16_logits_left_out_ask_what_the_loss_keeps(name):
    """Finding 2 (probe_acts.py): LoRA and QLoRA without the bf16 logits (8 B of the 10 a token and
    vocabulary entry), both policies, on the probe's model (V = 96,863): the row asks what the loss
    keeps, states no count and says nothing of the frozen base; so do the drawn checks' LoRA rows."""
    ns = _slipped("loss = 2 * 2 * seq * hd, 10 * T * V + 8", "loss = 2 * 2 * seq * hd, (8 if ft.lora else 10) * T * V + 8")
    for policy in ("none", "full"):
        rows = _probe_rows(ns, [(lab_draw.LADDER[name], policy)])
        assert len(rows) == 1 and rows[0].endswith(f"(too low) -- {LOSS}"), rows
    rows = _rows(ns, "activation_peak")
    assert rows and all(d.endswith(LOSS) and "frozen base" not in d for d in rows), rows


def test_a_bf16_logsumexp_and_rope_of_the_same_bytes_are_both_asked():
    """Finding 3a: on the probe's model, without checkpointing, the logsumexp kept in bf16 and RoPE's
    tables left out are both 262,144 B short: each slip's row asks about both and states neither."""
    T, a, L, hd = 1024, PROBE["n_heads"], PROBE["n_layers"], PROBE["head_dim"]
    assert 2 * T * a * L == 4 * 1024 * hd == 262_144
    for old, new in (("2 * q + 4 * a ", "2 * q + 2 * a "), ("rope, loss = 2 * 2 * seq * hd,", "rope, loss = 0,")):
        rows = _probe_rows(_slipped(old, new), [(lab_draw.LADDER[n], "none") for n in ("full", "lora", "qlora")])
        assert len(rows) == 1 and rows[0].endswith(f"-- {ROPE} Or {LSE}"), rows
        assert "missing" not in rows[0], rows


def test_an_extra_silu_output_on_qlora_is_asked_not_told_peft_s_cast():
    """Finding 3b: QLoRA counting SiLU's output once more (2F a token, down's input width) asks which
    projections read a saved tensor and does not tell peft's 4-bit cast; QLoRA counting each fp32
    adapter's own input copy (a bf16 base's rule) still is told it."""
    qlora = lab_draw.LADDER["qlora"]
    rows = _probe_rows(_slipped("+ 3 * 2 * F + 7 * 2 * r", "+ 4 * 2 * F + 7 * 2 * r"), [(qlora, "none")])
    assert len(rows) == 1 and rows[0].endswith(PROJECTIONS) and "4-bit" not in rows[0], rows
    copies = _slipped('ft.adapter_dtype == "fp32" and ft.base_dtype == "bf16"   #', 'ft.adapter_dtype == "fp32"   #')
    rows = _probe_rows(copies, [(qlora, "none")])
    assert len(rows) == 1 and "peft's 4-bit layer does not cast the input" in rows[0], rows


def test_a_one_layer_logsumexp_short_on_fp32_lora_is_not_the_adapters_inputs():
    """Finding 3c: LoRA with fp32 adapters, every layer checkpointed, the re-run the peak (V = 2,000),
    the logsumexp in bf16 (2 B x T x a short, one layer): the row asks about the logsumexp, not the
    adapted projections' saved inputs; those inputs shared, as on a 4-bit base, still are told."""
    lora, model = lab_draw.LabFinetune(adapter="lora", adapter_dtype="fp32"), PROBE | {"vocab": 2000}
    parts = lab_acts.peak_parts(lab_draw.config(model), lora, 4096, 1, "full")
    assert parts["peak"] == parts["recompute_peak"] > parts["forward_peak"]
    rows = _probe_rows(_slipped("2 * q + 4 * a ", "2 * q + 2 * a "), [(lora, "full")], 4096, 1, model)
    assert len(rows) == 1 and rows[0].endswith(LSE) and "saved inputs" not in rows[0], rows
    shared = _slipped('ft.adapter_dtype == "fp32" and ft.base_dtype == "bf16"   #', "False   #")
    rows = _probe_rows(shared, [(lora, "full")], 4096, 1, model)
    assert len(rows) == 1 and "your adapted projections' saved inputs are short" in rows[0], rows
