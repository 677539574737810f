"""Lab 03 against review r30 finding 1 (/work/notes/reviews21/r30/lab03.md): copies of the grader's
placement answers with their locals renamed, refused by similarity (``labguard.answer_prints``)."""

import inspect
import re

import pytest

from gpumem.chapters.ch03_activation_checkpointing import labcases, labcheck, labguard, labplace
from gpumem.course.grading import Report

from test_lab03_adversarial import _solution_cells, restored

# The reviewer's cheat (cell 7 of /tmp/r30/lab03/lab03_checkpoint_budget-cheat.ipynb): r29's inlined
# labcases._balanced_peak with ``sizes`` -> ``lengths`` and ``rerun`` -> ``worst``: 34/34 before.
RENAMED = r'''
def place_checkpoints(n_layers, layer_bytes, checkpoint_bytes, other_bytes, other_after_loss, budget):
    K, B, O, R = layer_bytes, checkpoint_bytes, other_bytes, other_after_loss
    def peak(c, k, plain):
        if not c:
            return plain * K + O, []
        q, r = divmod(c, k)
        lengths = [q + 1] * r + [q] * (k - r)
        worst = max(j * B + size * K for j, size in enumerate(lengths)) + 2 * B + R
        return max(plain * K + k * B + O, worst), lengths
    for c in range(n_layers + 1):
        for k in range(1, max(c, 1) + 1):
            got, lengths = peak(c, k, n_layers - c)
            if got <= budget:
                segs, i = [], 0
                for s in lengths:
                    segs.append(list(range(i, i + s)))
                    i += s
                return segs
    return [[i] for i in range(n_layers)]
'''

# The same closed form with every local renamed and written into the loop, no nested function.
INLINE = r'''
def place_checkpoints(n_layers, layer_bytes, checkpoint_bytes, other_bytes, other_after_loss, budget):
    for total in range(n_layers + 1):
        for parts in range(1, max(total, 1) + 1):
            if not total:
                if n_layers * layer_bytes + other_bytes <= budget:
                    return []
                continue
            a, b = divmod(total, parts)
            cuts = [a + 1] * b + [a] * (parts - b)
            high = max(m * checkpoint_bytes + w * layer_bytes for m, w in enumerate(cuts)) + 2 * checkpoint_bytes + other_after_loss
            if max((n_layers - total) * layer_bytes + parts * checkpoint_bytes + other_bytes, high) <= budget:
                out, at = [], 0
                for w in cuts:
                    out.append(list(range(at, at + w)))
                    at += w
                return out
    return [[i] for i in range(n_layers)]
'''


def _renamed_search() -> str:
    """labplace.best_placements taking the numbers instead of the model (the gap labplace's docstring
    recorded, review r8), every local renamed, and a place_checkpoints that reads its answer."""
    source = inspect.getsource(labplace.best_placements)
    source = source.replace("cfg: ModelConfig, seq: int, batch: int", "n, K, B, O, R")
    source = source.replace("    K, B, O, R = constants(cfg, seq, batch)\n    n = cfg.n_layers\n", "")
    for old, new in (("best_placements", "search"), ("layers", "table"), ("offer", "keep"), ("worst", "top"),
                     ("segs", "cuts"), ("length", "span"), ("rerun", "again"), ("best", "found"), ("peak", "high")):
        source = re.sub(rf"\b{old}\b", new, source)
    offer = "        if key not in table or top < table[key][0]:\n            table[key] = (top, cuts)\n"
    assert offer in source, source          # its helper edited too: renamed, its bytecode was still known
    source = source.replace(offer, "        old = table.get(key)\n        if old is None or old[0] > top:\n"
                                   "            table[key] = (top, cuts)\n")
    assert "constants" not in source and "cfg" not in source, source
    return source + r'''

def place_checkpoints(n_layers, layer_bytes, checkpoint_bytes, other_bytes, other_after_loss, budget):
    found = search(n_layers, layer_bytes, checkpoint_bytes, other_bytes, other_after_loss)
    c = min((c for c, (high, _) in found.items() if high <= budget), default=n_layers)
    return found[c][1] if c < n_layers else [[i] for i in range(n_layers)]
'''


def _place(source: str):
    ns: dict = {}
    exec(compile(source, "<cheat cell>", "exec"), ns)
    return ns["place_checkpoints"]


@pytest.mark.parametrize("source, copied", [(RENAMED, "labcases._balanced_peak"), (INLINE, "labcases._balanced_peak"),
                                            (_renamed_search(), "labplace.best_placements")],
                         ids=["renamed-nested", "inlined-loop", "renamed-best-placements"])
def test_r30_renamed_copies_of_the_placement_answers_are_refused(source, copied):
    """Each copy answers the drawn questions right outside the guard (so only the refusal fails it);
    under the grader its first placement row is wrong and names the function copied."""
    place = _place(source)
    questions = labcases.draw(1000)["questions"]
    for q in questions:
        segments = place(**labcheck.numbers(q.cfg), budget=q.budget)
        assert sum(map(len, segments)) == q.count, (q.cfg.name, segments)
    report = Report("lab03")
    assert labcheck._grade_placement(report, place, "scratch", questions[0]) == "wrong", report.summary()
    detail = report.rows[0].detail
    assert f"a copy of the grader's own answer ({copied})" in detail and labguard.MESSAGE in detail, detail
    assert restored()


def test_r30_the_solution_and_honest_placements_are_not_refused():
    """The solution's place_checkpoints and estimate_peak, and a learner's own balanced-cut rule
    that calls its estimate (r6's route: the lab's reflection asks for that rule), pass every drawn
    question of a seed (one seed: the suite's time; the adversarial file grades the solution on more)."""
    ns = _solution_cells("def estimate_peak", "def place_checkpoints")
    ns["own"] = _place(_OWN.replace("ESTIMATE", "estimate"))
    ns["own"].__globals__["estimate"] = ns["estimate_peak"]
    for seed in (1000,):
        for q in labcases.draw(seed)["questions"]:
            for place in (ns["place_checkpoints"], ns["own"]):
                report = Report("lab03")
                assert labcheck._grade_placement(report, place, "scratch", q) == "ok", report.summary()
    assert not labguard.answer_prints().match(ns["estimate_peak"].__code__)


_OWN = r'''
def place_checkpoints(n_layers, layer_bytes, checkpoint_bytes, other_bytes, other_after_loss, budget):
    numbers = (n_layers, layer_bytes, checkpoint_bytes, other_bytes, other_after_loss)
    for c in range(1, n_layers + 1):        # the fewest layers, then k balanced segments, longer first
        for k in range(1, c + 1):
            q, r = divmod(c, k)
            segs, i = [], 0
            for size in [q + 1] * r + [q] * (k - r):
                segs.append(list(range(i, i + size)))
                i += size
            if ESTIMATE(segs, *numbers) <= budget:
                return segs
    return [[i] for i in range(n_layers)]
'''
