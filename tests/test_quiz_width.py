"""Quiz text fits the page (issue 24, item 3): prompts and options printed in text mode were single
lines of 200-650 columns; now every line of a quiz's listing and of a renewed prompt is at most 100
characters. (Feedback after an answer is not wrapped yet: chapter 07's tests read it as one line.)"""

from gpumem import chapters
from gpumem.course.quiz import fit


def test_fit_wraps_long_lines_only():
    table = "a    b\n" + "x" * 20
    assert fit(table) == table
    long = " ".join(["word"] * 60)
    wrapped = fit(long, "   ").split("\n")
    assert len(wrapped) > 1 and all(len(line) <= 100 for line in wrapped)
    assert all(line.startswith("   ") for line in wrapped[1:])
    assert " ".join(w.strip() for w in wrapped).split() == long.split()   # nothing lost


def test_every_quiz_prints_within_100_columns(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("GPUMEM_QUIZ_MODE", "text")
    monkeypatch.setenv("GPUMEM_HOME", str(tmp_path))
    for quiz in chapters.quizzes():
        quiz.show()
        for q in quiz.questions:
            quiz.renew(q.id)
    out = capsys.readouterr().out
    assert out.count("\n") > 200
    wide = [line for line in out.split("\n") if len(line) > 100]
    assert not wide, wide[:3]
