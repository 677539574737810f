"""The quiz progress file never loses a learner's work (issue 18, section 5).

Each test puts the file (or its folder) in a state a learner can meet -- valid JSON of the wrong
shape, a cut-short or garbage file, two processes saving at once, a read-only or missing folder,
a lock held too long, a save killed half-way -- and checks that the answer is graded and shown
first, nothing raises, no earlier answer is lost and a bad file is kept aside, never overwritten.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpumem.course import checklist as cl, progress, quiz as q

ROOT = Path(__file__).resolve().parents[1]
posix_only = pytest.mark.skipif(os.name != "posix", reason="POSIX permissions, flock and SIGKILL")
EARLIER = {"01_zero": {"stages": {"correct": True, "attempts": 2}, "comm": {"correct": False, "attempts": 1,
                                                                           "revealed": 1}}}


def _quiz(name="00_setup"):
    per_param = q.Numeric("per-param", "Bytes per parameter of bf16 weights + grads + fp32 Adam?",
                          answer=16, unit="bytes", rel_tol=0.0, hint="Add each copy.", explanation="2 + 2 + 12.")
    pick = q.Choice("pick", "Which is prime?", ["4", "6", "7", "9"], answer=2, hint="Divisors.",
                    explanation="7 has no divisor but 1 and itself.")
    return q.Quiz(name, [per_param, pick])


def _home() -> Path:
    return Path(os.environ["GPUMEM_HOME"])


def _put(content: bytes) -> Path:
    path = _home() / "progress.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def _saved() -> dict:
    return json.loads((_home() / "progress.json").read_text())


def _asides() -> list[Path]:
    return sorted(_home().glob("progress.json.unreadable-*"))


def _one_line_about_it(out: str, first: str) -> str:
    """The printed lines: the feedback first, then exactly one line about the file."""
    lines = out.splitlines()
    assert lines[0].startswith(first) and len(lines) == 2, lines
    return lines[1]


# -- valid JSON of the wrong shape, and wrong entries inside a right file ----------------------

@pytest.mark.parametrize("content", [b"[]", b"null", b'"text"', b"3", b'{"00_setup": []}',
                                     b'{"00_setup": {"per-param": "yes"}}',
                                     b'{"00_setup": {"per-param": {"correct": false, "attempts": "2"}}}'])
def test_wrong_shape_is_set_aside_and_the_answer_still_counts(content, capsys):
    path = _put(content)
    assert _quiz().answer("per-param", 16) is True          # raised AttributeError / TypeError before
    note = _one_line_about_it(capsys.readouterr().out, "Correct. 2 + 2 + 12.")
    (aside,) = _asides()
    assert aside.read_bytes() == content and aside.name in note and str(path) in note
    assert aside.name.startswith("progress.json.unreadable-") and len(aside.name) == len(
        "progress.json.unreadable-20261202T063000")
    assert _saved() == {"00_setup": {"per-param": {"correct": True, "attempts": 1}}}


def test_the_right_entries_of_a_partly_wrong_file_are_kept(capsys):
    content = json.dumps({**EARLIER, "00_setup": [], "02_x": {"ok": {"correct": True, "attempts": 1},
                                                              "bad": {"correct": "yes", "attempts": 1},
                                                              "neg": {"correct": True, "attempts": -1}}})
    _put(content.encode())
    _quiz().answer("pick", "show")                             # a reveal raised too
    note = _one_line_about_it(capsys.readouterr().out, "The answer is 7.")
    assert "3 part(s) of the wrong shape" in note
    assert _asides()[0].read_text() == content
    assert _saved() == {**EARLIER, "02_x": {"ok": {"correct": True, "attempts": 1}},
                        "00_setup": {"pick": {"correct": False, "attempts": 0, "revealed": 1}}}


def test_notebook_07_path_reads_a_bad_file_without_raising(capsys):
    """What chapter 07's last cells run: the checklist, its summary, every quiz's tally."""
    items = [cl.Item("one", "First item", _quiz("07_test").questions,
                     {"per-param": (cl.Pointer("00_setup", "S"),), "pick": (cl.Pointer("00_setup", "S"),)})]
    checklist = cl.Checklist("07_test", items)
    _put(b'{"07_test": {"pick": {"correct": true, "attempts": 1}, "per-param": 7}, "00_setup": null}')
    view = checklist.view()                                  # AttributeError / TypeError before
    assert "[~] 1. First item (1/2)" in view and "      [x] pick" in view
    assert "per-param" in checklist.summary()
    assert cl.quiz_progress([_quiz(), checklist.quiz]) == (
        "[ ] 00_setup: 0 of 2 answered correctly\n[~] 07_test: 1 of 2 answered correctly")
    assert "[x] pick" in q.checklist([checklist.quiz])
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and "kept as progress.json.unreadable-" in out[0]     # said once
    assert len(_asides()) == 1 and _saved() == {"07_test": {"pick": {"correct": True, "attempts": 1}}}


# -- a cut-short or garbage file ---------------------------------------------------------------

@pytest.mark.parametrize("cut", ["truncated", "garbage", "empty"])
def test_unreadable_file_is_kept_aside_not_overwritten(cut, capsys):
    good = json.dumps(EARLIER, indent=1).encode()
    content = {"truncated": good[:-9], "garbage": b"\xff\xfe\x00 not json \x9c", "empty": b""}[cut]
    _put(content)
    assert _quiz().answer("pick", 2) is True
    note = _one_line_about_it(capsys.readouterr().out, "Correct. 7 has no divisor")
    assert "is not valid JSON" in note
    assert [a.read_bytes() for a in _asides()] == [content]   # before: overwritten, all progress lost
    assert _saved() == {"00_setup": {"pick": {"correct": True, "attempts": 1}}}


def test_a_second_bad_file_in_the_same_second_gets_its_own_name(capsys):
    for content in (b"[", b"{"):
        _put(content)
        progress.save_result("00_setup", "pick", True)
    assert sorted(a.read_bytes() for a in _asides()) == [b"[", b"{"]


# -- two processes saving at once --------------------------------------------------------------

SAVER_SCRIPT = """
import sys
from gpumem.course import progress
for i in range(300):
    progress.save_result("race", f"{sys.argv[1]}{i}", i % 2 == 0)
"""


def test_two_processes_saving_at_once_keep_every_entry():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", SAVER_SCRIPT, tag], env=env, cwd=ROOT) for tag in "ab"]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    race = _saved()["race"]
    assert len(race) == 600                                  # 10 to 18 of 600 before
    assert race["a0"] == {"correct": True, "attempts": 1} and race["b299"] == {"correct": False, "attempts": 1}
    assert sorted(p.name for p in _home().iterdir()) == ["progress.json", "progress.json.lock"]


# -- a folder that cannot be written, a lock held too long -------------------------------------

READ_ONLY_SCRIPT = """
from gpumem.course import quiz as q
quiz = q.Quiz("00_setup", [q.Numeric("per-param", "Bytes?", answer=16, unit="bytes", rel_tol=0,
                                     hint="Add.", explanation="2 + 2 + 12.")])
print(quiz.answer("per-param", 16))
print(q.checklist([quiz]))
"""


@posix_only
def test_read_only_home_answers_and_keeps_the_file():
    home = _home()
    path = _put(json.dumps(EARLIER).encode())
    cmd = [sys.executable, "-c", READ_ONLY_SCRIPT]
    if os.geteuid() != 0:                                    # root ignores permissions: mount it read-only
        home.chmod(0o555)
    elif shutil.which("unshare") and subprocess.run(["unshare", "-rm", "true"]).returncode == 0:
        cmd = ["unshare", "-rm", "sh", "-c", 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"',
               str(home), *cmd]
    else:
        pytest.skip("root without user namespaces: no read-only folder to be had")
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=60)
    finally:
        home.chmod(0o755)
    assert run.returncode == 0 and run.stderr == "", run.stderr     # OSError before feedback, before
    lines = run.stdout.splitlines()
    assert lines[0] == "Correct. 2 + 2 + 12."
    assert lines[1].startswith("Progress not saved (") and lines[1].endswith("; kept for this session.")
    assert lines[2] == "True" and "[x] per-param" in lines[4]        # in memory for the session
    assert json.loads(path.read_text()) == EARLIER and sorted(p.name for p in home.iterdir()) == ["progress.json"]


def test_missing_home_keeps_answers_for_the_session_and_saves_them_later(monkeypatch, capsys):
    blocker = _home()
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("a file where the folder should be")
    monkeypatch.setenv("GPUMEM_HOME", str(blocker / "home"))
    quiz = _quiz()
    assert quiz.answer("pick", 2) is True                    # NotADirectoryError before feedback, before
    note = _one_line_about_it(capsys.readouterr().out, "Correct.")
    assert note.startswith("Progress not saved (Not a directory") and "kept for this session" in note
    quiz.answer("per-param", "show")
    capsys.readouterr()
    assert "[x] pick" in q.checklist([quiz])
    assert cl.quiz_progress([quiz]) == "[~] 00_setup: 1 of 2 answered correctly, 1 answer(s) shown"
    blocker.unlink()                                         # the folder can be made now
    quiz.renew("per-param", quiet=True)
    quiz.answer("per-param", 16)
    assert capsys.readouterr().out == "Correct. 2 + 2 + 12.\n"
    assert _saved() == {"00_setup": {"pick": {"correct": True, "attempts": 1},
                                     "per-param": {"correct": True, "attempts": 1, "revealed": 1}}}


@posix_only
def test_a_lock_held_too_long_shows_feedback_and_keeps_the_answer(monkeypatch, capsys):
    import fcntl
    monkeypatch.setattr(progress, "LOCK_TIMEOUT", 0.2)
    quiz = _quiz()
    quiz.answer("pick", 1)
    capsys.readouterr()
    with open(_home() / "progress.json.lock", "w") as held:  # another process's save, stuck
        fcntl.flock(held, fcntl.LOCK_EX)
        assert quiz.answer("pick", 2) is True
        note = _one_line_about_it(capsys.readouterr().out, "Correct.")
        assert "progress.json.lock for over 0.2 s" in note
        fcntl.flock(held, fcntl.LOCK_UN)
    assert _saved()["00_setup"]["pick"] == {"correct": False, "attempts": 1}
    quiz.answer("per-param", 16)
    assert _saved()["00_setup"] == {"pick": {"correct": True, "attempts": 2},
                                    "per-param": {"correct": True, "attempts": 1}}


def test_widget_shows_feedback_and_the_failed_save(monkeypatch):
    from gpumem.course.quiz_widgets import question_widget
    _home().parent.mkdir(parents=True, exist_ok=True)
    _home().write_text("not a folder")
    monkeypatch.setenv("GPUMEM_HOME", str(_home() / "home"))
    quiz = _quiz()
    _, radio, buttons, out = question_widget(quiz, quiz._get("pick")).children
    radio.value = 2
    buttons.children[0].click()
    assert "Correct. 7 has no divisor" in out.value and "Progress not saved (" in out.value


# -- a save killed half-way --------------------------------------------------------------------

KILLED_SCRIPT = """
import sys
from gpumem.course import progress
for i in range(10**6):
    progress.save_result(sys.argv[1], f"q{i}", True)
"""


@posix_only
def test_a_save_killed_half_way_leaves_a_whole_file():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    path = _home() / "progress.json"
    for n, delay in enumerate((0.05, 0.15, 0.3)):             # before: 5 kills in 10 cut the file
        proc = subprocess.Popen([sys.executable, "-c", KILLED_SCRIPT, f"killed{n}"], env=env, cwd=ROOT)
        deadline = time.monotonic() + 60
        while f'"killed{n}"' not in (path.read_text() if path.exists() else ""):   # saving has begun
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert [len(_saved()[f"killed{i}"]) > 0 for i in range(n + 1)] == [True] * (n + 1)   # whole JSON
    progress.save_result("after", "q", True)                  # sweeps a left temporary file
    assert sorted(p.name for p in _home().iterdir()) == ["progress.json", "progress.json.lock"]


def test_a_file_with_a_byte_order_mark_is_read(tmp_path, monkeypatch):
    """Windows editors save UTF-8 with a BOM: the entries are the learner's and carry on."""
    from gpumem.course import progress
    monkeypatch.setenv("GPUMEM_HOME", str(tmp_path))
    entry = {"00_setup": {"q1": {"correct": True, "attempts": 2}}}
    (tmp_path / "progress.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(entry).encode())
    assert progress.load_progress()["00_setup"]["q1"] == entry["00_setup"]["q1"]
    assert not list(tmp_path.glob("progress.json.unreadable-*"))
