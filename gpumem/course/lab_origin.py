"""The labs' origin rule: while a learner's function is graded, only a notebook cell's code and
installed code may run (labs 05, 06 and 08; review r10: a generic AST rewrite of the library, exec'd
under another name, beat every content match).

:func:`allowed` is True for a code object that

* a cell defines. In a running IPython kernel (:func:`shell`) that is decided by IPython's own
  records, not by names: the code's file name must be one IPython's compiler gave a cell
  (``shell.compile._filename_map``, filled by ``CachingCompiler.cache`` for every cell run), and the
  code must be what a source in IPython's input history (``history_manager.input_hist_parsed``,
  the cells the kernel ran) compiles to: same qualified name, bytecode, names and constants
  (:func:`gpumem.course.genuine.same`). A name forged in a cell (``compile(src, "<lab.ipynb cell
  9>")`` with a ``linecache`` entry), a file written under ``/tmp/ipykernel_N/``, a source registered
  through ``get_ipython().compile.cache(src)``, or another source compiled under a real cell's
  name is refused (review r11). The kernel is known by IPython's ``run_code`` on the grader's stack
  (its genuine code, :func:`note_kernel`), or ipykernel's application; once seen it stays known.
  Without a kernel (the course's tests, which run cells with ``exec``) a cell is a name shaped like
  one (:data:`_CELL`: ipykernel's ``<tempdir>/ipykernel_<this pid>/<n>.py``, the tempdir as
  ``tempfile`` gives it or resolved, so a symlinked TMPDIR as on macOS works; IPython's
  ``<ipython-input-…>``; the tests' ``<… .ipynb cell i>``) whose source ``linecache`` holds in
  memory, or a name in ``GPUMEM_TEST_CELLS`` (os.pathsep-separated; read only without a kernel
  and outside the fresh grading process, so a cell or graded code that sets it changes nothing);
* an installed file defines (:func:`gpumem.course.genuine.genuine`: gpumem's or the installed
  Python's file, compiled afresh), the interpreter has frozen, or the standard library writes
  itself (a dataclass's methods, a namedtuple's ``__new__``).

Known gaps: a rewritten copy *pasted* into a cell (or run as a cell through
``get_ipython().run_cell``, which is pasting) is a cell's code; so is code whose source a cell
writes into IPython's own records (``history_manager.store_inputs`` and ``compile.cache``: the
kernel keeps no other record of what it ran). Without a kernel names are taken at their word.
"""

import ast
import linecache
import os
import re
import sys
import tempfile
import types
from functools import lru_cache

from gpumem.course import genuine

_TMP = "|".join(sorted({re.escape(tempfile.gettempdir()), re.escape(os.path.realpath(tempfile.gettempdir()))}))
# A notebook cell's file name: ipykernel's (a temporary folder per kernel, a number per cell),
# IPython's, the course's tests' (tests/test_labs.py). ipykernel names cells under
# tempfile.gettempdir() as it is, not resolved: both forms are taken (review r11, macOS).
_CELL = re.compile(r"<ipython-input-\d+-[0-9a-f]+>|<[^<>]+\.ipynb cell \d+>|"
                   + f"(?:{_TMP})" + r"[/\\]ipykernel_(\d+)[/\\]\d+\.py")
_CELL_NAME = os.environ.get("IPYKERNEL_CELL_NAME")        # ipykernel's one name for every cell, read once
_KERNEL: list = []        # the IPython shell running the notebook, once seen
_ASYNC = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)
# The fresh grading process (gpumem.course.lab_fresh), known at import, before any learner code runs
# there: ``GPUMEM_TEST_CELLS`` is not read (review r16 of lab 08: graded code set it).
_APART = os.environ.get("GPUMEM_GRADING_APART") == "1"


def allowed(code, cache: dict | None = None) -> bool:
    """True for code a notebook cell or an installed file defines (module docstring). ``cache``: the
    caller's own record of codes decided (a guard's, made when its call starts: a table here would
    let a cell mark its code allowed before grading); keyed by identity, since equal code objects
    may differ in file name."""
    seen = cache.get(id(code)) if cache is not None else None
    if seen is None or seen[0] is not code:
        sh = shell()
        cell = _kernel_cell(code, sh) if sh is not None else _named_cell(code)
        seen = (code, cell or genuine.genuine(code) or _frozen(code) or _generated(code))
        if cache is not None:
            cache[id(code)] = seen
    return seen[1]


def allowed_here(code, cache: dict | None = None) -> bool:
    """:func:`allowed`, or, without a kernel (the course's tests, whose learners live in test files),
    code loaded from a file on disk; code compiled from a string still is not (labs 05 and 06). Not
    in the fresh grading process, where the learner's cells have cells' names (review r20 of lab 06:
    the tests' answer key, a file on disk, loaded through ``sys.path_hooks``, graded 13/13)."""
    return allowed(code, cache) or (shell() is None and not _APART and os.path.isfile(code.co_filename))


def where(code) -> str:
    """The refusal's words for code that is not :func:`allowed`."""
    return (f"it ran {code.co_qualname} from {code.co_filename}, neither a notebook cell nor an installed "
            "library: while graded, only your cells' code and installed libraries run")


def note_kernel() -> None:
    """Look for IPython's ``run_code`` on the calling stack (the grader calls this at a guard's
    entry, in the cell's thread): the outermost genuine one's shell is the kernel's."""
    frame, found = sys._getframe(1), None
    while frame is not None:
        code = frame.f_code
        if code.co_qualname == "InteractiveShell.run_code" and genuine.genuine(code):
            found = frame.f_locals.get("self", found)
        frame = frame.f_back
    if found is not None:
        _KERNEL[:] = [found]           # the stack's own shell, over anything put here before


def shell():
    """The kernel's IPython shell (None without one: plain Python, the course's tests)."""
    if _KERNEL:
        return _KERNEL[0]
    app = sys.modules.get("ipykernel.kernelapp")
    klass = getattr(app, "IPKernelApp", None)
    try:
        found = klass.instance().shell if klass is not None and klass.initialized() else None
    except Exception:       # noqa: BLE001 -- a half-started application: no kernel to ask
        found = None
    if found is not None:
        _KERNEL.append(found)
    return found


def _kernel_cell(code, sh) -> bool:
    """A cell's code by IPython's records: a name its compiler gave a cell, and a source its
    history holds that compiles to this code."""
    name = code.co_filename
    names = getattr(getattr(sh, "compile", None), "_filename_map", None) or {}
    if name not in names:
        return False
    history = list(getattr(getattr(sh, "history_manager", None), "input_hist_parsed", None) or ())
    number = names[name]
    order = ([number] if isinstance(number, int) and 0 <= number < len(history) else []) + list(range(len(history)))
    flags = getattr(sh.compile, "flags", 0) & ~ast.PyCF_ONLY_AST
    return any(isinstance(history[i], str)
               and any(genuine.same(code, c) for c in _cell_codes(history[i], flags).get(code.co_qualname, ()))
               for i in order)


@lru_cache(maxsize=1024)
def _cell_codes(source: str, flags: int) -> dict:
    """Qualified name -> the code objects a cell's source compiles to, whole and statement by
    statement (IPython compiles each top-level statement alone, the last one as ``single``)."""
    found: dict = {}

    def walk(code) -> None:
        found.setdefault(code.co_qualname, []).append(code)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                walk(const)
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}
    units = [(tree, "exec")] + [(ast.Module([s], []), "exec") for s in tree.body] \
        + [(ast.Interactive([s]), "single") for s in tree.body]
    for unit, mode in units:
        try:
            walk(compile(unit, "<cell>", mode, flags | _ASYNC, dont_inherit=True))
        except (SyntaxError, ValueError, TypeError):
            continue
    for node in ast.walk(tree):        # a cell magic's body (%%capture): IPython runs it as a cell
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "run_cell_magic" and len(node.args) == 3 \
                and isinstance(node.args[2], ast.Constant) and isinstance(node.args[2].value, str):
            for qualname, codes in _cell_codes(node.args[2].value, flags).items():
                found.setdefault(qualname, []).extend(codes)
    return found


def _named_cell(code) -> bool:
    """Without a kernel: a cell's name whose source linecache holds in memory, or a test's name."""
    name = code.co_filename
    shaped = _CELL.fullmatch(name)
    if shaped and shaped.group(1) is not None and int(shaped.group(1)) != os.getpid():
        shaped = None                    # another process's cell folder: not this kernel's
    if (shaped or name == _CELL_NAME) and _in_memory(name):
        return True
    return not _APART and name in os.environ.get("GPUMEM_TEST_CELLS", "").split(os.pathsep)


def _in_memory(name: str) -> bool:
    """linecache holds ``name``'s lines itself (IPython's and the tests' entries have no mtime), not
    read from a file of that name."""
    entry = linecache.cache.get(name)
    return isinstance(entry, tuple) and len(entry) == 4 and entry[1] is None and bool(entry[2])


def _generated(code) -> bool:
    """Code the standard library writes and compiles itself (no file): a dataclass's methods
    (``dataclasses._create_fn``) and a namedtuple's ``__new__`` (a lambda calling ``_tuple_new``)."""
    return code.co_filename == "<string>" and (
        code.co_qualname.startswith("__create_fn__.<locals>.")
        or (code.co_qualname == "<lambda>" and code.co_names == ("_tuple_new",)))


def _frozen(code) -> bool:
    """Code of a module frozen into the interpreter (``<frozen codecs>``), as the interpreter has it."""
    found = re.fullmatch(r"<frozen ([\w.]+)>", code.co_filename)
    if not found:
        return False
    try:
        import _imp
        name = found.group(1)           # importlib's bootstrap is frozen under an alias
        top = _imp.get_frozen_object({"importlib._bootstrap": "_frozen_importlib", "importlib._bootstrap_external":
                                      "_frozen_importlib_external"}.get(name, name))
    except ImportError:
        return False
    stack = [top]
    while stack:
        c = stack.pop()
        if c.co_qualname == code.co_qualname and genuine.same(c, code):
            return True
        stack += [k for k in c.co_consts if isinstance(k, type(code))]
    return False


note_kernel()             # a kernel that imports the course from a cell is known from then on
