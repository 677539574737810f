"""Lab 03's second look at what runs: ready-made checkpoints known by their code, numbers leaving
torch known by the C function called.

``labguard``'s watch refuses code objects and files it knows. A copy of a banned file run from
its source under another name (``exec(compile(inspect.getsource(torch.utils.checkpoint),
"/tmp/mine.py", "exec"), ns)``) makes new code objects in a new file, so the watch also matches
**code content**: each function of the banned files (nested ones included, read by compiling the
file's source once) is fingerprinted by its name, bytecode and the names it uses; a long function
also by bytecode and names alone, so renaming it does not help. Lambdas, comprehensions and very
short functions are left out: a learner's own code repeats them by chance. Bytecode does not depend on line
numbers or file names, so a verbatim copy of any of those functions, pasted or re-executed,
matches. A copy with statements added (r6: ``_zz = 0`` at the top of every function changes every
bytecode) is matched by **content without bytecode** (:func:`items`): a function that names every
global, attribute, argument, local and short string a banned function of at least
:data:`MIN_ITEMS` of them names is taken for a copy of it, whatever it adds. A tripwire on top:
code that names one of ``torch.utils.checkpoint``'s private identifiers (:data:`PRIVATE`) is a
copy of it, as a learner's own checkpoint never names them.

The profile hook also sees C calls made from Python (``c_call``): :func:`c_exit` names the ones
that take numbers out of torch whatever reference was used (``torch.from_numpy`` bound before the
check, ``Tensor.numpy`` under ``torch._C.DisableTorchFunction``, which hides calls from the
``TorchFunctionMode`` of ``labescape``) and entering or leaving ``DisableTorchFunction``
(however called), which switches that mode off. (Popping torch's function-mode stack is left
alone: torch's own ``handle_torch_function`` does it on every Python-level function.)

Limits: the content match needs every item of a banned function, so a copy with one local renamed
escapes it (review r30 #1: ``labcases._balanced_peak`` inlined, ``sizes`` -> ``lengths``); for the
grader's placement answers ``labguard.answer_prints`` (copy_watch's similarity match) catches those.
A C function called from C (``map(Tensor.numpy, ...)``) raises no ``c_call`` event; the
"gradients taken from the re-run" case of ``labvariants`` then fails a checkpoint whose gradients
come from kept copies.
"""

import functools
import inspect
import types

import torch

# torch.utils.checkpoint's helpers for RNG state and inputs: not the mechanism, allowed
HELPERS = {"get_device_states", "set_device_states", "detach_variable", "check_backward_validity",
           "_get_device_module", "_infer_device_type", "_get_autocast_kwargs", "<module>"}
LONG = 64                  # bytes of bytecode from which a function is matched without its name
SHORT = 24                 # shorter functions, lambdas and comprehensions are too common to match
TENSOR_EXITS = {"numpy", "untyped_storage", "data_ptr", "_typed_storage", "storage"}
BRIDGES = {"from_numpy", "frombuffer", "_to_dlpack", "_from_dlpack", "from_dlpack", "to_dlpack"}
WATCHED = TENSOR_EXITS | BRIDGES | {"tolist", "__enter__", "__exit__"}
# torch.utils.checkpoint's private names (torch 2.13's torch/utils/checkpoint.py; checked by
# tests/test_lab03_adversarial.py): its checkpoint and its hooks call them by these names
PRIVATE = frozenset({"_checkpoint_without_reentrant_generator", "_recomputation_hook", "_checkpoint_hook",
                     "_StopRecomputationError", "_DEFAULT_DETERMINISM_MODE", "noop_context_fn"})
MIN_ITEMS = 12             # a function naming fewer things is too common to match by content


def _walk(code: types.CodeType):
    """``code`` and the code objects nested in it, leaving out the allowed helpers."""
    if code.co_name in HELPERS and code.co_name != "<module>":
        return
    if code.co_flags & inspect.CO_OPTIMIZED:          # a function (not a module or class body)
        yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _walk(const)


@functools.lru_cache(maxsize=None)
def file_prints(path: str, label: str) -> tuple[dict, dict, dict]:
    """(named, unnamed, content) fingerprints of every function in the file at ``path``."""
    try:
        with open(path, encoding="utf-8") as f:
            top = compile(f.read(), path, "exec")
    except OSError:
        return {}, {}, {}
    return code_prints(top, lambda code: f"a copy of {label}.{code.co_qualname}")


def items(code: types.CodeType) -> frozenset:
    """What a function names, bytecode aside: globals and attributes, arguments, locals and cells,
    short one-line strings (not the docstring, ``co_consts[0]``)."""
    strings = {"'" + c for c in code.co_consts[1:] if isinstance(c, str) and len(c) <= 40 and "\n" not in c}
    return frozenset(code.co_names + code.co_varnames + code.co_cellvars + code.co_freevars) | strings


def code_prints(top: types.CodeType, shown, content_too: bool = True) -> tuple[dict, dict, dict]:
    """(named, unnamed, content) fingerprints of ``top`` and the code it nests: {key: ``shown(code)``}
    for the first two, {an item: [(items, shown(code)), ...]} for the third (module docstring; left
    empty without ``content_too``: code the chapter prints, that the learner may extend)."""
    named, unnamed, content = {}, {}, {}
    for code in _walk(top):
        if not code.co_name.startswith("<") and len(code.co_code) >= SHORT:   # no lambda, comprehension
            named[(code.co_name, code.co_code, code.co_names)] = shown(code)
            if len(code.co_code) >= LONG:
                unnamed[(code.co_code, code.co_names)] = shown(code)
            mine = items(code)
            if content_too and len(mine) >= MIN_ITEMS:
                content.setdefault(max(mine, key=lambda i: (len(i), i)), []).append((mine, shown(code)))
    return named, unnamed, content


def match(code: types.CodeType, prints: tuple[dict, dict, dict]) -> str | None:
    """The banned function whose code ``code`` repeats (or contains by content), or None."""
    named, unnamed, content = prints
    found = named.get((code.co_name, code.co_code, code.co_names)) or unnamed.get((code.co_code, code.co_names))
    if found or not content:
        return found
    mine = items(code)
    return next((shown for item in mine for theirs, shown in content.get(item, ()) if theirs <= mine), None)


def private(code: types.CodeType) -> str | None:
    """What marks ``code`` as a copy of torch.utils.checkpoint: a private name of it that it uses."""
    used = PRIVATE.intersection(code.co_names)
    return f"a copy of torch.utils.checkpoint (code naming its private {min(used)})" if used else None


def merge(*prints) -> tuple[dict, dict, dict]:
    """One (named, unnamed, content) triple of fingerprints from several."""
    named, unnamed, content = {}, {}, {}
    for n, u, c in prints:
        named.update(n)
        unnamed.update(u)
        for item, found in c.items():
            content[item] = content.get(item, []) + found
    return named, unnamed, content


def c_exit(fn, graders: bool) -> str:
    """What the C function ``fn`` (a ``c_call`` event's argument) takes out of torch, '' if
    nothing; ``graders`` is True when the caller is the grader's tracer or the course's code."""
    name = getattr(fn, "__name__", None)
    if name not in WATCHED:
        return ""
    owner = getattr(fn, "__self__", None)
    owner = getattr(fn, "__objclass__", None) if owner is None else owner
    if name in ("__enter__", "__exit__"):            # with, a direct call, or ExitStack's
        off = torch._C.DisableTorchFunction
        return "torch._C.DisableTorchFunction" if owner is off or type(owner) is off else ""
    if graders:
        return ""
    if isinstance(owner, torch.Tensor):
        if name == "tolist":
            return f"tolist of {owner.numel():,} numbers" if owner.numel() > 64 else ""
        return f"Tensor.{name}" if name in TENSOR_EXITS else ""
    if name in BRIDGES and getattr(fn, "__module__", None) in ("torch", "torch._C"):
        return f"torch.{name}"
    return ""
