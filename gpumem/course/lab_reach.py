"""Refuse a learner's source that reaches into the grader, read statically before it runs.

A lab that runs the learner's function in the grader's own process (lab 02's ranks run its hooks
next to the record, the clock and the probe) cannot keep its objects out of reach: any code in the
process can find them. Review r12 rewrote lab 02's arrival clock through ``sys.modules`` and took the
real work handle from behind the grader's proxy with ``object.__getattribute__``, in ten lines. A
solution needs none of the tools those cheats use, so :func:`first_reach` refuses them in the
source text (``ast``), before anything runs:

* imports of the modules that find or build objects by name or by reference: ``gc``, ``inspect``,
  ``importlib``, ``sys``'s ``modules``, ``ctypes``, ``builtins``, ``pickle`` ... (:data:`MODULES`);
* the attributes that open a function, a class or a frame: ``__globals__``, ``__closure__``,
  ``__code__``, ``__kwdefaults__``, ``__getattribute__``, ``__setattr__``, ``__dict__``,
  ``f_globals``, ``_getframe``, ``modules`` ... (:data:`ATTRIBUTES`);
* the builtins that do the same by name: ``__import__``, ``vars``, ``globals``, ``eval``, ``exec``
  ... (:data:`BUILTINS`), and ``getattr`` / ``setattr`` / ``delattr`` / ``hasattr`` unless called
  with a literal name that is not refused (``getattr(work, "wait")`` is fine);
* any string that names the course's package (``"gpumem"``) or one of the refused attributes.

This raises the bar; it proves nothing. Python can reach an object by routes no list names (a
pickle built at run time, a torch helper that imports by dotted name). The labs that use it also
check at run time that what they measure with was not changed (lab 02: ``lab02_watch.seal``).
"""

import ast

MODULES = ("gc", "inspect", "importlib", "ctypes", "builtins", "pickle", "marshal", "copyreg", "pydoc",
           "pkgutil", "runpy", "dill", "cloudpickle", "_thread",
           # review r15 of lab 02: modules that run a source string built at run time
           "timeit", "code", "codeop",
           # review r15 of lab 06: the samplers' timer switched off from the call
           "signal",
           # review r15 of lab 04: breakpoint() was refused and pdb.set_trace() not (a debugger walks
           # and writes the grader's frames); %debug after a failed cell is IPython's and stays allowed
           "pdb", "ipdb", "bdb",
           # review r22 of lab 05: unittest.mock's patch.object swapped a library function's defaults
           "unittest", "mock")
# What ``gc``, ``inspect`` and ``types`` offer that reaches objects (the kernel-wide scan, lab_history,
# lets a learner's cells import gc and inspect for gc.collect() and inspect.signature(); these stay
# refused, called on the module under any name it was imported as)
REACHING = {"inspect": ("currentframe", "stack", "trace", "getouterframes", "getinnerframes", "getframeinfo",
                        "getmembers", "getmembers_static", "getclosurevars", "getattr_static", "unwrap", "getmodule",
                        "getcallargs"),
            "gc": ("get_referrers", "get_referents", "get_objects", "callbacks", "garbage"),
            "types": ("FunctionType", "CodeType", "LambdaType", "MethodType", "CellType", "FrameType")}
ATTRIBUTES = ("__globals__", "__closure__", "__code__", "__kwdefaults__", "__defaults__", "__dict__",
              "__getattribute__", "__setattr__", "__delattr__", "__subclasses__", "__builtins__", "__import__",
              "__reduce__", "__reduce_ex__", "__getstate__", "__setstate__", "__func__", "__wrapped__",
              "__loader__", "__spec__", "__mro__", "__bases__", "__base__",
              "modules", "_getframe", "_current_frames", "settrace", "setprofile", "f_globals", "f_locals",
              "f_back", "f_builtins", "f_code", "tb_frame", "gi_frame", "cr_frame", "ag_frame",
              "get_referrers", "get_referents", "get_objects", "import_module", "_import_dotted_name", "attrgetter",
              "methodcaller",
              "get_field",                        # string.Formatter().get_field("0.__code__") (r15, lab 06)
              "_start_new_thread", "start_new_thread", "_start_joinable_thread", "start_joinable_thread",
                                                  # a raw thread no guard watches (r15, lab 08)
              # review r14 of lab 02: a bound method's object (weakref.finalize's registry -> the grader's
              # dict), the process group's store, and the dispatch modes the grader's meters run as
              "__self__", "_registry", "_get_default_store", "_get_current_dispatch_mode", "_pop_mode",
              "_push_mode", "_get_dispatch_mode_pre_dispatch", "paused",
              # IPython's records of the cells a kernel ran (gpumem.course.lab_history reads them)
              "history_manager", "input_hist_parsed", "input_hist_raw", "_filename_map", "user_ns",
              # review r20: a tensor's class patched through ``x.__class__`` (lab 02); a test file
              # loaded through the import system's own hooks (lab 06's answer key)
              "__class__", "path_hooks", "path_importer_cache", "meta_path", "find_spec", "exec_module",
              "spec_from_file_location", "module_from_spec", "SourceFileLoader", "SourcelessFileLoader",
              # review r25 of lab 08: a signal handler raised in the call is handed the interrupted
              # frame (no audit event), and traceback's walk with capture_locals read the grader's
              # locals up its stack; signal was refused by import only (asyncio.unix_events.signal)
              "signal", "raise_signal", "pthread_kill", "setitimer", "alarm", "set_wakeup_fd",
              "walk_stack", "walk_tb", "extract_stack", "format_stack", "print_stack", "StackSummary",
              "FrameSummary", "capture_locals",
              # review r26 of lab 08: a finalizer runs after the guarded call, outside the guard
              "finalize", "__del__",
              # review r31 of lab 01: a table of answers held in a string annotation and read back
              "__annotations__", "__annotate__", "get_annotations", "get_type_hints")
BUILTINS = ("__import__", "vars", "globals", "locals", "eval", "exec", "compile", "breakpoint", "__builtins__")
BY_NAME = ("getattr", "setattr", "delattr", "hasattr")
PACKAGE = "gpumem"
COURSE = "gpumem.course"         # the grading machinery: graded code never needs it


def first_reach(source: str, allow: tuple = ()) -> str | None:
    """The first reach into the grader in ``source`` (Python text), as one line naming its line
    number, or None. A source that does not parse gives None: running it says why. ``allow``: names
    of :data:`BUILTINS` and :data:`MODULES`, or :data:`PACKAGE` (strings naming it), let through (the
    kernel-wide scan lets the check cell's ``globals()``, ``gc`` and ``inspect`` without their
    :data:`REACHING` functions, and a docstring naming gpumem pass)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            child._reach_parent = node           # read by _called
    modules = {a.asname or a.name: a.name for node in ast.walk(tree) if isinstance(node, ast.Import)
               for a in node.names if a.name in REACHING}
    found = [(getattr(node, "lineno", 0), getattr(node, "col_offset", 0), why)
             for node in ast.walk(tree) for why in [_offence(node, allow) or _reaching(node, modules)] if why]
    if not found:
        return None
    line, _, why = min(found)
    return f"line {line}: {why}; the lab forbids reaching into the grader (write the lab with the tools it names)"


def _offence(node: ast.AST, allow: tuple = ()) -> str | None:
    """Why ``node`` alone reaches into the grader, or None."""
    if isinstance(node, ast.Import):
        bad = next((a.name for a in node.names if _refused_module(a.name, allow)
                    or COURSE not in allow and (a.name == COURSE or a.name.startswith(COURSE + "."))), None)
        return bad and f"imports {bad}"
    if isinstance(node, ast.ImportFrom):
        module = node.module or ""
        if _refused_module(module, allow):
            return f"imports from {module}"
        if COURSE not in allow and (module == COURSE or module.startswith(COURSE + ".")):   # r26 of lab 08
            return f"imports from {module}, the grading machinery"
        bad = next((a.name for a in node.names if a.name in ATTRIBUTES + BUILTINS + REACHING.get(module, ())), None)
        return bad and f"imports {bad} from {module}"
    if isinstance(node, ast.Attribute) and node.attr == "modules" and _called(node):
        return None              # nn.Module.modules(): sys.modules is a dict, never called
    if isinstance(node, ast.Attribute) and node.attr in ATTRIBUTES:
        return f"uses the attribute .{node.attr}"
    if isinstance(node, ast.Name) and node.id in BUILTINS and node.id not in allow:
        return f"uses {node.id}"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in BY_NAME:
        name = node.args[1] if len(node.args) > 1 else None
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
            return f"calls {node.func.id} with a name that is not a literal string"
        return None              # the literal itself is checked as a string below
    if isinstance(node, ast.Name) and node.id in BY_NAME and not _called(node):
        return f"passes {node.id} around (call it with a literal name)"
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
        text = node.value.decode("latin-1") if isinstance(node.value, bytes) else node.value
        if PACKAGE in text.lower() and PACKAGE not in allow:
            return f"a string names {PACKAGE!r}, the grader's package"
        word = text.strip()
        # everyday words ("code", "signal"), and "timeit", the name of IPython's %timeit: those modules are
        # refused by import, not by a string naming them
        named = word in MODULES and word not in ("code", "codeop", "timeit", "signal", "pdb", "ipdb", "bdb",
                                                 "unittest", "mock")
        if word in ATTRIBUTES or named or any(a in text for a in ATTRIBUTES if a.startswith("__")):
            return f"a string names {word if word in ATTRIBUTES + MODULES else 'a refused attribute'}"
    return None


def course_import(source: str) -> str | None:
    """The first import of :data:`COURSE` in ``source``, as :func:`first_reach` words it, or None: a
    definition that is graded never needs the grading machinery (review r26 of lab 08 reached the
    grader's frames through ``gpumem.course.registry.resolve``); other cells may import it."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
            [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if bad := next((n for n in names if n == COURSE or n.startswith(COURSE + ".")), None):
            return f"line {node.lineno}: imports {'from ' * isinstance(node, ast.ImportFrom)}{bad}, the grading machinery"
    return None


def _reaching(node: ast.AST, modules: dict) -> str | None:
    """``inspect.stack``, ``gc.get_objects`` ... (:data:`REACHING`) on the module by any name the
    source imported it as; ``torch.stack`` is not ``inspect.stack``."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules \
            and node.attr in REACHING[modules[node.value.id]]:
        return f"uses {modules[node.value.id]}.{node.attr}"
    return None


def _refused_module(name: str, allow: tuple = ()) -> bool:
    return name.split(".")[0] in MODULES and name.split(".")[0] not in allow


def _called(node: ast.AST) -> bool:
    """Whether ``node`` is the function of a call (set by :func:`first_reach`'s parent links)."""
    return isinstance(getattr(node, "_reach_parent", None), ast.Call) and node._reach_parent.func is node
