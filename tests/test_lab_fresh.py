"""Grading in a fresh process (gpumem.course.lab_fresh, lab_carry): what is carried, as source, and
that nothing else of the grading kernel reaches the grade."""

import inspect
import linecache
import os
import sys

import pytest
import torch

from conftest import ROOT
from gpumem import chapters
from gpumem.course import lab_carry, lab_fresh, lab_vet
from test_labs import notebook_namespace

CELLS = [
    "import math\nimport torch\nimport torch.nn.functional as F\nfrom math import sqrt\n"
    "SCALE = 3\nTABLE = {'a': (1, 2.5), 'b': [None, 'x']}\nDT = torch.bfloat16\n",

    "def deco(f):\n    f.tagged = True\n    return f\n\n\n@deco\ndef area(r, k=SCALE):\n"
    "    return math.pi * r * r * k + sqrt(4) + TABLE['a'][0]\n",

    "class Box:\n    def __init__(self, n):\n        self.n = n\n\n    def size(self):\n"
    "        return helper(self.n)\n\n\ndef helper(n):\n    return n * 2\n\n\nsquare = lambda x: x * x\n"
    "alias = area\nX = torch.ones(3)\n\n\ndef uses_x():\n    return X.sum()\n\n\ndef make():\n"
    "    def inner():\n        return 1\n    return inner\n\n\nmade = make()\n",

    "def relu_sum(t):\n    return F.relu(t).sum().to(DT)\n",
]


def _cells_ns(tag: str, cells: list[str] = CELLS) -> dict:
    """The cells run as the course's tests run a notebook's (each cell's source in linecache)."""
    ns: dict = {}
    for i, source in enumerate(cells):
        name = f"<{tag}.ipynb cell {i}>"
        linecache.cache[name] = (len(source), None, source.splitlines(True), name)
        exec(compile(source, name, "exec"), ns)
    return ns


def test_definitions_values_and_modules_are_carried_as_source():
    carried = lab_carry.carry(_cells_ns("carry"))
    assert set(carried.defs) == {"deco", "area", "Box", "helper", "square", "uses_x", "make", "relu_sum"}
    assert carried.after == {"alias": "alias = area"}
    order = list(carried.defs)
    assert order.index("deco") < order.index("area")          # read when `def area` runs
    assert set(carried.values) == {"math", "F", "sqrt", "SCALE", "TABLE", "DT"}   # torch: no def reads it
    assert carried.values["F"] == "import torch.nn.functional as F"
    assert carried.left == {"X": "a torch.Tensor",
                            "made": "a function made inside another function (write it with `def` at the top "
                                    "of a cell)"}
    assert "X = torch.ones" not in "".join(carried.cells().values())      # only def/class lines travel


def test_rebuilt_definitions_run_and_read_as_in_the_notebook():
    ns = _cells_ns("rebuild")
    sent = lab_fresh.payload("lab00_example", ns, show=False)
    assert "token" in sent and len(sent["token"]) == 32
    fresh = lab_fresh.rebuild(sent)
    assert fresh["area"] is not ns["area"]
    assert fresh["area"](2) == pytest.approx(math_area(2)) and fresh["area"].tagged
    assert fresh["alias"] is fresh["area"] and fresh["square"](7) == 49 and fresh["Box"](3).size() == 6
    assert fresh["relu_sum"](torch.tensor([-1.0, 2.0])).dtype == torch.bfloat16
    # each definition keeps its cell's line numbers; its text is the grader's (lab 02 runs it from there),
    # not readable through linecache where it is graded (review r37 of lab 06)
    from gpumem.course import lab_bare
    for name in ("area", "helper", "relu_sum"):
        assert fresh[name].__code__.co_firstlineno == ns[name].__code__.co_firstlineno
        assert lab_bare.source(fresh[name]) == inspect.getsource(ns[name])
        assert not inspect.getsource(fresh[name]).strip()
    assert fresh["area"].__code__.co_filename == "<lab00_example.ipynb cell 1>"       # the cell it came from
    with pytest.raises(NameError, match="'X' is not defined"):
        fresh["uses_x"]()
    assert "made" not in fresh and "X" not in fresh


def math_area(r):
    import math
    return math.pi * r * r * 3 + 2 + 1


def test_a_cells_environment_variables_do_not_reach_the_grading_process(monkeypatch):
    if not os.path.exists(f"/proc/{os.getpid()}/environ"):
        pytest.skip("the environment a process started with is read from /proc (Linux)")
    monkeypatch.setenv("GPUMEM_TEST_CELLS", "<anything>")    # the name rule without a kernel
    monkeypatch.setenv("SET_BY_A_CELL", "1")
    env = lab_fresh._environment()
    assert "GPUMEM_TEST_CELLS" not in env and "SET_BY_A_CELL" not in env and env.get("PATH")


def test_the_solution_passes_apart_and_kernel_objects_do_not_travel(capsys):
    """Lab 08's solution graded in the fresh process passes; the same answers reached through an object
    of this process (a dict holding the solution's function) fail there, with the reason."""
    ns = notebook_namespace(ROOT / "solutions" / "lab08_finetune_recipe.ipynb")
    report = chapters.check_lab("lab08_finetune_recipe", ns, show=True, apart=True)
    assert report.solved, report.summary()
    out = capsys.readouterr().out
    assert "graded in a fresh Python process" in out and "all correct" in out
    source = "def role_bytes(*args, **kwargs):\n    return KEPT['fn'](*args, **kwargs)\n"
    name = "<lab08 wrapper.ipynb cell 99>"
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    ns["KEPT"] = {"fn": ns["role_bytes"]}
    exec(compile(source, name, "exec"), ns)
    assert chapters.check_lab("lab08_finetune_recipe", ns, show=False, apart=False).solved   # in this process
    apart = chapters.check_lab("lab08_finetune_recipe", ns, show=False, apart=True)
    first = next(r for r in apart.rows if r.function == "role_bytes")
    assert not apart.solved and first.status == "error"
    assert "`KEPT`, a builtins.dict, cannot be carried there" in first.detail, first.detail


# --- review r16: code that runs while the definitions are rebuilt, and graded code that patches ---
VET_NS = {"json": __import__("json"), "torch": torch, "functools": __import__("functools"),
          "math": __import__("math"), "enum": __import__("enum"),
          "Report": __import__("gpumem.course.grading", fromlist=["Report"]).Report}
REFUSED = [
    ("class Forge:\n    json.dumps = lambda *a, **k: '{}'\n", "body runs `json.dumps"),          # r16 lab 03/05
    ("def f(x, _=json.dumps):\n    return x\n", "function, class or module held before grading"),  # r16 lab 01
    ("def f(x, _=print('hi')):\n    return x\n", "computed when the definition is made"),
    ("@(lambda g: g)\ndef f(x):\n    return x\n", "runs code when the definition is made"),
    ("@functools.partial(print)\ndef f(x):\n    return x\n", "runs code when the definition"),
    ("@torch.jit.script\ndef f(x):\n    return x\n", "runs your code or a library's"),
    ("class M(type):\n    pass\n\n\nclass C(metaclass=M):\n    pass\n", "passes `metaclass=`"),
    ("class B:\n    def __init_subclass__(cls):\n        pass\n", "defines __init_subclass__"),
    ("def f(x: print('a')):\n    return x\n", "an annotation calls something"),
    ("def f():\n    import sys\n    sys.stdout = None\n", "changes `sys.stdout`, part of a library"),   # r16 lab 02
    ("def f():\n    torch.allclose = lambda *a, **k: True\n", "changes `torch.allclose`"),
    ("def f():\n    import os\n    os.environ['GPUMEM_TEST_CELLS'] = 'x'\n", "changes `os.environ"),  # r16 lab 08
    ("def f():\n    from unittest.signals import signal\n    signal.setitimer = None\n", "changes `signal.setitimer`"),
    ("def f():\n    import _signal\n", "imports _signal"),                                        # r16 lab 06
    ("def f():\n    m = __import__('json')\n", "calls __import__"),
    ("def f():\n    import importlib\n", "imports importlib"),
    ("def f():\n    setattr(math, 'isclose', None)\n", "calls setattr on `math`"),
    ("def f():\n    setattr(next(iter([math])), 'isclose', None)\n", "calls setattr on `next(iter([math]))`"),
    # review r19: aten re-registered through torch._C (lab 04), the modes switched off (lab 03), a
    # class reached through its instance and patched (lab 02)
    ("def f():\n    lib = torch._C._dispatch_library('IMPL', 'aten', '', '', 0)\n",
     "reads `torch._C._dispatch_library`, a library's private name"),
    ("def f():\n    import torch.utils\n    with torch.utils._python_dispatch._disable_current_modes():\n"
     "        pass\n", "reads `torch.utils._python_dispatch"),
    ("def f():\n    c = getattr(torch, '_C')\n", "reads `getattr(torch, '_C')`"),
    ("def f():\n    T = type(torch.empty(0))\n    T.isnan = lambda self: self == self\n", "changes `T.isnan`"),
    # review r17: a second name, a method that changes a table, metaclasses, objects the grader formats
    ("def f():\n    m = math\n    m.isclose = lambda *a, **k: True\n", "changes `m.isclose`"),
    ("def f():\n    from json import decoder as R\n    box = [R][0]\n    box.x = 1\n", "changes `box.x`"),
    ("def f():\n    from gpumem.chapters.ch05_offload import labcheck as ref\n    ref.RUNGS.update({})\n",
     "calls `ref.RUNGS.update`"),
    ("def f():\n    from gpumem.chapters.ch08_finetuning.lab_guard import BLOCKED\n    BLOCKED.clear()\n",
     "calls `BLOCKED.clear`"),
    ("def f():\n    getattr(math, 'pi').x = 1\n", "changes `getattr(math, 'pi').x`"),
    ("class E(enum.Enum):\n    A = 1\n", "has a metaclass (EnumType)"),
    ("class T(torch.Tensor):\n    pass\n", "a tensor subclass"),
    ("class Oops(Exception):\n    def __str__(self):\n        return 'ok'\n", "defines __str__"),
    ("def f():\n    R = Report\n    R.summary = None\n", "changes `R.summary`"),      # r17 of lab 03
    ("class Q:\n    def __str__(self):\n        return 'ok'\n", "defines __str__"),
    ("class Q:\n    def __del__(self):\n        pass\n", "defines __del__"),
    # review r18: attributes read by names no rule sees
    ("def f(x):\n    match x:\n        case object(f_locals=v):\n            return v\n", "through a match pattern"),
    ("def f(x):\n    from string import Formatter\n    return Formatter\n", "string.Formatter"),
    ("def f(x):\n    return ('{0.__s' + 'elf__}').format(x)\n", "template built at run time"),
    ("def f(x):\n    return '{0.__self__}'.format(x)\n", "field that reads an attribute"),
    # review r20/r21: a library's table changed through a type's own method or re-initialised in place
    # (lab 05); a tensor subclass made inside a function (lab 02)
    ("def f():\n    from gpumem.memory import accounting\n    dict.update(accounting.RECIPE, a=1)\n",
     "calls `dict.update`, which changes part of a library"),
    ("def f():\n    from gpumem.memory import accounting\n    accounting.RECIPE['mixed'].__init__('mixed')\n",
     "which changes part of a library"),
    ("def f(x):\n    class Quiet(torch.Tensor):\n        pass\n    return x.as_subclass(Quiet)\n",
     "(inside a function): its base `torch.Tensor`"),
    # review r22 of lab 02: the base through a local alias, and a class made by type()
    ("def f(x):\n    T = torch.Tensor\n    class Quiet(T):\n        pass\n    return x.as_subclass(Quiet)\n",
     "its base `T` is not a class the notebook holds"),
    ("def f(x):\n    Q = type('Quiet', (torch.Tensor,), {})\n    return x.as_subclass(Q)\n",
     "`type(name, bases, namespace)` makes a class"),
    # review r26 of lab 08: inside a function, a finalizer class and an ABC whose metaclass registers
    # a frame's type (its match pattern then read f_locals): refused as at the top level
    ("def f(model):\n    class _Later:\n        def __del__(self):\n            pass\n    model['t'] = _Later()\n",
     "(inside a function) defines __del__"),
    ("def f(x):\n    import abc\n    class _Frame(abc.ABC):\n        pass\n    return _Frame\n",
     "(inside a function): its base `abc.ABC`"),
    ("def f(x):\n    class M(type):\n        pass\n    class C(metaclass=M):\n        pass\n    return C\n",
     "passes `metaclass=`"),
]
FINE = [
    "@functools.lru_cache(maxsize=None)\ndef f(x, y=2, z=-1.5, t=(1, 'a'), dt=torch.float32) -> int:\n    return x\n",
    "@torch.no_grad()\ndef f(x: torch.Tensor, k: 'int' = 3) -> dict[str, int] | None:\n    return None\n",
    "class Box:\n    '''doc'''\n    n: int = 3\n    scale = 2.0\n\n    def __init__(self, t):\n        self.t = t\n"
    "        self.t.grad = None\n\n    @property\n    def size(self):\n        return 1\n\n    @size.setter\n"
    "    def size(self, v):\n        pass\n\n    @staticmethod\n    def forward(ctx, x):\n        ctx.save_for_backward(x)\n",
    "def f(p, out):\n    out[0] = p.grad\n    p.grad = None\n    import torch.distributed as dist\n    return dist.get_rank()\n",
    "def f(x, big=25 * 2**20, top=float('inf'), rows=range(4)):\n    y = torch.zeros(3)\n    y[0] = 1\n"
    "    a, b = {}, {}\n    (a if x else b)['k'] = 1\n    return y\n",
    "class Fn(torch.autograd.Function):\n    MiB = 2**20\n\n    @staticmethod\n"
    "    @torch.autograd.function.once_differentiable\n    def backward(ctx, g):\n        return g\n",
    "class Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n",
    "class BadSetup(ValueError):\n    pass\n",                      # r17 of lab 08: a learner's own error
    "def f(x):\n    class Fn(torch.autograd.Function):\n        pass\n\n    class G(Fn):\n        pass\n"
    "    return type(x)\n",                                        # nested classes of its own; type(x)
    "def f(g):\n    torch.autograd.Variable._execution_engine.queue_callback(g)\n    return getattr(g, '__name__')\n",
    "class Cache:\n    def __init__(self):\n        self._seen = {}\n\n    def get(self, k):\n"
    "        return getattr(self, '_seen').get(k)\n",
    "def f(x):\n    print('{:,} B, {:.2f} s, {!r}'.format(x, 1.5, 'a'))\n    return f'{x:.3e}'\n",
]


@pytest.mark.parametrize("source, why", REFUSED, ids=[w for _, w in REFUSED])
def test_definition_time_code_and_patches_are_refused(source, why):
    found = lab_vet.problem(source, VET_NS)
    assert found is not None and why in found, found


@pytest.mark.parametrize("source", FINE)
def test_what_learners_write_is_carried(source):
    assert lab_vet.problem(source, VET_NS) is None


def test_decorated_aliased_bound_and_nested_definitions_are_carried():
    """r16: lru_cache and no_grad definitions, a second name for an older version, an autograd
    Function's apply, a def under `if`, -inf and torch.exp2 were not carried."""
    cells = ["import functools\nimport torch\nfrom torch import exp2\nNEG = float('-inf')\n",
             "@functools.lru_cache(maxsize=None)\ndef peak(n):\n    return n * 2\n",
             "first_try = peak\n",
             "@functools.lru_cache(maxsize=None)\ndef peak(n):\n    return n * 3 + helper()\n",
             "if True:\n    def helper():\n        return int(exp2(torch.tensor(1.0)).item()) + (NEG < 0)\n",
             "class Twice(torch.autograd.Function):\n    @staticmethod\n    def forward(ctx, x):\n        return 2 * x\n\n"
             "    @staticmethod\n    def backward(ctx, g):\n        return 2 * g\n\n\ntwice = Twice.apply\n"]
    ns = _cells_ns("wrapped", cells)
    sent = lab_fresh.payload("lab00_example", ns, show=False)
    assert sent["left"] == {} and lab_fresh.refusal(sent, ns) is None
    fresh = lab_fresh.rebuild(sent)
    assert fresh["peak"](1) == 3 + 3 and fresh["first_try"](1) == 2        # each its own version
    assert fresh["twice"](torch.tensor(2.0)).item() == 4.0 and fresh["NEG"] == float("-inf")
    assert fresh["peak"].cache_info().hits == 0


def test_a_socket_opened_by_graded_code_is_refused():
    """Review r16 of lab 01: a helper started from a terminal answered over a socket."""
    import socket
    from gpumem.course import lab_audit
    lab_audit.install()
    hits: list = []
    with pytest.raises(RuntimeError, match="network connection"):
        with lab_audit.refusing("refused", hits):
            socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    assert hits and "socket" in hits[0]


def test_what_is_carried_is_read_with_the_scans_rules_and_other_cells_are_free():
    """In a kernel the scan reads what is carried, not every cell (a top-level `gc.get_objects()` no
    longer stops the check: it never runs where the check grades)."""
    cells = ["import gc\nimport sys\nobjs = gc.get_objects()\nkeys = net_keys = list(vars(sys))\n",
             "def model_state_bytes(n_params, recipe, gpus=1, zero=0):\n    return sys.modules['math']\n"]
    ns = _cells_ns("scan", cells)
    report = chapters.check_lab("lab01_memory_calculator", ns, show=False, apart=True)
    assert [(r.function, r.status) for r in report.rows] == [("check", "error")]
    detail = report.rows[0].detail
    assert detail.startswith("not graded: `model_state_bytes` (<lab01_memory_calculator.ipynb cell 1>): line 2")
    assert "modules" in detail
    sent = lab_fresh.payload("lab01_memory_calculator", {k: v for k, v in ns.items() if k != "model_state_bytes"}, False)
    assert lab_fresh.refusal(sent, ns) is None            # the gc cell alone: nothing carried reaches


def test_private_names_are_not_carried_and_builtins_are_not_named():
    """Review r17 of lab 01: `from torch._C import DisableTorchFunction` was carried as an import line;
    review r17 of lab 05: a function calling `open` got a note that `open` is not carried."""
    cells = ["from torch._C import DisableTorchFunction\nopen = open\n",
             "def f():\n    with DisableTorchFunction():\n        return open\n"]
    ns = _cells_ns("private", cells)
    sent = lab_fresh.payload("lab00_example", ns, show=False)
    assert "open" not in sent["left"] and "open" not in dict(sent["values"])
    assert "private name (_C)" in lab_fresh.refusal(sent, ns)


def test_the_kernels_way_back_for_the_report_is_checked(monkeypatch):
    """Review r17 of labs 01 and 05: a kernel cell swapped json.loads and forged the rows on their way
    back; the kernel's side refuses to grade while json, subprocess.Popen or os's functions are not
    the standard library's own."""
    import json
    import subprocess
    from gpumem.course import lab_kernel
    assert lab_kernel.stdlib_changed() is None
    for module, name, fake in ((json, "loads", lambda *a, **k: {}), (os, "read", lambda *a: b""),
                               (subprocess, "Popen", type("Popen", (subprocess.Popen,), {}))):
        with monkeypatch.context() as m:
            m.setattr(module, name, fake)
            assert lab_kernel.stdlib_changed() == f"{module.__name__}.{name}"
    report = chapters.check_lab("lab08_finetune_recipe", {}, show=False, apart=True)
    assert report.rows[0].status == "todo"                     # nothing changed: graded as usual


def test_a_def_beside_the_import_it_uses_is_carried_from_an_ipython_cell():
    """Review r18 of lab 06: IPython compiles each statement of a cell alone, so `math.ceil(x)` in a def
    under `import math` in the same cell compiles to other bytecode than the whole cell does."""
    import subprocess
    import sys
    driver = (
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "sh = InteractiveShell.instance()\n"
        "sh.run_cell('import math\\ndef up(x):\\n    return math.ceil(x)\\n', store_history=True)\n"
        "from gpumem.course import lab_carry\n"
        "c = lab_carry.carry(sh.user_ns)\n"
        "print('CARRIED', sorted(c.defs), sorted(c.values), c.left)\n")
    out = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=120).stdout
    assert "CARRIED ['up'] ['math'] {}" in out, out[-2000:]


def test_a_dataclass_of_fields_only_is_carried():
    """Review r18 of lab 03: its generated methods (file "<string>") hid its class statement."""
    source = ("from dataclasses import dataclass\n\n\n@dataclass\nclass Plan:\n    tp: int = 1\n    pp: int = 1\n\n\n"
              "def make():\n    return Plan(2, 3)\n")
    name = "<dataclass.ipynb cell 0>"
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    ns: dict = {}
    exec(compile(source, name, "exec"), ns)
    sent = lab_fresh.payload("lab00_example", ns, show=False)
    assert sent["left"] == {} and lab_fresh.refusal(sent, ns) is None
    assert repr(lab_fresh.rebuild(sent)["make"]()) == "Plan(tp=2, pp=3)"


# --- review r18 (lab 02): a library changed through an object no reading of the source can follow ---
LOOSEN = ("    import math as _m\n    box = next(iter([_m]))\n"        # a call's result: not seen as math
          "    box.isclose = lambda *a, **k: True\n")


def test_a_library_changed_through_a_calls_result_voids_the_grade(capsys):
    """The static reading misses ``box = next(iter([math])); box.isclose = ...`` (a name bound to a
    call's result is the learner's own object as far as it can tell); the fresh process compares every
    module's names after grading with what they were before any learner code ran, and gives no grade."""
    from gpumem.course import lab_intact
    taken = lab_intact.take()
    import math
    real = math.isclose
    try:
        math.isclose = lambda *a, **k: True
        assert lab_intact.changed(taken) == "math.isclose was replaced"
    finally:
        math.isclose = real
    assert lab_intact.changed(taken) is None
    ns = notebook_namespace(ROOT / "solutions" / "lab08_finetune_recipe.ipynb")
    source = inspect.getsource(ns["role_bytes"])
    head, _, body = source.partition(":\n")                   # after the def line (one line in the solution)
    assert head.startswith("def role_bytes(") and "\n" not in head
    patched = f"{head}:\n{LOOSEN}{body}"
    name = "<lab08 loosen.ipynb cell 98>"
    linecache.cache[name] = (len(patched), None, patched.splitlines(True), name)
    exec(compile(patched, name, "exec"), ns)
    assert lab_vet.problem(patched, ns) is None                # the reading of the source misses it
    capsys.readouterr()
    apart = chapters.check_lab("lab08_finetune_recipe", ns, show=True, apart=True)
    assert not apart.solved and len(apart.rows) == 1, apart.summary()
    assert "graded code changed a library (math.isclose was replaced)" in apart.rows[0].detail
    # review r22 of lab 05: the check's own summary ("15/15 ... all correct") was printed above the
    # verdict; it is held back until the verdict is known and a voided one shows only its own
    said = capsys.readouterr().out
    assert "not graded: graded code changed a library" in said and "well done" not in said, said[-1500:]
    assert "15/15" not in said and "lab08_finetune_recipe: 0/1 checks pass" in said
    assert math.isclose is real                              # this process was never touched


def test_what_gpumem_adds_while_grading_is_not_a_change():
    """Caches that grow and modules imported late are not changes; a gpumem table whose entry is
    replaced or removed is, and so is a name added to a gpumem module."""
    import types
    from gpumem.course import lab_intact
    table = {"a": 1}
    mod = types.ModuleType("gpumem._intact_probe")
    mod.TABLE, mod.LIST = table, [1, 2]
    import sys
    sys.modules[mod.__name__] = mod
    try:
        taken = lab_intact.take()
        table["b"] = 2
        mod.LIST.append(3)
        sys.modules["gpumem._intact_probe2"] = types.ModuleType("gpumem._intact_probe2")
        assert lab_intact.changed(taken) is None
        del table["a"]
        assert lab_intact.changed(taken) == "the contents of gpumem._intact_probe.TABLE were changed"
        table["a"] = 1
        mod.LIST[0] = 5
        assert lab_intact.changed(taken) == "the contents of gpumem._intact_probe.LIST were changed"
        mod.LIST[0] = 1
        mod.abs = lambda x: 0                          # would shadow the builtin in that module
        assert lab_intact.changed(taken) == "gpumem._intact_probe.abs was added"
        del mod.abs
        import dataclasses                             # review r21 of lab 05: a frozen entry re-initialised

        @dataclasses.dataclass(frozen=True)
        class Entry:
            bytes_: int
        table["e"] = Entry(18)
        taken = lab_intact.take()
        object.__setattr__(table["e"], "bytes_", 0)    # what its generated __init__ does, in place
        assert lab_intact.changed(taken) == "the contents of gpumem._intact_probe.TABLE were changed"
        object.__setattr__(table["e"], "bytes_", 18)
        assert lab_intact.changed(taken) is None
    finally:
        sys.modules.pop(mod.__name__)
        sys.modules.pop("gpumem._intact_probe2", None)


def test_the_repositorys_other_folders_cannot_be_imported_where_the_check_grades(monkeypatch):
    """Review r19 of lab 06: the fresh process had the repository's root on sys.path (to import
    gpumem), so graded code imported ``tests.test_lab06_limits_truth``, an answer key. The root is
    off sys.path once gpumem is imported: the same import fails there, with the row saying so."""
    ns = notebook_namespace(ROOT / "solutions" / "lab08_finetune_recipe.ipynb")
    source = inspect.getsource(ns["role_bytes"])
    head, _, body = source.partition(":\n")
    patched = f"{head}:\n    import tests.test_lab06_limits_truth as key\n{body}"
    # as in the reviewer's kernel (its folder is the notebook's): `tests` is not importable here, so
    # the kernel-side reading cannot follow the import; only the grading process could
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(ROOT))])
    monkeypatch.delitem(sys.modules, "tests", raising=False)
    name = "<lab08 key.ipynb cell 97>"
    linecache.cache[name] = (len(patched), None, patched.splitlines(True), name)
    exec(compile(patched, name, "exec"), ns)
    assert ns["role_bytes"] is not None
    apart = chapters.check_lab("lab08_finetune_recipe", ns, show=False, apart=True)
    first = next((r for r in apart.rows if r.function == "role_bytes"), apart.rows[0])
    assert not apart.solved and first.status == "error" and "No module named 'tests'" in first.detail, first


def test_a_kernel_registered_over_atens_own_voids_the_grade():
    """Review r19 of lab 04: ``torch._C._dispatch_library`` put a kernel over aten's ``all`` (True for
    anything) and every comparison of the grader's passed. The carried source is refused for reading
    the private name; the process also checks, after grading, that the ops graders compare with
    still compute (in a subprocess here: the registration would outlive this test)."""
    import subprocess
    code = ("import torch\nfrom gpumem.course import lab_intact\nt = lab_intact.take()\nassert lab_intact.changed(t) is None\n"
            "lib = torch._C._dispatch_library('IMPL', 'aten', '', '', 0)\n"
            "lib.impl('all', 'CPU', lambda self: torch.ones((), dtype=torch.bool), False)\n"
            "print(lab_intact.changed(t))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "torch's all no longer computes what it should (a kernel re-registered?)"


def test_a_grading_process_that_ends_without_a_report_says_so_last(capsys):
    """Review r19 (labs 04, 05, 06): a process that printed its summary and then failed left "all
    correct" as the last line; the row said otherwise but was not printed. The verdict is printed
    last now (here the entry point is called with arguments it does not take, and raises)."""
    ns = _cells_ns("ends", [CELLS[0], CELLS[3]])                 # nothing the kernel-side reading refuses
    report = lab_fresh.grade_apart("lab08_finetune_recipe", ns, show=True, entry="gpumem.course.lab_fresh:_run")
    out = capsys.readouterr().out
    assert not report.solved and report.rows[0].detail.startswith("the grading process ended")
    assert out.rstrip().splitlines()[-1].startswith("NOT GRADED: the grading process ended"), out[-400:]


def test_a_gpumem_functions_defaults_changed_in_place_is_a_change():
    """Review r22 of lab 05: ``mock.patch.object(grad_swap.exposed_seconds, "__defaults__", ...)``
    left the function itself in place; lab_intact records gpumem functions' defaults too."""
    from gpumem.course import lab_intact
    from gpumem.timing import grad_swap              # loaded before the record, as the grader's modules are
    taken = lab_intact.take(contents=False)
    real = grad_swap.exposed_seconds.__defaults__
    try:
        grad_swap.exposed_seconds.__defaults__ = (10**30, 4)
        assert lab_intact.changed(taken) == "the default arguments of gpumem.timing.grad_swap.exposed_seconds were changed"
        grad_swap.exposed_seconds.__defaults__ = real[:1] + real[1:]   # equal, but another tuple
        assert lab_intact.changed(taken) is not None
    finally:
        grad_swap.exposed_seconds.__defaults__ = real
    assert lab_intact.changed(taken) is None


def test_unittest_mock_is_refused_in_graded_code():
    """The same cheat's route: unittest.mock (and the standalone mock) are refused by name."""
    source = ("def rung_seconds(n, ranks, rung, compute_s, links):\n"
              "    from unittest import mock\n"
              "    return 0.0\n")
    from gpumem.course import lab_reach
    why = lab_reach.first_reach(source)
    assert why is not None and "unittest" in why, why
    why = lab_reach.first_reach(source.replace("from unittest import mock", "import mock"))
    assert why is not None and "mock" in why, why
    assert lab_reach.first_reach(source.replace("from unittest import mock", "x = 'mock'")) is None


def test_a_refusal_inside_a_library_names_the_library():
    """Review r22 of lab 04: torch.vmap asked for sys._getframe while registering its
    decompositions, and the row blamed the learner's code alone; it now names the library (and for
    vmap/func, what to do instead)."""
    import sys
    from gpumem.course import lab_watch
    lib = {"sys": sys}
    exec(compile("def deep():\n    return sys._getframe()\n",
                 "/x/site-packages/torch/_functorch/vmap.py", "exec"), lib)
    other = {"sys": sys}
    exec(compile("def deep():\n    return sys._getframe()\n", "/x/site-packages/somelib/core.py", "exec"), other)
    for deep, words in ((lib["deep"], "inside torch.vmap or torch.func"),
                        (other["deep"], "inside somelib/core.py, a library your code called")):
        ns = {"deep": deep}
        exec(compile("def mine():\n    return deep()\n", "<lab04_online_softmax.ipynb cell 3>", "exec"), ns)
        assert words in lab_watch._through(ns["mine"]())
    cell = {"sys": sys}
    exec(compile("def mine():\n    return sys._getframe()\n", "<lab04_online_softmax.ipynb cell 3>", "exec"), cell)
    assert lab_watch._through(cell["mine"]()) == ""


def test_the_relay_holds_the_summary_and_passes_progress_at_once(capsys):
    """lab_relay.relay: progress (a tqdm-style line ending in a carriage return, a line starting like
    the lab's name) is written as it comes; from the summary line on, the text is returned, not written."""
    import subprocess
    import sys

    from gpumem.course import lab_relay
    script = ("import sys, time; w = sys.stdout.write\n"
              "w('labX\\r'); w('labX ran 1/2\\r'); w('\\n'); sys.stdout.flush(); time.sleep(0.2)\n"
              "w('bar\\r   \\rlabX: 3/3 checks pass\\nall correct\\n'); w('\\x1e(void)\\nlabX: 0/1 checks pass\\n')\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    held = lab_relay.relay(proc, "labX")
    proc.wait()
    assert capsys.readouterr().out == "labX\rlabX ran 1/2\r\nbar\r   \r"     # tqdm's last bar, then the summary
    assert held == "labX: 3/3 checks pass\nall correct\n\x1e(void)\nlabX: 0/1 checks pass\n"
