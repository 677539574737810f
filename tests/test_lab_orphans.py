"""A helper process double-forked by the learner's cells is refused (issue 21, review r11).

Review r11: a cell forks, the child calls ``setsid`` and forks again, the middle exits; the
grandchild is re-parented to init (or the nearest subreaper) and is no longer the kernel's child,
so ``lab_audit.foreign_children`` missed it, and it answered the grader through a pipe (lab 01
31/31, lab 03's choose_saved 15/15). Here real double-forked helpers (no mocks): refused by name
through :mod:`gpumem.course.lab_orphans` (started before any check: the orphan found by its
environment; after one: adopted by the subreaper kernel), end to end by lab 01's and lab 03's
graders; and what the course runs itself (a finished ``subprocess.run``, a ``multiprocessing``
child that has exited, a program of another terminal) is not refused, nor its exit status stolen.
"""

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import ROOT
from gpumem.course import lab_audit, lab_orphans

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork, setsid and /proc")
REFUSED = "a process your cells started is running (pid {pid}: "


class Helper:
    """The reviewer's helper: fork, setsid, fork again, the middle exits; the grandchild calls
    ``ns``'s functions for whoever asks through a pipe (its own copy of the namespace: a fork)."""

    def __init__(self, ns: dict | None = None):
        q_r, q_w = os.pipe()
        a_r, a_w = os.pipe()
        middle = os.fork()
        if middle == 0:
            try:
                os.setsid()
                if os.fork() == 0:
                    os.close(q_w)
                    os.close(a_r)
                    self._serve(ns or {}, os.fdopen(q_r, "rb"), os.fdopen(a_w, "wb"))
            finally:
                os._exit(0)
        os.waitpid(middle, 0)
        os.close(q_r)
        os.close(a_w)
        self._ask, self._get = os.fdopen(q_w, "wb"), os.fdopen(a_r, "rb")
        self.pid = pickle.load(self._get)

    @staticmethod
    def _serve(ns, ask, answer):
        pickle.dump(os.getpid(), answer)
        answer.flush()
        while True:
            try:
                name, args, kwargs = pickle.load(ask)
            except EOFError:
                return
            try:
                out = ns[name](*args, **kwargs)
            except BaseException as e:       # noqa: BLE001 - sent back as text
                out = RuntimeError(repr(e))
            pickle.dump(out, answer)
            answer.flush()

    def proxy(self, name: str):
        def answer(*args, **kwargs):
            pickle.dump((name, args, kwargs), self._ask)
            self._ask.flush()
            out = pickle.load(self._get)
            if isinstance(out, Exception):
                raise out
            return out
        answer.__name__ = name
        return answer

    def parent(self) -> int:
        return lab_orphans._stat(self.pid)[0]

    def stop(self):
        for f in (self._ask, self._get):
            f.close()
        os.kill(self.pid, signal.SIGKILL)
        for _ in range(500):                 # gone, or a zombie: ours (adopted) to collect, else init's
            try:
                ppid, _, state = lab_orphans._stat(self.pid)
            except OSError:
                return
            if state == "Z":
                if ppid == os.getpid():
                    os.waitpid(self.pid, 0)
                return
            time.sleep(0.01)


def _refusal(hits: list) -> str:
    with pytest.raises(RuntimeError) as e:
        with lab_audit.refusing("refused", hits):
            pass
    return str(e.value)


# A fresh interpreter (no subreaper yet) that double-forks as a learner's first cell would, run
# through sh so that its orphan lands above its parent (init, or a subreaper pytest above it).
_SCRIPT = textwrap.dedent("""
    import json, os, signal, subprocess, sys, multiprocessing
    sys.path.insert(0, {tests!r})
    from test_lab_orphans import Helper
    from gpumem.course import lab_audit, lab_orphans
    out = {{}}
    early = Helper()                                   # before any check: re-parented away
    out["early"] = early.pid
    out["early_parent"] = early.parent()
    out["children_before"] = lab_audit.foreign_children()
    out["orphans_before"] = lab_orphans.orphans()
    subprocess.run(["setsid", "-f", "sleep", "60"], check=True)    # exec'd, os.environ: the token
    out["orphans_exec"] = lab_orphans.orphans()
    # /proc lists pids in order, and pids wrap: the sleep may sort before the helper
    exec_pid = int(next(o for o in out["orphans_exec"] if "sleep 60" in o).split()[1].rstrip(":"))
    os.kill(exec_pid, signal.SIGKILL)
    while lab_orphans._stat(exec_pid)[2] != "Z":
        pass
    print(json.dumps({{"ready": early.pid}}), flush=True)
    sys.stdin.readline()                               # the test starts another terminal's program
    out["orphans_with_strangers"] = lab_orphans.orphans()
    lab_orphans._LINUX, _ = False, lab_orphans._SELF.clear()     # macOS's way: psutil, no /proc
    out["orphans_psutil"] = lab_orphans.orphans()
    lab_orphans._LINUX, _ = True, lab_orphans._SELF.clear()
    hits = []
    try:
        with lab_audit.refusing("refused", hits):
            pass
    except RuntimeError as e:
        out["refused_early"] = str(e)
    early.stop()
    # after a check in a kernel: it is a subreaper (install() -> adopt()), and a new helper is adopted
    lab_orphans.adopt(True)
    late = Helper()
    out["late"], out["late_parent"] = late.pid, late.parent()
    hits = []
    try:
        with lab_audit.refusing("refused", hits):
            pass
    except RuntimeError as e:
        out["refused_late"] = str(e)
    os.kill(late.pid, signal.SIGKILL)
    while lab_orphans._stat(late.pid)[2] != "Z":
        pass
    del late                                           # an object holding its pid would keep it
    out["reaped"] = lab_orphans.reap()                 # its zombie: collected
    # the course's own processes: finished, or exited and not yet waited for
    subprocess.run(["true"], check=True)
    held = subprocess.Popen(["sh", "-c", "exit 3"])
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=sys.exit, args=(7,))
    child.start()
    while any(lab_orphans._stat(p)[2] != "Z" for p in (held.pid, child.pid)):
        pass
    out["reaped_held"] = lab_orphans.reap()
    hits = []
    with lab_audit.refusing("refused", hits):
        pass
    out["hits"] = hits
    out["codes"] = [held.wait(), (child.join(), child.exitcode)[1]]
    print(json.dumps(out), flush=True)
""")


def test_a_helper_double_forked_before_any_check_and_one_after_are_refused():
    env = dict(os.environ, JPY_PARENT_PID=str(os.getpid()), PYTHONPATH=str(ROOT))   # as Jupyter's kernels
    script = _SCRIPT.format(tests=str(ROOT / "tests"))
    run = subprocess.Popen(["sh", "-c", f'"{sys.executable}" -c "$0"; exit $?', script], cwd=ROOT, env=env,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    strangers = []
    try:
        ready = json.loads(run.stdout.readline())
        assert "ready" in ready, ready
        # programs of another terminal, started after the "kernel", landing where its orphans land
        strangers = [subprocess.Popen(["sleep", "60"], env={"PATH": os.environ["PATH"]}),
                     subprocess.Popen(["sleep", "60"])]
        run.stdin.write("go\n")
        run.stdin.flush()
        out, _ = run.communicate(timeout=60)
    finally:
        for p in strangers:
            p.kill()
            p.wait()
        if run.poll() is None:
            run.kill()
    got = json.loads(out.splitlines()[-1])
    assert run.returncode == 0, out
    early, late = got["early"], got["late"]
    assert got["early_parent"] != early and got["children_before"] == [], got    # not the kernel's child
    assert len(got["orphans_before"]) == 1 and got["orphans_before"][0].startswith(f"pid {early}: "), got
    assert len(got["orphans_exec"]) == 2, got
    assert sorted("sleep 60, re-parented" in o for o in got["orphans_exec"]) == [False, True], got
    assert len(got["orphans_with_strangers"]) == 1 and f"pid {early}:" in got["orphans_with_strangers"][0], got
    assert got["orphans_psutil"] == got["orphans_with_strangers"], got
    assert f"refused ({REFUSED.format(pid=early)}" in got["refused_early"], got
    assert got["late_parent"] not in (early, os.getpid()), got               # the script adopted it
    assert f"refused ({REFUSED.format(pid=late)}" in got["refused_late"], got
    assert got["reaped"] == [late], got
    assert got["reaped_held"] == [] and got["hits"] == [], got               # nothing held is collected
    assert got["codes"] == [3, 7], got                                       # their exit status kept


@pytest.fixture
def adopting():
    """This process adopts orphans, as a kernel does once a check ran; put back after."""
    assert lab_orphans.adopt(True)
    try:
        yield
    finally:
        lab_orphans.adopt(False)
        lab_orphans.reap()


def test_an_adopted_helper_in_this_process_is_refused_and_its_zombie_collected(adopting):
    helper = Helper()
    try:
        assert helper.parent() == os.getpid()      # adopted: the kernel's child, though never forked by it
        message = _refusal([])
        assert REFUSED.format(pid=helper.pid) in message, message
    finally:
        os.kill(helper.pid, signal.SIGKILL)
        while lab_orphans._stat(helper.pid)[2] != "Z":
            time.sleep(0.01)
    pid = helper.pid
    del helper                               # an object holding the pid (its own Popen) keeps it
    assert pid in lab_orphans.reap()
    hits: list = []
    with lab_audit.refusing("refused", hits):
        subprocess.run  # noqa: B018 - nothing runs: the check passes
    assert hits == []


def test_the_course_own_processes_are_not_refused(adopting):
    import multiprocessing
    subprocess.run(["true"], check=True)
    subprocess.run(["sh", "-c", "sleep 0.01 & exit 0"], check=True)      # its orphan ends: a zombie here
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=sys.exit, args=(5,))
    child.start()
    child.join()
    time.sleep(0.2)
    hits: list = []
    with lab_audit.refusing("refused", hits):
        pass
    assert hits == [] and child.exitcode == 5
    assert lab_orphans.orphans() == [] and lab_audit.foreign_children() == []
    assert all(lab_orphans._stat(p)[2] != "Z" for p in lab_orphans.children())   # the sleep's zombie reaped


def test_only_a_kernel_adopts_when_installed():
    """A test run or a script grading in-process is no subreaper (init reaps its orphans at once);
    an IPython kernel is, once the audit is installed."""
    lab_audit.install()
    assert not lab_orphans.in_kernel()
    libc = __import__("ctypes").CDLL(None)
    flag = __import__("ctypes").c_int(-1)
    assert libc.prctl(37, __import__("ctypes").byref(flag), 0, 0, 0) == 0 and flag.value == 0   # GET_CHILD_SUBREAPER


# ---- end to end: the reviewer's helper answering for the solution, per lab ----------------------

def _grade_through(helper_ns: dict, names: tuple, grade, function: str):
    """Grade with ``names`` answered by a double-forked helper holding ``helper_ns``: the first row
    of ``function`` is refused, naming the helper's pid."""
    helper = Helper(helper_ns)
    try:
        ns = dict(helper_ns, **{n: helper.proxy(n) for n in names})
        report = grade(ns)
        rows = [r for r in report.rows if r.function == function]
        assert rows and rows[0].status != "ok", report.summary()
        assert REFUSED.format(pid=helper.pid) in rows[0].detail, rows[0].detail
        assert not report.solved
    finally:
        helper.stop()
    return report


def test_lab01_refuses_the_double_forked_helper():
    """Review r11: the helper answered model_state_bytes, layer_activation_bytes and variant_layer
    (31/31); each function's first row now names it."""
    from gpumem.chapters.ch01_memory_anatomy import labcheck
    from test_lab01_adversarial import solution
    names = ("model_state_bytes", "layer_activation_bytes", "variant_layer")
    report = _grade_through(solution(), names, lambda ns: labcheck.check(ns, show=False, seed=0), names[0])
    for name in names:
        first = next(r for r in report.rows if r.function == name)
        assert "a process your cells started is running" in first.detail, report.summary()


def test_lab03_choose_saved_refuses_the_double_forked_helper():
    """Review r11: the helper answered choose_saved (15/15); graded alone, its first row names it."""
    from gpumem.chapters.ch03_activation_checkpointing import labcheck
    from test_labs import notebook_namespace
    sol = notebook_namespace(ROOT / "solutions" / "lab03_checkpoint_budget.ipynb")
    _grade_through({"choose_saved": sol["choose_saved"]}, ("choose_saved",),
                   lambda ns: labcheck.check(ns, show=False, seed=0), "choose_saved")


_FIRST_CELL = """
import os, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(w, str(os.getpid()).encode() + b"\\n")
        time.sleep(120)
    os._exit(0)
os.wait()
print("HELPER", os.read(r, 32).decode().strip())
"""
_CHECK_CELL = """
import ctypes
from gpumem.course import lab_audit, lab_orphans
for _ in range(2):
    try:
        with lab_audit.refusing("refused", []):
            print("PASSED")
    except RuntimeError as e:
        print("REFUSED", e)
flag = ctypes.c_int(-1)
ctypes.CDLL(None).prctl(37, ctypes.byref(flag), 0, 0, 0)
print("SUBREAPER", flag.value, lab_orphans.in_kernel())
"""


def test_in_a_jupyter_kernel_a_first_cells_helper_is_refused_and_the_kernel_adopts():
    """A real kernel (jupyter_client, as nbval and the notebook runner start one): a helper
    double-forked in the first cell, before gpumem is imported, refuses the check by its pid; the
    check made the kernel a subreaper."""
    from jupyter_client.manager import start_new_kernel
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(ROOT))
    out: list = []
    hook = lambda m: out.append(m["content"].get("text", "")) if m["msg_type"] == "stream" else None  # noqa: E731
    helper = None
    try:
        kc.execute_interactive(_FIRST_CELL, timeout=60, output_hook=hook)
        helper = int("".join(out).split("HELPER")[1].split()[0])
        assert lab_orphans._stat(helper)[0] != km.provisioner.process.pid
        kc.execute_interactive(_CHECK_CELL, timeout=120, output_hook=hook)
        text = "".join(out)
        assert text.count(f"refused ({REFUSED.format(pid=helper)}") == 2, text
        assert "SUBREAPER 1 True" in text, text
    finally:
        if helper:
            os.kill(helper, signal.SIGKILL)
        kc.stop_channels()
        km.shutdown_kernel(now=True)
