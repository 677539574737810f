"""Review r33 of lab 01: the wording of two hints, at the reviewer's own cases.

#3: the two-term hint for naive attention's K and V left ``n_kv_heads`` wide named ``head_dim``,
meaning the plain layer's (d_model // n_heads), while the row's header shows the case's.
#4: part 3's row for a wrong plain layer said "every switch's term is right" of a case that
exercises no switch the slip touched (mlp=swiglu; the slip was gelu-dropout's mask).
"""

from gpumem.chapters.ch01_memory_anatomy import labhints, labpart2, variants
from gpumem.course.grading import call
from test_lab01_adversarial import _part2_slip, _slip, _T, T_OF, solution


def test_review_r33_the_two_term_hint_writes_the_plain_layers_head_width_as_a_number():
    case = dict(d_model=120, n_heads=6, n_kv_heads=3, head_dim=8, ffn=280, seq=39, batch=2, kernel="naive",
                qk_norm="per-head")
    # K and V kept n_kv_heads wide, not repeated to every query head
    fn = _part2_slip(lambda kw: -4 * T_OF(kw) * (kw["n_heads"] - kw["n_kv_heads"]) * kw["head_dim"]
                     if kw["kernel"] == "naive" else 0)
    hint = labpart2.why(fn, case, fn(**case), solution()["layer_activation_bytes"](**case))
    # 78 tokens: -4 x 78 x 120 + 4 x 78 x 3 x 20 = -37,440 + 18,720
    assert "-18,720 B off = -4 x tokens x d_model +4 x tokens x n_kv_heads x 20" in hint, hint
    assert "n_kv_heads x head_dim" not in hint and "x 8" not in hint, hint


def test_review_r33_a_wrong_plain_layer_claims_nothing_of_the_switches():
    case = dict(d_model=96, n_heads=8, n_kv_heads=4, ffn=248, seq=24, batch=2, kernel="naive", norm="hf",
                mlp="swiglu", qkv_bias=False)
    # part 2's slip (-2 x tokens x d_model) and the dropout mask counted in bf16, which this case does not ask
    fn = _slip(lambda kw: -2 * _T(kw) * kw["d_model"] + (_T(kw) * kw["ffn"] if kw["mlp"] == "gelu-dropout" else 0))
    got, want = call(fn, **case)["activations"], variants.measure(**case)[0]
    hint = labhints.why(fn, case, "activations", got, want)
    assert hint.startswith("the plain layer (norm='fused', mlp='swiglu', qkv_bias=False) at this shape is already "
                           "-9,216 bytes off: fix part 2's count first; the switches are checked after"), hint
    assert "term is right" not in hint and hint.endswith("(this case: expected 225,216 bytes, got 216,000)"), hint
