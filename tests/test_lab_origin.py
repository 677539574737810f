"""The labs' origin rule (gpumem.course.lab_origin, labs 06 and 08) in real Jupyter kernels.

Review r11 (reviews21/r11/lab08.md defect 2) beat lab 08's rule, which knew cells by their names,
four ways: a forged cell name with a linecache entry, a file written under /tmp/ipykernel_N/,
``GPUMEM_TEST_CELLS`` set from a cell, and a pasted copy (a known gap, left). In a kernel a cell is
now one IPython ran: its name is in the compiler's ``_filename_map`` and its code is what a source
in IPython's input history compiles to. These tests run each bypass in a kernel (ipykernel, as a
learner's notebook does), and the solution's kind of code (a cell's function) under a symlinked
TMPDIR (review r11 defect 1: macOS's /var -> /private/var refused every cell).
"""

import os
import sys
import textwrap

import pytest

from conftest import ROOT

jupyter_client = pytest.importorskip("jupyter_client")

SETUP = """
import linecache, os, sys, tempfile
from gpumem.course import lab_origin as O
from gpumem.chapters.ch08_finetuning import lab_guard as G
from gpumem.chapters.ch06_combining_strategies import lab06_guard as G6
def mine(x):
    return x + 1
SRC = "def forged(x):\\n    return x + 2\\n"
SPIN = "def forged(x):\\n    n = 0\\n    for i in range(3_000_000):\\n        n += i\\n    return n\\n"
def made(name, src=SRC, cache=True):
    if cache:
        linecache.cache[name] = (len(src), None, src.splitlines(True), name)
    g = {}
    exec(compile(src, name, "exec"), g)
    return g["forged"]
def guarded08(fn):
    try:
        return G.guarded(fn)(1)
    except RuntimeError as e:
        return "refused" if "neither a notebook cell nor an installed library" in str(e) else str(e)
def guarded06(fn):
    with G6.no_search() as changes:
        try:
            got = fn(1)
        except RuntimeError as e:
            got = "refused" if "neither a notebook cell nor an installed library" in str(e) else str(e)
    return got if not changes.foreign or got == "refused" else "caught"
"""

BYPASSES = """
d = os.path.join(tempfile.gettempdir(), f"ipykernel_{os.getpid()}")
os.makedirs(d, exist_ok=True)
with open(os.path.join(d, "101.py"), "w") as f:
    f.write(SRC)
cases = {
    "kernel": O.shell() is get_ipython(),
    "cell": O.allowed(mine.__code__),
    "forge": O.allowed(made("<lab08_finetune_recipe.ipynb cell 101>").__code__),
    "ipython-name": O.allowed(made("<ipython-input-3-0123456789ab>").__code__),
    "file": O.allowed(made(os.path.join(d, "101.py"), cache=False).__code__),
    "file+linecache": O.allowed(made(os.path.join(d, "102.py")).__code__),
    "compile.cache": O.allowed(made(get_ipython().compile.cache(SRC, 3)).__code__),
}
os.environ["GPUMEM_TEST_CELLS"] = os.pathsep.join(["<mine>", "<lab08_finetune_recipe.ipynb cell 103>"])
cases["env"] = O.allowed(made("<mine>").__code__)
cases["env+cell-name"] = O.allowed(made("<lab08_finetune_recipe.ipynb cell 103>").__code__)
cases["guard08-cell"] = guarded08(mine)
cases["guard08-forge"] = guarded08(made("<lab08_finetune_recipe.ipynb cell 104>"))
cases["guard06-cell"] = guarded06(mine)
cases["guard06-forge"] = guarded06(made("<lab06_choose_plan.ipynb cell 9>", SPIN))
with open(os.path.join(d, "spin_mod.py"), "w") as f:
    f.write(SPIN)
sys.path.insert(0, d)
import spin_mod
cases["guard06-module-file"] = guarded06(spin_mod.forged)
cases["real-cell-name"] = O.allowed(made(mine.__code__.co_filename).__code__)
print(repr(cases))
"""


def run_in_kernel(cells: list[str], env: dict | None = None) -> list[str]:
    """Each cell's stdout (and error, if any), run in a fresh ipykernel in the repository root."""
    km, kc = jupyter_client.manager.start_new_kernel(
        kernel_name="python3", startup_timeout=120, cwd=str(ROOT), env={**os.environ, **(env or {})})
    outs = []
    try:
        for cell in cells:
            got: list[str] = []

            def hook(msg, got=got):
                c = msg["content"]
                if msg["msg_type"] == "stream":
                    got.append(c["text"])
                elif msg["msg_type"] == "error":
                    got.append(f"ERROR {c['ename']}: {c['evalue']}")
            reply = kc.execute_interactive(textwrap.dedent(cell), output_hook=hook, timeout=300)
            outs.append("".join(got))
            assert reply["content"]["status"] == "ok", outs
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return outs


def _cases(env: dict | None = None) -> dict:
    import ast
    out = run_in_kernel([f"import sys; sys.path.insert(0, {str(ROOT)!r})", SETUP, BYPASSES], env)[-1]
    return ast.literal_eval(out.strip().splitlines()[-1])


def test_review_r11_bypasses_are_refused_in_a_kernel():
    """Before (r11, names only): forge, file and env all passed (8/8 with the AST copy). Now each is
    refused in a kernel; a cell's own function still runs under both guards."""
    got = _cases()
    assert got["kernel"] is True and got["cell"] is True, got
    assert got["guard08-cell"] == 2 and got["guard06-cell"] == 2, got
    refused = ["forge", "ipython-name", "file", "file+linecache", "compile.cache", "env", "env+cell-name",
               "real-cell-name"]
    assert {k: got[k] for k in refused} == dict.fromkeys(refused, False), got
    assert got["guard08-forge"] == "refused", got
    assert got["guard06-forge"] == "refused" and got["guard06-module-file"] == "refused", got


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks")
def test_cells_run_under_a_symlinked_tmpdir(tmp_path):
    """Review r11 defect 1 (macOS: TMPDIR behind a symlink): the kernel's cells are still cells, and
    the bypasses still refused."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    got = _cases({"TMPDIR": str(tmp_path / "link")})
    assert got["cell"] is True and got["guard08-cell"] == 2 and got["guard06-cell"] == 2, got
    assert got["forge"] is False and got["file"] is False and got["guard08-forge"] == "refused", got


def test_without_a_kernel_cells_are_known_by_name_and_in_memory_source():
    """The course's tests run cells with exec (tests/test_labs.py): a cell-shaped name whose source
    linecache holds in memory is a cell; ipykernel's name for another process, or a file on disk
    under a cell's name without that entry, is not."""
    import linecache
    import tempfile
    from gpumem.course import lab_origin as O
    assert O.shell() is None

    def made(name, cache=True):
        src = "def f():\n    return 1\n"
        if cache:
            linecache.cache[name] = (len(src), None, src.splitlines(True), name)
        g: dict = {}
        exec(compile(src, name, "exec"), g)
        return g["f"].__code__
    tmp = tempfile.gettempdir()
    assert O.allowed(made("<lab08_finetune_recipe.ipynb cell 7>"))
    assert O.allowed(made(os.path.join(tmp, f"ipykernel_{os.getpid()}", "7.py")))
    assert not O.allowed(made(os.path.join(tmp, "ipykernel_1", "7.py")))          # not this process's
    assert not O.allowed(made(os.path.join(tmp, f"ipykernel_{os.getpid()}", "8.py"), cache=False))
    assert not O.allowed(made("<mine>"))
