"""Lab 01: is the grader's truth still the truth? Checked once per ``check()``, before grading.

The truth is measured in the process that grades (:func:`.variants.measure`): in a kernel that is a
fresh process holding only the learner's definitions (:mod:`gpumem.course.lab_fresh`), outside one
(the course's tests) the caller's own. :mod:`.labstate` puts back only what changes *during* a
learner's call. Code run before ``check()`` in that process could change torch so that the
measurement is wrong: one that makes saved-tensor hooks record nothing turns every truth into 0, and
functions answering 0 would pass. So:

- what the measurement runs through (torch's namespaces, as :mod:`.labstate` lists them; the
  bindings of the course's modules and the code of their functions) is snapshotted when this
  module is imported (the lab imports ``labcheck`` in part 2's first cell) and compared at each
  check: a change to the course, or to torch from outside the installed libraries (a notebook
  cell's function), is put back and nothing is graded;
- a Python function in those torch namespaces must come from an installed file (a patch made
  before the import, from a notebook cell, has its cell as its file);
- every measured truth must equal :func:`expected`: ``gpumem.memory.activations.layer_parts``
  (bound at import; a formula, it does not run through torch) for the plain layer and the fused
  and HF norms (Gemma's by hand: 8Th + 4T + 4h a norm in fp32, for the fused norm's 2Th + 4T), less 3TF for the GeLU MLP with dropout (it keeps 2TF + TF + 2TF where SwiGLU keeps 8TF),
  a chain MLP's tensors composed from what each op keeps (:func:`_chain_bytes`) for SwiGLU's 8TF,
  biases adding no bytes; parameters by hand count, 2h + 2h^2 + 2hk + 3hF (2hF for the GeLU and chain MLPs,
  + h + 2k for biases); part 2's layer (:mod:`.labwide`) is held to :func:`expected_wide`. That is
  checked for a small layer of each part under each kernel before grading, for every entry
  already in the truths' caches (a cell could fill them with answers of its own), and by
  :mod:`.labcheck` and :mod:`.labpart2` for each case they grade. The measurement stays the truth the learner is
  told about; the formula is the grader's second witness.
"""

import functools
import inspect
import os
import sys
import types

from dataclasses import replace

from gpumem.memory.activations import layer_parts

from . import labguard, labstate, labwide, variants

CHANGED = ("torch or the course was changed in this kernel before the check ({}): the grader's "
           "measured truth cannot be trusted, so nothing is graded. Restart the kernel and run the "
           "lab's cells without that change")
_LAYER_PARTS = layer_parts
_SHAPE = dict(d_model=48, n_heads=6, n_kv_heads=3, ffn=80, seq=7, batch=2)     # one small layer
_INSTALLED = tuple({os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})


def _course() -> list:
    """(name, module) of the guarded course modules loaded now, less this chapter's lab* modules
    (``gpumem.course.grader_seal`` checks those against their files)."""
    return [(name, sys.modules[name]) for name in labguard.MODULES
            if name in sys.modules and not name.rsplit(".", 1)[1].startswith("lab")]


def _codes(modules) -> tuple:
    return tuple((f"{name}.{f.__qualname__}", f, f.__code__) for name, m in modules for f in labguard._functions(m))


_PRISTINE = labstate.snapshot(_course(), caches=False)
_CODES = _codes(_course())
_UNSEALED = ("_CODES",)     # grader_seal: which modules are loaded at import varies with the kernel


def _installed(path) -> bool:
    return isinstance(path, str) and os.path.realpath(path).startswith(_INSTALLED)


def _code_of(value):
    """The code a binding runs, through properties, static/class methods and partials (None: C)."""
    value = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
    value = value.func if isinstance(value, functools.partial) else value
    return getattr(value, "__code__", None) if inspect.isfunction(value) else None


def _from_outside(value) -> bool:
    """Made outside the installed libraries (a notebook cell), as far as its code or class tells."""
    code = _code_of(value)
    if code is not None:
        return not _installed(code.co_filename)
    if isinstance(value, (type, types.ModuleType)) or type(value).__module__ == "builtins":
        return False
    return not _installed(getattr(sys.modules.get(type(value).__module__), "__file__", None))


def _changed_since_import() -> list[str]:
    """The course's bindings and code, as at import: what differs is put back and named. Torch's:
    a binding made since from outside the installed libraries is put back and named (a library
    that patches torch, e.g. MemTracker's ``UntypedStorage.resize_``, is left alone: the formula
    check decides)."""
    changed = []
    for label, ns, bindings, _ in _PRISTINE:
        course = label.startswith("gpumem")
        now = dict(vars(ns))
        for key in bindings.keys() | now.keys():
            old, new = bindings.get(key, labstate._MISSING), now.get(key, labstate._MISSING)
            if old is new or (old is labstate._MISSING and (isinstance(new, types.ModuleType)
                                                            or labstate._harmless(ns, key, new))):
                continue
            if course or new is labstate._MISSING or _from_outside(new):
                changed.append(f"{label}.{key}")
                labstate._put(ns, key, old)
    for label, f, code in _CODES:
        if f.__code__ is not code:
            changed.append(f"{label} (its code)")
            f.__code__ = code
    return changed


def _foreign() -> list[str]:
    """Functions in torch's namespaces from outside the installed libraries (patched before the
    import)."""
    found = []
    for ns in labstate._torch_namespaces()[:-1]:                # builtins: IPython adds its own
        for key, value in list(vars(ns).items()):
            if (code := _code_of(value)) is not None and not _installed(code.co_filename):
                found.append(f"{getattr(ns, '__name__', ns)}.{key}")
    return found


def expected(d_model, n_heads, n_kv_heads, ffn, seq, batch, kernel, norm="fused", mlp="swiglu",
             qkv_bias=False) -> tuple[int, int]:
    """(saved bytes in bf16, parameters) of a layer by formula (module docstring)."""
    cfg = variants.config(d_model, n_heads, n_kv_heads, ffn)
    gemma, T = norm == "gemma", batch * seq
    saved = sum(_LAYER_PARTS(cfg, seq, batch, kernel, 2, norm="fused" if gemma else norm).values())
    if gemma:     # not in the library: fp32 input, 1/rms, fp32 normalised, fp32 (1 + w), two norms
        saved += 2 * (4 * T * d_model + 4 * T + 4 * T * d_model + 4 * d_model - (2 * T * d_model + 4 * T))
    h, k, F, two = d_model, cfg.kv_dim, ffn, mlp != "swiglu"
    params = 2 * h + 2 * h * h + 2 * h * k + (2 if two else 3) * h * F + (h + 2 * k if qkv_bias else 0)
    if mlp == "gelu-dropout":
        saved -= 3 * T * F
    elif two:                 # a chain: SwiGLU's four bf16 F-wide tensors out, the chain's in
        saved += _chain_bytes(tuple(mlp), T * F) - 8 * T * F
    return saved, params


# what each op of a chain keeps for backward (checked against saved-tensor hooks by
# tests/test_lab01_adversarial.py, op by op); the casts return their input when it already has the dtype
_KEEPS = {"gelu": "in", "gelu_tanh": "in", "relu": "out", "square": "in", "silu": "in", "sigmoid": "out",
          "tanh": "out", "exp": "out", "dropout": "mask", "scale": "", "float": "", "bf16": ""}


def _chain_bytes(ops: tuple, n: int) -> int:
    """Bytes a chain MLP keeps for ``n`` hidden numbers: each kept tensor once, down's input too.
    ``made`` holds each hidden tensor's index in ``size``, in the order the chain makes them (a cast
    to the dtype a tensor has returns it, so one tensor can appear twice); a product keeps both factors."""
    size, made, kept = [2], [0], {}                      # tensor 0: up's bf16 output
    for op in ops:
        now = made[-1]
        if op in ("float", "bf16"):
            want = 4 if op == "float" else 2
            if want != size[now]:
                size.append(want)
            made.append(len(size) - 1)
            continue
        if op.startswith("mul"):
            other = made[-1 - int(op[3:])]
            kept[now], kept[other] = size[now] * n, size[other] * n
            size.append(max(size[now], size[other]))   # bf16 times fp32 is fp32
        else:
            size.append(size[now])
            if _KEEPS[op] == "in":
                kept[now] = size[now] * n
            elif _KEEPS[op] == "out":
                kept[len(size) - 1] = size[now] * n
            elif _KEEPS[op] == "mask":
                kept["mask", len(size)] = n
        made.append(len(size) - 1)
    last = made[-1] if size[made[-1]] == 2 else "down"  # type_as copies a fp32 tensor back to bf16
    kept[last] = 2 * n
    return sum(kept.values())


_KEYS = ("d_model", "n_heads", "n_kv_heads", "ffn", "seq", "batch", "kernel", "norm", "mlp", "qkv_bias")


def _disagreement(case: dict, got) -> str:
    """Empty if the measured (bytes, parameters) ``got`` is what :func:`expected` says."""
    want = expected(**case)
    if tuple(got) == want:
        return ""
    return (f"{', '.join(f'{k}={v}' for k, v in case.items())} measures {got[0]:,} B and {got[1]:,} "
            f"parameters, the formula {want[0]:,} B and {want[1]:,}")


def disagreement(case: dict, got) -> str:
    """The row's detail when a graded case's measured truth is not the formula's, else empty."""
    said = _disagreement(case, got)
    return CHANGED.format(said) if said else ""


def expected_wide(d_model, n_heads, n_kv_heads, head_dim, ffn, seq, batch, kernel, qk_norm) -> tuple[int, int]:
    """Part 2's layer (:mod:`.labwide`) by formula: ``layer_parts`` of its configuration, whose
    naive and eager attention terms (q, expanded k and v; W_o's input) are taken at d_model =
    n_heads * head_dim, the width they have; ``layer_parts`` knows only Qwen3's per-head q/k
    norms, so OLMo 2's full-width ones are added by hand (each keeps its input and one fp32
    1/rms per token: e*T*(q + k) + 2 * 4T); parameters by hand count."""
    cfg = labwide.config(d_model, n_heads, n_kv_heads, head_dim, ffn, qk_norm)
    parts = _LAYER_PARTS(cfg, seq, batch, kernel, 2)
    if kernel != "flash":
        core = _LAYER_PARTS(replace(cfg, d_model=cfg.q_dim), seq, batch, kernel, 2)
        parts.update({key: core[key] for key in ("q, expanded k and v", "W_o input")})
    h, q, k, T = d_model, cfg.q_dim, cfg.kv_dim, batch * seq
    full = qk_norm == "full"
    norm_params = {"none": 0, "per-head": 2 * head_dim, "full": q + k}[qk_norm]
    return (sum(parts.values()) + (2 * T * (q + k) + 8 * T if full else 0),
            2 * h + 2 * h * q + 2 * h * k + 3 * h * ffn + norm_params)


def _wide_disagreement(case: dict, got) -> str:
    want = expected_wide(**case)
    if tuple(got) == want:
        return ""
    return (f"{', '.join(f'{k}={v}' for k, v in case.items())} measures {got[0]:,} B and {got[1]:,} "
            f"parameters, the formula {want[0]:,} B and {want[1]:,}")


def wide_disagreement(case: dict, got) -> str:
    """Part 2's :func:`disagreement`."""
    said = _wide_disagreement(case, got)
    return CHANGED.format(said) if said else ""


_WIDE = dict(d_model=48, n_heads=4, n_kv_heads=2, head_dim=16, ffn=80, seq=7, batch=2)


def _caches_disagree() -> str:
    """Measure the small layers afresh under each kernel; then every cached truth (a cell could
    fill the caches with answers of its own) must be the formula's: the first that is not."""
    for kernel, qk_norm in (("flash", "full"), ("naive", "per-head"), ("eager", "full")):
        plain, wide = dict(_SHAPE, kernel=kernel, norm="fused", mlp="swiglu", qkv_bias=False), dict(
            _WIDE, kernel=kernel, qk_norm=qk_norm)
        variants._truth.pop(tuple(plain.values()), None)
        labwide._truth.pop(tuple(wide.values()), None)
        if said := _disagreement(plain, variants.measure(**plain)) or _wide_disagreement(wide, labwide.measure(**wide)):
            return said
    for cache, keys, check in ((variants._truth, _KEYS, _disagreement),
                               (labwide._truth, labwide.KEYS, _wide_disagreement)):
        for key, got in list(cache.items()):
            try:
                said = check(dict(zip(keys, key, strict=True)), got)
            except Exception:                                     # not even a key measure makes
                said = f"a truth cache holds {key!r}"
            if said:
                return said
    return ""


# Review r15 #1: the chains stop neither a measured model of how operations compose nor a table of
# (previous op, op, dtype) -> bytes, 253 entries, measured with variants.measure before the check.
# Fewer measurements than that table's entries do not determine it, so a cache holding more chain
# MLPs than TABULATED that the grader did not measure is refused. Only the lazy version: a learner
# who empties the cache, or measures a ChainMLP with hooks of their own, is not seen.
TABULATED = 200
TABLE_SAYS = ("the grader's cache of measured layers (variants._truth) holds {} chain MLPs measured in this "
              "kernel before the check, not by the grader (mlp={!r} among them): a table of measured chains "
              "is not a count you derived, so nothing is graded. Restart the kernel and derive the chains "
              "(saved_by on one operation is fine)")
_GRADERS: set = set()        # the chain keys the grader measured itself (labcheck.check adds them)


def _chain_keys() -> set:
    return {k for k in list(variants._truth) if type(k) is tuple and len(k) == len(_KEYS) and type(k[8]) is tuple}


def graded(before: set) -> None:
    """After a check: the chain keys measured since ``before`` (the cache's chain keys then) are the
    grader's."""
    _GRADERS.update(_chain_keys() - before)


def tabulated() -> str:
    """The row's detail when the truth cache holds more than :data:`TABULATED` chain MLPs the
    grader did not measure, else empty."""
    mine = _chain_keys() - _GRADERS
    return TABLE_SAYS.format(len(mine), max(mine, key=lambda k: (len(k[8]), repr(k)))[8]) \
        if len(mine) > TABULATED else ""


def refusal() -> str:
    """Empty when the truth can be trusted; else the row's detail (and what changed is put back)."""
    changed = _changed_since_import() + _foreign()
    if not changed and (said := _caches_disagree()):
        changed.append(said)
    if not changed:
        return tabulated()
    shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
    return CHANGED.format(shown.replace("gpumem.chapters.ch01_memory_anatomy.", "").replace("gpumem.memory.", ""))
