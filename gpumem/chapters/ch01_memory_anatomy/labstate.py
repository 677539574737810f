"""Lab 01's second guard: the learner's function must leave the grader's world as it found it.

The grader measures the truth *after* the learner's call (so it cannot be read during it). That
makes what the call leaves behind matter: a function that rebinds ``variants.measure``, writes its
own answer into the truth's cache (``variants._truth``), patches ``torch.nn.functional.linear`` or
shadows a builtin would have the grader measure a world of its making. So, around each call, the
namespaces the truth depends on are snapshotted: the guarded course modules (:data:`.labguard.MODULES`),
their classes, the contents of their module-level caches (dicts, lists, sets), ``builtins`` and
the parts of ``torch`` the measurement runs through. Anything the call rebound, added or changed
is put back, and the call fails with the names it touched. Lazily imported submodules (an
attribute that is a module, added to a torch namespace) are allowed.
"""

import builtins
import copy
import inspect
import types

import torch

_MISSING = object()


def _torch_namespaces() -> list:
    import torch.autograd.graph
    import torch.nn.functional
    import torch.nn.modules.module
    import torch.random
    return [torch, torch._C, torch._C._nn, torch._C._autograd, type(torch._C._VariableFunctions), torch.Tensor,
            torch._C.TensorBase, torch.nn.functional, torch.nn.Module, torch.nn.Linear, torch.nn.modules.module,
            torch.nn.modules.linear, torch.autograd, torch.autograd.graph, torch.autograd.graph.saved_tensors_hooks,
            torch.random, torch.UntypedStorage, torch._C.StorageBase, builtins]


def _namespaces(modules) -> list:
    """(label, object) of each namespace watched: ``modules`` (name, module), their classes, torch's."""
    found = []
    for name, module in modules:
        found.append((name, module))
        found += [(f"{name}.{k}", v) for k, v in vars(module).items()
                  if inspect.isclass(v) and v.__module__ == module.__name__]
    return found + [(getattr(ns, "__name__", repr(ns)), ns) for ns in _torch_namespaces()]


def snapshot(modules, caches: bool = True) -> tuple:
    """What :func:`restore` compares with: each namespace's bindings, and (``caches``) copies of
    the course modules' caches."""
    taken = []
    for label, ns in _namespaces(modules):
        course = caches and isinstance(ns, types.ModuleType) and ns.__name__.startswith("gpumem")
        kept = ({k: copy.deepcopy(v) for k, v in vars(ns).items()
                 if type(v) in (dict, list, set) and not k.startswith("__")} if course else {})
        taken.append((label, ns, types.MappingProxyType(dict(vars(ns))), types.MappingProxyType(kept)))
    return tuple(taken)             # read-only all the way down: the call cannot edit the snapshot


def _put(ns, key, value) -> None:
    if isinstance(ns, types.ModuleType):
        if value is _MISSING:
            vars(ns).pop(key, None)
        else:
            vars(ns)[key] = value
    elif value is _MISSING:
        delattr(ns, key)
    else:
        setattr(ns, key, value)


def _harmless(ns, key, value) -> bool:
    """An addition that changes nothing: copyreg's ``__slotnames__`` cache (copy, pickle), or a
    class attribute that is the very one it inherited (MemTracker leaves ``UntypedStorage.resize_``)."""
    if key == "__slotnames__":
        return True
    bases = ns.__mro__[1:] if isinstance(ns, type) else ()
    return next((vars(b)[key] for b in bases if key in vars(b)), _MISSING) is value


def restore(taken: tuple) -> list[str]:
    """Put back what changed since :func:`snapshot`; return the names that had changed."""
    changed = []
    for label, ns, bindings, caches in taken:
        now = dict(vars(ns))
        for key, value in bindings.items():
            if now.get(key, _MISSING) is not value:
                changed.append(f"{label}.{key}")
                _put(ns, key, value)
        for key, value in now.items():
            if key not in bindings and not isinstance(value, types.ModuleType) and not _harmless(ns, key, value):
                changed.append(f"{label}.{key}")
                _put(ns, key, _MISSING)
        for key, saved in caches.items():
            live = bindings[key]
            if live != saved:
                changed.append(f"{label}.{key} (its contents)")
                live.clear()
                live.update(saved) if not isinstance(live, list) else live.extend(saved)
    return changed


def refusal(changed: list[str]) -> str:
    """The row's detail for a call that changed ``changed`` (the first three named)."""
    changed = [c.replace("gpumem.chapters.ch01_memory_anatomy.", "").replace("gpumem.memory.", "")
               for c in changed]
    shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
    return (f"your function changed {shown}; the grader put it back: derive the count, do not patch "
            "the course or torch")
