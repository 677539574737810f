"""gpumem.course.lab_reach: the static refusal of a learner's source that reaches into the grader.
The cheats are review r12's (lab 02: C rewrote the arrival clock through sys.modules, F took the
real handle with object.__getattribute__) and review r10's record edit (``__globals__``)."""

from pathlib import Path

import nbformat
import pytest

from gpumem.course.lab_reach import first_reach

CHEATS = {
    'import sys\nr = sys.modules["x"]\n': "line 2: uses the attribute .modules",
    "def f(w):\n    return object.__getattribute__(w, '_h')\n": "line 2: uses the attribute .__getattribute__",
    "g = dist.all_reduce.func.__globals__\n": "line 1: uses the attribute .__globals__",
    "c = f.__closure__[0].cell_contents\n": "line 1: uses the attribute .__closure__",
    "f.__kwdefaults__['rec'] = None\n": "line 1: uses the attribute .__kwdefaults__",
    "f.__code__ = g.__code__\n": "line 1: uses the attribute .__code__",
    "object.__setattr__(w, 'x', 1)\n": "line 1: uses the attribute .__setattr__",
    "import gc\n": "line 1: imports gc",
    "import inspect as i\n": "line 1: imports inspect",
    "from importlib import import_module\n": "line 1: imports from importlib",
    "m = __import__('os')\n": "line 1: uses __import__",
    "x = getattr(w, name)\n": "line 1: calls getattr with a name that is not a literal string",
    "setattr(m, 'ti' + 'me', 1)\n": "line 1: calls setattr with a name that is not a literal string",
    "x = getattr(m, '__globals__')\n": "line 1: a string names __globals__",
    "s = 'gpumem.chapters.ch02_zero.lab02_ranks'\n": "line 1: a string names 'gpumem'",
    "s = b'cgpumem.x'\n": "line 1: a string names 'gpumem'",
    "from sys import modules\n": "line 1: imports modules from sys",
    "import sys\nf = sys._getframe(1).f_globals\n": "line 2: uses the attribute .",      # _getframe or f_globals
    "v = vars(m)\n": "line 1: uses vars",
    "from functools import reduce\nx = reduce(getattr, ['a', 'b'], m)\n": "line 2: passes getattr around",
    "x = 1\n\n\ny = eval('x')\n": "line 4: uses eval",
}


@pytest.mark.parametrize("source", list(CHEATS))
def test_each_reach_is_refused_with_its_line(source):
    got = first_reach(source)
    assert got and got.startswith(CHEATS[source]), got
    assert "\n" not in got and "forbids reaching into the grader" in got


def test_the_first_offence_is_named():
    assert first_reach("a = 1\nimport gc\nb = f.__code__\n").startswith("line 2: imports gc")


def test_plain_code_passes():
    """What a solution uses: torch, dist, math, closures, getattr with a literal, the engine's
    queue_callback, a private torch module (measured at run time, not refused here)."""
    ok = '''
import math
import time
def install(params, shards, bucket):
    """Docstring."""
    engine = torch.autograd.Variable._execution_engine
    w = getattr(dist, "reduce_scatter_tensor")
    if hasattr(torch, "float32"):
        pass
    name = type(params).__name__
    from torch.utils._python_dispatch import _disable_current_modes
    f"{len(params)} modules of a model"
'''
    assert first_reach(ok) is None
    assert first_reach("def broken(:\n") is None           # running it says why


def test_the_lab02_solution_passes():
    cells = nbformat.read(Path(__file__).parents[1] / "solutions" / "lab02_zero2_hooks.ipynb", as_version=4).cells
    for cell in cells:
        if cell.cell_type == "code" and "### BEGIN SOLUTION" in cell.source:
            assert first_reach(cell.source) is None, first_reach(cell.source)


@pytest.mark.parametrize("line, word", [
    ("h = weakref.finalize._registry", "_registry"),
    ("works = handle.pop.__self__", "__self__"),
    ("store = dist.distributed_c10d._get_default_store()", "_get_default_store"),
    ("torch.utils._python_dispatch._get_current_dispatch_mode().paused = True", "_get_current_dispatch_mode"),
], ids=["finalize-registry", "bound-self", "default-store", "dispatch-mode"])
def test_review_r14_routes_are_refused(line, word):
    """Review r14 of lab 02: the real handle reached through weakref.finalize's registry and a bound
    method's __self__, the peer's progress read from the process group's store, the grader's meters
    paused through the current dispatch mode."""
    said = first_reach(f"def hook(p):\n    {line}\n")
    assert said is not None and said.startswith("line 2:") and word in said, said


@pytest.mark.parametrize("line, word", [
    ("T = p.grad.__class__", "__class__"),
    ("hook = sys.path_hooks[0]", "path_hooks"),
    ("spec = hook(folder).find_spec('answer_key')", "find_spec"),
    ("spec.loader.exec_module(key)", "exec_module"),
    ("spec = importlib.util.spec_from_file_location('k', path)", "spec_from_file_location"),
], ids=["class-of-a-tensor", "path-hooks", "find-spec", "exec-module", "spec-from-file"])
def test_review_r20_routes_are_refused(line, word):
    """Review r20: lab 02's ``Tensor.isnan`` patched through ``p.grad.__class__`` (put back before
    the case ended); lab 06's answer key, a test file, loaded through the import system's hooks."""
    said = first_reach(f"def f(p, folder, key, path):\n    {line}\n")
    assert said is not None and said.startswith("line 2:") and word in said, said


R25_SIGNAL = """
def _peek(keys, take):
    import asyncio.unix_events
    import traceback
    sig = asyncio.unix_events.signal
    box = []
    def handler(signum, frame):
        for fs in traceback.StackSummary.extract(traceback.walk_stack(frame), lookup_lines=False, capture_locals=True):
            seen = fs.locals or {}
            if all(k in seen for k in keys):
                box.append(seen[take]); return
    old = sig.signal(sig.SIGUSR1, handler)
    try:
        sig.raise_signal(sig.SIGUSR1)
    finally:
        sig.signal(sig.SIGUSR1, old)
    return box[0]
"""


@pytest.mark.parametrize("line, word", [
    ("sig = asyncio.unix_events.signal", ".signal"),
    ("sig = asyncio.unix_events.signal.raise_signal", "signal"),
    ("t = traceback.walk_stack(frame)", ".walk_stack"),
    ("t = traceback.StackSummary.extract(x, capture_locals=True)", ".StackSummary"),
    ("t = traceback.extract_stack(f)", ".extract_stack"),
    ("from traceback import walk_stack", "walk_stack"),
    ("from asyncio.unix_events import signal", "signal"),
], ids=["module-attribute", "raise-signal", "walk-stack", "stack-summary", "extract-stack",
        "import-walk-stack", "import-signal-from-a-module"])
def test_review_r25_signal_frame_routes_are_refused(line, word):
    """Review r25 of lab 08: a signal handler the call raises on itself gets the interrupted frame
    (no audit event fires), and traceback's walk of it with capture_locals read the grader's
    locals (15/15). ``import signal`` was refused; the module reached as another module's
    attribute, and traceback's stack walkers, were not."""
    said = first_reach(f"def f(asyncio, traceback, frame, x, f):\n    {line}\n")
    assert said is not None and said.startswith("line 2:") and word in said, said
    whole = first_reach(R25_SIGNAL)
    assert whole is not None and whole.startswith("line 5:") and ".signal" in whole, whole


@pytest.mark.parametrize("line, word", [
    ("from gpumem.course.registry import resolve", "gpumem.course.registry, the grading machinery"),
    ("import gpumem.course.registry as r", "imports gpumem.course.registry"),
    ("weakref.finalize(s, print)", ".finalize"),
    ("s.__del__()", ".__del__"),
], ids=["course-import-from", "course-import", "weakref-finalize", "del-attribute"])
def test_review_r26_routes_out_of_the_guarded_call_are_refused(line, word):
    """Review r26 of lab 08: ``gpumem.course.registry.resolve("traceback:walk_stack")`` named a
    refused function by a string, and a ``weakref.finalize`` on an object the grader drops after
    the call ran it outside the guard (15/15)."""
    said = first_reach(f"def f(s, weakref):\n    {line}\n")
    assert said is not None and said.startswith("line 2:") and word in said, said
    if "course" in line:          # graded definitions (lab_kernel); the kernel-wide scan allows the import
        from gpumem.course.lab_reach import COURSE, PACKAGE, course_import
        assert course_import(f"def f(s):\n    {line}\n").startswith("line 2: imports")
        assert first_reach(f"def f(s):\n    {line}\n", allow=(PACKAGE, COURSE)) is None
