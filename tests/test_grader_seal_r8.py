"""Review r8's in-kernel cheats, each refused (labs 04, 05, 06, 08: /work/notes/reviews21/r8,
reviews23/expert_08_r2.md). Each passed every row before this file's fixes:

* a lab module's table emptied in an earlier cell (``lab_guard.BLOCKED.clear()``: the library's
  counts no longer refused; lab 04's ``labexp2._PLAIN``);
* a ``functools.wraps`` wrapper recording what the grader computes (``offload_time.step_time``,
  ``planner.search.plan``): ``inspect.unwrap`` saw the original under it;
* a trace hook set in an earlier cell, rewriting the grader's variables as it compares;
* code compiled under a gpumem file name, trusted by the audit hook to read the grader's frames;
* a worker thread started in an earlier cell, fed by a queue; a raw ``_thread`` started inside
  the call, where the per-thread watch does not reach.
"""

import functools
import queue
import sys
import threading

import types

import pytest

from gpumem import chapters
from gpumem.course import genuine, grader_seal, lab_audit
from gpumem.chapters.ch04_flash_attention import labexp2
from gpumem.chapters.ch08_finetuning import lab_guard as guard08
from gpumem.planner import search
from gpumem.timing import offload_time

LAB = "lab08_finetune_recipe"


def _refused(match: str):
    with pytest.raises(grader_seal.GraderChanged, match=match):
        chapters.check_lab(LAB, {}, show=False)


def test_a_cleared_table_is_refused():
    with pytest.raises((AttributeError, TypeError)):
        dict.clear(guard08.BLOCKED)               # read-only since review r18 (dict.clear through any name)
    saved = guard08.BLOCKED
    guard08.BLOCKED = types.MappingProxyType({})  # ... so rebound: named
    try:
        _refused("lab_guard.BLOCKED")
    finally:
        guard08.BLOCKED = saved
    plain = labexp2._PLAIN                        # review r8 of lab 04: the exp rule's table
    with pytest.raises(AttributeError):
        plain.clear()                             # a frozenset since review r15: cleared in place, never
    labexp2._PLAIN = frozenset()                  # ... so rebound: named too
    try:
        assert "gpumem.chapters.ch04_flash_attention.labexp2._PLAIN" in grader_seal.changed()
    finally:
        labexp2._PLAIN = plain
    assert grader_seal.changed() == []


def test_a_table_the_kernel_extends_is_not_a_change():
    """lab 05's guard adds the lab's own modules to BLOCKED as they load (keep(), through its own
    table): more entries are fine, and BLOCKED shows them."""
    from gpumem.chapters.ch05_offload import lab_guard as guard05
    guard05._TABLE[("nowhere.py", "f")] = "an extra refusal"
    try:
        assert guard05.BLOCKED[("nowhere.py", "f")] == "an extra refusal"
        assert grader_seal.changed() == []
    finally:
        del guard05._TABLE[("nowhere.py", "f")]


@pytest.mark.parametrize("module, name", [(offload_time, "step_time"), (search, "plan")])
def test_a_recording_wrapper_is_refused(module, name):
    original, seen = getattr(module, name), []

    @functools.wraps(original)
    def recording(*args, **kwargs):
        seen.append(args)
        return original(*args, **kwargs)
    setattr(module, name, recording)
    try:
        _refused(f"{module.__name__}.{name}")
    finally:
        setattr(module, name, original)
    assert grader_seal.changed() == []


def test_code_compiled_under_a_gpumem_file_name_is_not_genuine():
    ns = {}
    exec(compile("def step_time(*a, **k):\n    return 0.0\n", offload_time.__file__, "exec"), ns)
    assert not genuine.genuine(ns["step_time"].__code__)
    assert genuine.genuine(offload_time.step_time.__code__)
    original = offload_time.step_time
    offload_time.step_time = ns["step_time"]
    try:
        _refused("offload_time.step_time")
    finally:
        offload_time.step_time = original


def test_a_function_in_a_file_of_the_learners_is_not_genuine(tmp_path):
    """Defined by its own file, but not gpumem's nor the installed Python's."""
    path = tmp_path / "mine.py"
    path.write_text("def f():\n    return 1\n")
    ns = {}
    exec(compile(path.read_text(), str(path), "exec"), ns)
    assert not genuine.genuine(ns["f"].__code__)


def test_a_trace_hook_is_refused():
    sys.settrace(lambda *a: None)
    try:
        _refused("a trace or profile hook is set .sys.settrace")
    finally:
        sys.settrace(None)


def _call_watched(fn):
    hits: list[str] = []
    with pytest.raises(RuntimeError) as err:
        with lab_audit.refusing("refused", hits):
            fn()
            if hits:
                raise RuntimeError(hits[0])
    return hits, str(err.value)


def test_frames_read_by_code_under_a_gpumem_file_name_are_refused():
    ns = {}
    exec(compile("import sys\ndef peek():\n    return sys._getframe(2).f_locals\n",
                 offload_time.__file__, "exec"), ns)
    hits, message = _call_watched(ns["peek"])
    assert "stack frames" in message


def test_a_worker_thread_left_running_refuses_the_call():
    jobs: queue.Queue = queue.Queue()
    worker = threading.Thread(target=lambda: jobs.get(), daemon=True, name="my-worker")
    worker.start()
    try:
        hits, message = _call_watched(lambda: None)
        assert "a thread your cells started is running (my-worker" in message
    finally:
        jobs.put(None)
        worker.join(5)
    assert not lab_audit.foreign_threads()


def test_a_thread_started_inside_the_call_is_refused():
    import _thread
    done = threading.Event()
    hits, message = _call_watched(lambda: _thread.start_new_thread(done.set, ()))
    assert "it started a thread" in message and not done.is_set()
    hits, message = _call_watched(lambda: threading.Thread(target=done.set).start())
    assert "it started a thread" in message and not done.is_set()


def test_the_kernels_own_threads_and_gpumems_are_not_foreign():
    """gpumem's case-limit watchdog and a gpumem-started thread pass; nothing else runs here."""
    from gpumem.course import case_limits
    with case_limits.time_limit(5):
        pass
    assert lab_audit.foreign_threads() == []


def test_user_site_packages_are_installed_code():
    """A package installed with ``pip install --user`` (a shared workshop machine) is the installed
    Python's code, as site-packages is; a learner's file in /tmp or the notebooks' folder is not."""
    import os
    import site
    from pathlib import Path

    assert genuine.trusted(os.path.join(site.getusersitepackages(), "typing_extensions.py"))
    assert genuine.trusted(os.path.join(site.getsitepackages()[0], "torch", "__init__.py"))
    assert not genuine.trusted("/tmp/learner/typing_extensions.py")
    assert not genuine.trusted(str(Path(__file__).parents[1] / "labs" / "helper.py"))
