"""Review r35 of lab 01: two hints, and the fitted table the limits cannot refuse (said, not hidden)."""

import json
from pathlib import Path

from gpumem.chapters.ch01_memory_anatomy import labhints, labpart2

ROOT = Path(__file__).resolve().parents[1]


def test_the_norm_hint_splits_its_total_into_tensors():
    """#3: the HF norm's bf16 normed copy left out of both norms, at 30 tokens and d_model 16:
    2 norms x 2 B x 30 x 16 = 1,920 B (by hand). The row now splits the total as part 1's and part
    2's hints do, in tensors of tokens x d_model, without naming which tensor."""
    said = labhints._bytes_hint("norm", 10_000 - 1_920, 10_000, (30, 16, 64), "hf")
    assert "-1,920 B off = -2 x 2 B x tokens x d_model" in said, said
    assert "normed" not in said and "copy" not in said, said
    odd = labhints._bytes_hint("norm", 10_000 - 7, 10_000, (30, 16, 64), "hf")      # not whole tensors: no split
    assert "-7 B off:" in odd, odd


def test_the_per_head_slip_is_given_in_rows_not_named():
    """#2: "you counted a 1/rms per head" stated the slip; the row now gives the rows too many and
    asks. T = 30 tokens, 3 + 3 heads: 4 B x 30 x (3 + 3 - 2) = 480 B (by hand), 120 rows."""
    case = {"batch": 1, "seq": 30, "n_heads": 3, "n_kv_heads": 3, "qk_norm": "full"}
    said = labpart2._norm_hint(case, 1_000, 480)
    assert "+480 B = 4 B x 120 rows of 1/rms too many" in said and "per head" not in said, said
    case["qk_norm"] = "per-head"
    said = labpart2._norm_hint(case, 1_000, -480)
    assert "-480 B = 4 B x 120 rows of 1/rms too few" in said and "per token" not in said.split(":")[1], said


def test_the_prompt_no_longer_claims_a_fit_is_refused():
    """#1: a fit packed a byte a coefficient passed all 39 rows under the limits; cell 18 said a fit
    is refused. It now says the limits refuse tables of answers by case, and what they cannot tell."""
    for folder in ("solutions", "labs"):
        cells = json.loads((ROOT / folder / "lab01_memory_calculator.ipynb").read_text())["cells"]
        text = " ".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown").replace("\n", " ")
        assert "coefficients fitted to measurements" not in text
        assert "cannot tell a formula you derived from one fitted" in text
        assert "docstrings and comments are removed before grading" in text


def test_review_r36_a_norm_counted_for_the_query_heads_only_is_given_in_rows():
    """r36 #3: under per-head, a 1/rms for the query heads only (k's rows left out): T = 30, 2 KV
    heads: 4 B x 30 x 2 = 240 B short (by hand), 60 rows; the row said only "go through the norms"."""
    case = {"batch": 1, "seq": 30, "n_heads": 3, "n_kv_heads": 2, "qk_norm": "per-head"}
    said = labpart2._norm_hint(case, 1_000, -240)
    assert "-240 B = 4 B x 60 rows of 1/rms too few" in said and "how many rows" in said, said
