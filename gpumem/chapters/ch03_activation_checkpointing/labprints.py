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
matches.

The profile hook also sees C calls made from Python (``c_call``): :func:`c_exit` names the ones
that take numbers out of torch whatever reference was used (``torch.from_numpy`` bound before the
check, ``Tensor.numpy`` under ``torch._C.DisableTorchFunction``, which hides calls from the
``TorchFunctionMode`` of ``labescape``) and entering or leaving ``DisableTorchFunction``
(however called), which switches that mode off. (Popping torch's function-mode stack is left
alone: torch's own ``handle_torch_function`` does it on every Python-level function.)

Limits: a C function called from C (``map(Tensor.numpy, ...)``) raises no ``c_call`` event; the
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
def file_prints(path: str, label: str) -> tuple[dict, dict]:
    """(named, unnamed) fingerprints of every function in the file at ``path``."""
    try:
        with open(path, encoding="utf-8") as f:
            top = compile(f.read(), path, "exec")
    except OSError:
        return {}, {}
    return code_prints(top, lambda code: f"a copy of {label}.{code.co_qualname}")


def code_prints(top: types.CodeType, shown) -> tuple[dict, dict]:
    """(named, unnamed) fingerprints of ``top`` and the code it nests: {key: ``shown(code)``}."""
    named, unnamed = {}, {}
    for code in _walk(top):
        if not code.co_name.startswith("<") and len(code.co_code) >= SHORT:   # no lambda, comprehension
            named[(code.co_name, code.co_code, code.co_names)] = shown(code)
            if len(code.co_code) >= LONG:
                unnamed[(code.co_code, code.co_names)] = shown(code)
    return named, unnamed


def match(code: types.CodeType, prints: tuple[dict, dict]) -> str | None:
    """The banned function whose code ``code`` repeats, or None."""
    named, unnamed = prints
    return named.get((code.co_name, code.co_code, code.co_names)) or unnamed.get((code.co_code, code.co_names))


def merge(*pairs) -> tuple[dict, dict]:
    """One (named, unnamed) pair of fingerprints from several."""
    named, unnamed = {}, {}
    for n, u in pairs:
        named.update(n)
        unnamed.update(u)
    return named, unnamed


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
