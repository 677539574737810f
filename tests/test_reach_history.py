"""gpumem.course.lab_history: before a lab is graded in a kernel, every cell the kernel ran is read
for reaches into the grader (reviews r13, r14: closure cells, frame walks, ``__self__`` ...).

Each case runs its cells in a real IPython shell (``InteractiveShell``, the class ipykernel's shell
subclasses) in a fresh process, since the kernel, once seen, stays known to ``lab_origin``.
"""

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from gpumem.course import lab_history, lab_reach

ROOT = Path(__file__).resolve().parents[1]

_DRIVER = textwrap.dedent("""
    import json, sys
    from IPython.core.interactiveshell import InteractiveShell
    sh = InteractiveShell.instance()
    for cell in json.loads(sys.argv[1]):
        sh.run_cell(cell, store_history=True)
    sh.run_cell("from gpumem.course import lab_history as _lh\\n_verdict = _lh.first_reach()", store_history=True)
    print("VERDICT", json.dumps(sh.user_ns.get("_verdict")))
    sh.run_cell("from gpumem.chapters import check_lab\\n"
                "try:\\n    check_lab('lab01_memory_calculator', {}, show=False)\\n"
                "except Exception as e:\\n    _err = type(e).__name__ + ': ' + str(e)\\n", store_history=True)
    print("CHECK", json.dumps(sh.user_ns.get("_err")))
""")


def run_cells(*cells: str) -> tuple:
    """The scan's verdict after ``cells`` ran in an IPython shell, and what ``check_lab`` raised."""
    with tempfile.TemporaryDirectory() as here:          # a cell may write a file of its own
        proc = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(list(cells))], capture_output=True,
                              text=True, timeout=240, cwd=here)
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line.startswith(("VERDICT", "CHECK")))
    assert "VERDICT" in lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(lines["VERDICT"]), json.loads(lines["CHECK"])


def test_a_learners_ordinary_cells_pass_and_a_reach_is_refused_before_grading():
    """One process for both: plain cells (magics, globals(), getattr with a literal) are not read as
    reaches; after a cell that walks to a closure, check_lab grades nothing and names the cell."""
    verdict, err = run_cells("import torch\nx = torch.ones(3)", "%time y = x * 2",
                             "ns = globals()\nn = getattr(x, 'shape')")
    assert verdict is None
    assert "Reached" not in str(err)                 # the empty namespace fails later, in the lab's check
    verdict, err = run_cells("def f():\n    pass", "import sys\nm = sys.modules['gpumem.course.grading']")
    assert verdict.startswith("cell [2] (import sys)") and "modules" in verdict
    assert err.startswith("Reached: cell [2]") and "Nothing was graded" in err


ROUTES = [
    (["%%capture\nimport gc\nobjs = gc.get_objects()"], "get_objects"),                  # a cell magic's body
    (["get_ipython().run_cell('import inspect; f = inspect.currentframe()')"], "currentframe"),  # handed to IPython
    (["src = 'import sys'\nget_ipython().run_cell(src)"], "built at run time"),
    (["%run /nonexistent/helper.py"], "cannot read"),
    # a learner's own module or script is read like a cell
    (["open('mine_r15.py', 'w').write('x = 1\\n')", "import mine_r15"], "a module of your own is loaded"),
    (["open('mine_r15b.py', 'w').write('import timeit\\n')", "%run mine_r15b.py"], "imports timeit"),
    (["a = In[1]"], "uses In"),
    # review r15 of lab 04: a grader's table mutated; the module imported in another cell
    (["from gpumem.chapters.ch04_flash_attention import labops", "labops._SAME.add('bmm')"], "._SAME"),
    # a helper process started from a cell (review r13, labs 03 and 05): none is needed
    (["!sleep 0 &"], ".system"), (["%%bash\nsleep 1 &"], "%bash"), (["import subprocess"], "imports subprocess"),
    (["import os\nif False:\n    os.fork()"], ".fork"),
    # a cell that rubs itself out of the parsed and typed history is still read in the other records
    (["h = get_ipython().history_manager\nh.input_hist_parsed[-1] = 'pass'\nh.input_hist_raw[-1] = 'pass'"],
     "history_manager"),
]

_MANY = textwrap.dedent("""
    import json, os, sys, tempfile
    from IPython.core.interactiveshell import InteractiveShell
    for i, cells in enumerate(json.loads(sys.argv[1])):
        here = tempfile.mkdtemp()
        os.chdir(here)
        InteractiveShell.clear_instance()                 # a fresh shell: its own history and names
        sh = InteractiveShell.instance()
        for cell in cells:
            sh.run_cell(cell, store_history=True)
        sh.run_cell("from gpumem.course import lab_history as _lh\\n_verdict = _lh.first_reach()",
                    store_history=True)
        print("VERDICT", i, json.dumps(sh.user_ns.get("_verdict")), flush=True)
        for name, module in list(sys.modules.items()):   # the case's own modules leave with it
            if str(getattr(module, "__file__", "")).startswith(here):
                del sys.modules[name]
""")


@pytest.fixture(scope="module")
def route_verdicts():
    """The scan's verdict on every case of :data:`ROUTES`, each in a fresh IPython shell of one
    process (a process per case cost about 6 s each on 2 cores)."""
    with tempfile.TemporaryDirectory() as ipython_dir:
        proc = subprocess.run([sys.executable, "-c", _MANY, json.dumps([cells for cells, _ in ROUTES])],
                              capture_output=True, text=True, timeout=600, cwd=ipython_dir,
                              env={**os.environ, "IPYTHONDIR": ipython_dir})
    found = {int(line.split(" ", 2)[1]): json.loads(line.split(" ", 2)[2])
             for line in proc.stdout.splitlines() if line.startswith("VERDICT")}
    assert len(found) == len(ROUTES), proc.stdout[-2000:] + proc.stderr[-3000:]
    return found


@pytest.mark.parametrize("case", range(len(ROUTES)), ids=[named for _, named in ROUTES])
def test_routes_around_the_scan_are_refused(case, route_verdicts):
    verdict, named = route_verdicts[case], ROUTES[case][1]
    assert verdict is not None and named in verdict, verdict


def test_without_a_kernel_nothing_is_read():
    assert lab_history.first_reach() is None


def test_every_cell_of_every_solution_passes_the_scan():
    """A learner who writes the labs as the solutions do is never refused (the check cell's
    ``globals()`` is allowed; lab 02's given cell shows the grader's source without ``inspect``)."""
    for path in sorted((ROOT / "solutions").glob("lab*.ipynb")):
        cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        sources = ["\n".join(ln for ln in "".join(c["source"]).splitlines() if not ln.lstrip().startswith(("%", "!")))
                   for c in cells]
        bound = frozenset().union(*(lab_history.gpumem_names(src) for src in sources))   # imported in any cell
        for i, src in enumerate(sources):
            assert lab_history._reach(src, ours=bound) is None, (path.name, i)


def test_the_scan_refuses_what_the_reviews_used():
    """The closure swap (r13, lab 04), the frame walk (r13), the handle behind ``__self__`` (r14)."""
    for src in ("import sys\nlg = sys.modules['gpumem.chapters.ch04_flash_attention.labguard']",
                "cell = f.__closure__[0]\ncell.cell_contents = g",
                "import sys\nframe = sys._getframe(1)",
                "import weakref\nreg = weakref.finalize._registry",
                "getattr(f, '__clo' + 'sure__')"):
        assert lab_history._reach(src), src
    assert lab_reach.first_reach("x = globals()") and not lab_history._reach("x = globals()")


@pytest.mark.parametrize("typed, refused", [
    # what a learner writes to look around (review r15 of labs 01, 02, 05): let through
    ("import gc\ngc.collect()", False), ("n = sum(1 for m in net.modules())", False),
    ("import inspect\nprint(inspect.getsource(f), inspect.signature(f))", False),
    ("!nvidia-smi", False), ("!grep -n MIN_AIO_BYTES utils.py", False), ("%%bash\nls /tmp\ncat x\n", False),
    ("import platform\nplatform.system()", False), ("from multiprocessing import dummy", False),
    ("%timeit -n 3 f(x)", False), ("%%timeit\ny = f(x)", False), ("%time y = f(x)", False),
    ("%timeit sys.modules['x']", True), ("%timeit -n 3 -r1 sys.modules['x']", True), ("%timeit -q -n3 x - 1", False), ("%pip list", False), ("!pip list", False), ("import pdb\npdb.set_trace()", True), ("breakpoint()", True), ("%pip install ./mine", True),
    ("%alias helper python helper.py", True), ("import uuid\nuuid._get_command_stdout('sh', '-c', 'x &')", True), ("import threading\nstart = threading._start_new_thread", True), ('def f():\n    """Like gpumem\'s count."""', False),
    # what reaches, or starts a process, spelled another way (reviews r15 of labs 01, 02, 05): refused
    ("import gc\nobjs = gc.get_objects()", True), ("import inspect\nf = inspect.currentframe()", True),
    ("import timeit\ntimeit.Timer(src).timeit(1)", True), ("import code", True),
    ("import os\ngetattr(os, 'system')('helper &')", True), ("getattr(os, 'fork')()", True),
    ("getattr(get_ipython(), 'system')('x')", True), ("import webbrowser", True), ("import _posixsubprocess", True),
    ("from torch.utils.cpp_extension import load_inline", True), ("!python helper.py", True),
    ("!grep x y | sh", True), ("%%bash\nls\npython x.py &", True), ("!pip install x", True),
    ("import sys\nm = sys.modules", True),
])
def test_ordinary_cells_pass_and_other_spellings_do_not(typed, refused):
    from IPython.core.inputtransformer2 import TransformerManager
    source = TransformerManager().transform_cell(typed)
    assert bool(lab_history._reach(source)) is refused, (typed, lab_history._reach(source))
