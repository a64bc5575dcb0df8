"""``Module``: the base of every layer and model (parameters, buffers, submodules, state
dicts, weight files and tracing to a graph), plus ``Sequential``, ``ModuleList``, ``ModuleDict``.

Attributes assigned a :class:`Parameter` or a :class:`Module` are registered by name, as in
torch, so ``state_dict()`` keys are dotted paths (``layer1.0.conv1.weight``)::

    >>> import opsnn, numpy as np
    >>> net = opsnn.nn.Sequential(opsnn.nn.Linear(4, 8), opsnn.nn.ReLU(), opsnn.nn.Linear(8, 2))
    >>> sorted(net.state_dict())
    ['0.bias', '0.weight', '2.bias', '2.weight']
    >>> net(opsnn.tensor(np.ones((3, 4), np.float32))).shape
    (3, 2)
"""

from __future__ import annotations

import functools
import inspect
import itertools
from collections import OrderedDict
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from .. import autograd as _autograd  # noqa: F401 - gives Tensor requires_grad / grad before Parameters exist
from .. import dtypes as _dt
from ..autograd.graph import RemovableHandle
from ..errors import (
    ARGUMENT_ERRORS,
    DTypeError,
    OpsnnError,
    OpsnnRuntimeError,
    ParamInvalidError,
    bad_arguments_message,
)
from ..runtime.device import Device
from ..tensor import Tensor, empty, tensor

#: keys of the forward hooks (one sequence: a handle removes only its own)
_HOOK_KEYS = itertools.count()


class StateDictError(ParamInvalidError):
    """``load_state_dict`` found missing, unexpected or mis-shaped tensors. The lists are kept
    as attributes: ``missing`` and ``unexpected`` (names), ``mismatched`` ((name, expected, got))."""

    def __init__(self, where: str, missing=(), unexpected=(), mismatched=(), errors=()):
        self.missing, self.unexpected, self.mismatched = list(missing), list(unexpected), list(mismatched)
        self.errors = list(errors)
        parts = list(self.errors)
        if self.missing:
            parts.append(f"{len(self.missing)} missing: {', '.join(self.missing)}")
        if self.unexpected:
            parts.append(f"{len(self.unexpected)} unexpected: {', '.join(self.unexpected)}")
        if self.mismatched:
            parts.append(
                f"{len(self.mismatched)} mis-shaped: "
                + ", ".join(f"{n} (expected {e}, got {g})" for n, e, g in self.mismatched)
            )
        super().__init__(f"load_state_dict into {where}: " + "; ".join(parts))


class IncompatibleKeys(NamedTuple):
    """What a non-strict ``load_state_dict`` skipped."""

    missing_keys: list
    unexpected_keys: list


class Parameter(Tensor):
    """A tensor that a :class:`Module` registers as a weight when assigned to one of its attributes.
    A floating parameter requires grad (as in torch) unless ``requires_grad=False``.

    >>> import numpy as np
    >>> p = Parameter(np.zeros((2, 3), np.float32))
    >>> p.shape, p.requires_grad
    ((2, 3), True)
    """

    __slots__ = ()

    def __init__(self, data, dtype=None, requires_grad: bool = True):
        src = tensor(data, dtype)  # always a fresh copy in pool memory: a Parameter owns its data
        super().__init__(src._array)
        if requires_grad and _dt.is_float(self.dtype):
            self.requires_grad_(True)

    @classmethod
    def wrap(cls, t: Tensor, requires_grad: bool = True) -> Parameter:
        """A Parameter over ``t``'s memory (no copy)."""
        p = cls.__new__(cls)
        Tensor.__init__(p, t.numpy())
        if requires_grad and _dt.is_float(p.dtype):
            p.requires_grad_(True)
        return p

    def __repr__(self) -> str:
        return "Parameter(" + super().__repr__() + ")"


def _as_array(v, name: str) -> np.ndarray:
    if isinstance(v, Tensor):
        return v.numpy()
    try:
        return np.asarray(v)
    except Exception as exc:  # noqa: BLE001 - report any conversion failure as a typed error
        raise ParamInvalidError(
            f"load_state_dict: value of {name!r} is not array-like ({type(v).__name__}): {exc}"
        ) from None


class Module:
    """Base class of layers and models: subclasses assign parameters and submodules in
    ``__init__`` (after ``super().__init__()``) and define ``forward``. Calling the module
    runs ``forward`` eagerly through the opsnn ops.

    Modules are built in inference mode (``training`` is False); weights are drawn from
    ``opsnn.nn.init``'s seeded generator, so building under ``nn.init.seeded(s)`` is
    deterministic.
    """

    def __init_subclass__(cls, **kwargs):
        """opsnn's own layers: a constructor argument of the wrong kind (``Conv2d(3, 'a', 3)``,
        ``groups=0``, an array for a flag) is a ParamInvalidError naming it, not the bare error
        the arithmetic on it raised. User subclasses are left alone (their errors are theirs)."""
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None or not cls.__module__.startswith("opsnn."):
            return

        @functools.wraps(init)
        def checked_init(self, *args, **kw):
            try:
                init(self, *args, **kw)
            except OpsnnError:
                raise
            except ARGUMENT_ERRORS as exc:
                raise ParamInvalidError(
                    bad_arguments_message(type(self).__name__, init, (self,) + args, kw, exc)
                ) from None

        cls.__init__ = checked_init

    def __init__(self):
        d = self.__dict__
        d["_parameters"] = OrderedDict()
        d["_buffers"] = OrderedDict()
        d["_non_persistent"] = set()
        d["_optional_buffers"] = set()
        d["_modules"] = OrderedDict()
        d["training"] = False

    # -- registration -------------------------------------------------------------------------
    def _registry(self, what: str) -> dict:
        reg = self.__dict__.get(what)
        if reg is None:
            raise ParamInvalidError(f"{type(self).__name__}: call super().__init__() before assigning attributes")
        return reg

    def __setattr__(self, name: str, value) -> None:
        params = self._registry("_parameters")
        buffers, modules = self.__dict__["_buffers"], self.__dict__["_modules"]
        if isinstance(value, Parameter):
            self._forget(name, keep="_parameters")  # a replaced parameter keeps its place, as torch's
            params[name] = value
        elif isinstance(value, Module):
            self._forget(name, keep="_modules")  # a replaced submodule keeps its place (Sequential order)
            modules[name] = value
        elif name in params:
            if value is not None and not isinstance(value, Tensor):
                raise ParamInvalidError(
                    f"{type(self).__name__}.{name} is a parameter: assign a Tensor or None, got {type(value).__name__}"
                )
            params[name] = value if value is None or isinstance(value, Parameter) else Parameter(value)
        elif name in buffers:
            if value is not None and not isinstance(value, Tensor):
                value = tensor(value)
            buffers[name] = value
        elif name in modules:
            if value is not None:
                raise ParamInvalidError(
                    f"{type(self).__name__}.{name} is a submodule: assign a Module or None, got {type(value).__name__}"
                )
            modules[name] = None
        else:
            object.__setattr__(self, name, value)

    def _forget(self, name: str, keep: str = "") -> None:
        for reg in ("_parameters", "_buffers", "_modules"):
            if reg != keep:
                self.__dict__[reg].pop(name, None)
        self.__dict__.pop(name, None)

    def __getattr__(self, name: str):
        # only reached when normal lookup fails: parameters, buffers and submodules live in registries
        d = self.__dict__
        for reg in ("_parameters", "_buffers", "_modules"):
            r = d.get(reg)
            if r is not None and name in r:
                return r[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        for reg in ("_parameters", "_buffers", "_modules"):
            if name in self.__dict__[reg]:
                del self.__dict__[reg][name]
                return
        object.__delattr__(self, name)

    def register_parameter(self, name: str, value) -> None:
        """Register ``value`` (a Tensor, array or None) as parameter ``name``."""
        self._check_name(name)
        self._forget(name)
        self._parameters[name] = (
            None if value is None else (value if isinstance(value, Parameter) else Parameter(value))
        )

    def register_buffer(self, name: str, value, persistent: bool = True, optional: bool = False) -> None:
        """Register a non-learnable tensor (running statistics, caches). ``persistent=False``
        keeps it out of ``state_dict``; ``optional=True`` lets ``load_state_dict`` accept a
        checkpoint without it (e.g. BatchNorm's ``num_batches_tracked``)."""
        self._check_name(name)
        self._forget(name)
        self._buffers[name] = None if value is None else (value if isinstance(value, Tensor) else tensor(value))
        if not persistent:
            self._non_persistent.add(name)
        if optional:
            self._optional_buffers.add(name)

    def register_module(self, name: str, module: Module | None) -> None:
        self._check_name(name)
        if module is not None and not isinstance(module, Module):
            raise ParamInvalidError(f"register_module: {name!r} must be a Module, got {type(module).__name__}")
        self._forget(name)
        self._modules[name] = module

    add_module = register_module

    def _check_name(self, name: str) -> None:
        if not isinstance(name, str) or not name or "." in name:
            raise ParamInvalidError(
                f"{type(self).__name__}: attribute names must be non-empty strings without '.', got {name!r}"
            )
        self._registry("_parameters")

    # -- traversal ----------------------------------------------------------------------------
    def named_children(self) -> Iterator[tuple[str, Module]]:
        for n, m in self._modules.items():
            if m is not None:
                yield n, m

    def children(self) -> Iterator[Module]:
        for _, m in self.named_children():
            yield m

    def named_modules(self, prefix: str = "", remove_duplicate: bool = True) -> Iterator[tuple[str, Module]]:
        """Depth-first ``(dotted path, module)`` pairs, self first (a shared module once unless
        ``remove_duplicate=False``)."""
        seen = set()
        stack = [(prefix, self)]
        while stack:
            name, mod = stack.pop(0)
            if remove_duplicate:
                if id(mod) in seen:
                    continue
                seen.add(id(mod))
            yield name, mod
            stack[0:0] = [(f"{name}.{n}" if name else n, m) for n, m in mod.named_children()]

    def modules(self) -> Iterator[Module]:
        for _, m in self.named_modules():
            yield m

    def _named_members(
        self, reg: str, prefix: str, recurse: bool, persistent_only: bool = False, remove_duplicate: bool = True
    ):
        seen = set()
        mods = self.named_modules(prefix) if recurse else [(prefix, self)]
        for mname, mod in mods:
            skip = mod._non_persistent if persistent_only else ()
            for n, t in mod.__dict__[reg].items():
                if t is None or n in skip:
                    continue
                if remove_duplicate:
                    if id(t) in seen:
                        continue
                    seen.add(id(t))
                yield (f"{mname}.{n}" if mname else n), t

    def named_parameters(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Parameter]]:
        """``(dotted name, Parameter)`` pairs; a parameter shared by two modules appears once."""
        return self._named_members("_parameters", prefix, recurse)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Tensor]]:
        return self._named_members("_buffers", prefix, recurse)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def num_parameters(self) -> int:
        return sum(p.numel for p in self.parameters())

    # -- state -------------------------------------------------------------------------------------
    def state_dict(self, prefix: str = "", *, destination=None, keep_vars: bool = False) -> OrderedDict[str, Tensor]:
        """Every parameter and persistent buffer by dotted name, as torch's: ``prefix`` is prepended to
        each key, ``destination`` (a mapping) is filled and returned instead of a new OrderedDict, a
        module that overrides ``get_extra_state`` adds ``<prefix>_extra_state``, and the state-dict hooks
        run (pre-hooks before a module's entries, post-hooks after its subtree). The values are the live
        tensors, not copies, whatever ``keep_vars`` says (it is passed on to the pre-hooks)."""
        if not isinstance(prefix, str):
            raise ParamInvalidError(
                f"state_dict: prefix must be a str (destination and keep_vars are keywords), got {type(prefix).__name__}"
            )
        out = OrderedDict() if destination is None else destination
        self._save_tree(out, prefix, keep_vars)
        return out

    def _save_tree(self, out, prefix: str, keep_vars: bool) -> None:
        d = self.__dict__
        for hook in list(d.get("_state_dict_pre_hooks", {}).values()):
            hook(self, prefix, keep_vars)
        for n, t in self._parameters.items():
            if t is not None:
                out[prefix + n] = t
        for n, t in self._buffers.items():
            if t is not None and n not in self._non_persistent:
                out[prefix + n] = t
        if type(self).get_extra_state is not Module.get_extra_state:
            out[prefix + "_extra_state"] = self.get_extra_state()
        for n, m in self._modules.items():
            if m is not None:
                m._save_tree(out, prefix + n + ".", keep_vars)
        for hook in list(d.get("_state_dict_post_hooks", {}).values()):
            if hook(self, out, prefix, {"version": getattr(self, "_version", 1)}) is not None:
                raise ParamInvalidError("state_dict: a state_dict post-hook must return None (edit the dict in place)")

    def _tensor_state(self) -> OrderedDict[str, Tensor]:
        """``state_dict()``'s tensors without running its hooks or extra state (for loading and tracing)."""
        out = OrderedDict()
        for mname, mod in self.named_modules(remove_duplicate=False):
            for reg in ("_parameters", "_buffers"):
                for n, t in mod.__dict__[reg].items():
                    if t is not None and (reg == "_parameters" or n not in mod._non_persistent):
                        out[f"{mname}.{n}" if mname else n] = t
        return out

    def get_extra_state(self):
        """Override (with ``set_extra_state``) to save any picklable object under ``_extra_state`` in
        ``state_dict``, as torch's; the base class has none."""
        raise OpsnnRuntimeError(
            f"{type(self).__name__}.get_extra_state: not overridden; a module saves extra state by defining "
            "get_extra_state and set_extra_state"
        )

    def set_extra_state(self, state) -> None:
        """Override (with ``get_extra_state``) to restore what ``get_extra_state`` returned."""
        raise OpsnnRuntimeError(
            f"{type(self).__name__}.set_extra_state: not overridden, but the state dict has an _extra_state for it"
        )

    def load_state_dict(self, state_dict, strict: bool = True) -> IncompatibleKeys:
        """Copy tensors (opsnn Tensors, numpy arrays, array-likes) into this module's
        parameters and buffers by name. Shapes must match exactly; floating values are cast
        to the parameter's dtype. Raises :class:`StateDictError` listing every missing,
        unexpected and mis-shaped tensor (missing/unexpected only when ``strict``); nothing
        is written when it raises, unless a load-state-dict post-hook is registered in the
        tree: then, as torch, each subtree is written and its post-hooks run (they may edit
        the missing/unexpected lists the strict check reads) before the error is raised.

        Load-state-dict pre-hooks run per module before its keys are read, with torch's arguments
        (they may edit the dict, which is a copy of ``state_dict``); ``_extra_state`` goes to
        ``set_extra_state`` of a module that overrides it.

        >>> import opsnn, numpy as np
        >>> lin = opsnn.nn.Linear(2, 3)
        >>> lin.load_state_dict({"weight": np.ones((3, 2)), "bias": np.zeros(3)})
        IncompatibleKeys(missing_keys=[], unexpected_keys=[])
        """
        if not hasattr(state_dict, "items"):
            raise ParamInvalidError(
                f"load_state_dict: expected a mapping of name -> tensor, got {type(state_dict).__name__}"
            )
        state = OrderedDict(state_dict.items())
        missing, unexpected, errors, mismatched, writes, extras = [], [], [], [], [], []
        # with post-hooks, torch's order: each subtree is written, then its module's post-hooks run
        eager = any(m.__dict__.get("_load_state_dict_post_hooks") for m in self.modules())
        keys = IncompatibleKeys(missing, unexpected)

        def visit(mod: Module, local, prefix: str) -> None:
            d = mod.__dict__
            for hook in list(d.get("_load_state_dict_pre_hooks", {}).values()):
                hook(mod, local, prefix, {}, True, missing, unexpected, errors)
            own = {}
            for reg in ("_parameters", "_buffers"):
                for n, t in d[reg].items():
                    if t is not None and (reg == "_parameters" or n not in mod._non_persistent):
                        own[n] = t
            for n, dst in own.items():
                k = prefix + n
                if k not in local:
                    if n not in mod._optional_buffers:
                        missing.append(k)
                    continue
                arr = _as_array(local[k], k)
                if tuple(arr.shape) != tuple(dst.shape):
                    mismatched.append((k, tuple(dst.shape), tuple(arr.shape)))
                elif not _castable(arr.dtype, dst.dtype):
                    mismatched.append(
                        (k, f"{tuple(dst.shape)} {_dt.name(dst.dtype)}", f"{tuple(arr.shape)} {_dt.name(arr.dtype)}")
                    )
                else:
                    writes.append((dst, arr))
            extra = prefix + "_extra_state"
            if type(mod).set_extra_state is not Module.set_extra_state:
                if extra in local:
                    extras.append((mod, local[extra]))
                else:
                    missing.append(extra)
            elif extra in local:
                unexpected.append(extra)
            for k in local:
                if k.startswith(prefix) and k != extra:
                    head, dot, _ = k[len(prefix) :].partition(".")
                    if (head not in d["_modules"]) if dot else (head not in own):
                        unexpected.append(k)
            if eager:
                flush()
            for n, child in d["_modules"].items():
                if child is not None:
                    cp = prefix + n + "."
                    visit(child, OrderedDict((k, v) for k, v in local.items() if k.startswith(cp)), cp)
            for hook in list(d.get("_load_state_dict_post_hooks", {}).values()):
                if hook(mod, keys) is not None:
                    raise ParamInvalidError("load_state_dict: a load_state_dict post-hook must return None")

        def flush() -> None:
            for dst, arr in writes:
                dst.copy_(arr)
            for mod, value in extras:
                mod.set_extra_state(value)
            writes.clear()
            extras.clear()

        visit(self, state, "")
        if errors or mismatched or (strict and (missing or unexpected)):
            if eager:
                self._weights_loaded()
            raise StateDictError(
                type(self).__name__, missing if strict else (), unexpected if strict else (), mismatched, errors
            )
        flush()
        self._weights_loaded()
        return keys

    def _weights_loaded(self) -> None:
        """Called on every module after ``load_state_dict`` wrote new values (caches derived
        from weights refresh here)."""
        for m in self.modules():
            m.__dict__.pop("_derived_caches", None)
            hook = type(m).__dict__.get("on_weights_loaded")
            if hook is not None:
                hook(m)

    def derived_cache(self, name: str) -> dict:
        """A dict kept on this module for data a caller derives from its weights (packed or
        converted copies), shared by every user of the module; ``load_state_dict`` empties it.

        >>> import opsnn
        >>> lin = opsnn.nn.Linear(2, 3)
        >>> lin.derived_cache("my.packs")["w"] = "packed"
        >>> lin.derived_cache("my.packs")
        {'w': 'packed'}
        """
        return self.__dict__.setdefault("_derived_caches", {}).setdefault(name, {})

    def load_weights(self, source, strict: bool = True) -> IncompatibleKeys:
        """Load weights from a local ``.safetensors``, ``.npz`` or ``.onnx`` file (ONNX:
        initializers by name), or from a mapping; see :func:`opsnn.nn.read_weights`."""
        from .weights import read_weights

        sd = source if hasattr(source, "items") else read_weights(source, names=self._tensor_state())
        return self.load_state_dict(sd, strict=strict)

    def save_weights(self, path) -> str:
        """Write ``state_dict()`` to ``path`` (``.safetensors`` or ``.npz``)."""
        from .weights import write_weights

        return write_weights(self._tensor_state(), path)

    # -- modes and dtype -------------------------------------------------------------------------
    def train(self, mode: bool = True) -> Module:
        for m in self.modules():
            m.__dict__["training"] = bool(mode)
        return self

    def eval(self) -> Module:
        return self.train(False)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset every parameter's ``.grad`` (to None, or to zeros when ``set_to_none=False``)."""
        for p in self.parameters():
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad = empty(p.shape, p.dtype)
                p.grad.numpy().fill(0)

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        """Freeze (``False``) or unfreeze every parameter; returns self."""
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def to(self, *args, **kwargs) -> Module:
        """torch's ``module.to(...)``: a dtype casts floating parameters and buffers in place; a
        device (``"cpu"``, ``opsnn.Device``) is where they already are; returns self."""
        dtype = kwargs.pop("dtype", None)
        kwargs.pop("non_blocking", None)
        for a in list(args) + [kwargs.pop("device", None)]:
            if a is None:
                continue
            if isinstance(a, str) and a.split(":")[0] in ("cpu", "cuda", "mps", "npu", "xpu"):
                if not a.startswith("cpu"):
                    raise ParamInvalidError(f"Module.to: opsnn runs on the CPU, got device {a!r}")
            elif isinstance(a, Device):
                continue
            else:
                dtype = a
        if kwargs:
            raise ParamInvalidError(f"Module.to: unexpected keyword(s) {sorted(kwargs)}")
        return self if dtype is None else self._cast(dtype)

    def float(self) -> Module:
        return self._cast("float32")

    def double(self) -> Module:
        return self._cast("float64")

    def half(self) -> Module:
        return self._cast("float16")

    def bfloat16(self) -> Module:
        return self._cast("bfloat16")

    def cpu(self) -> Module:
        return self

    def get_submodule(self, target: str) -> Module:
        """The submodule at dotted path ``target`` (``""``: self), as torch's."""
        m = self
        for part in target.split(".") if target else ():
            sub = m._modules.get(part)
            if sub is None:
                raise ParamInvalidError(f"get_submodule: {type(m).__name__} has no submodule {part!r} (in {target!r})")
            m = sub
        return m

    def get_parameter(self, target: str) -> Parameter:
        """The parameter at dotted path ``target``, as torch's."""
        path, _, name = target.rpartition(".")
        p = self.get_submodule(path)._parameters.get(name)
        if p is None:
            raise ParamInvalidError(f"get_parameter: no parameter {target!r}")
        return p

    def get_buffer(self, target: str) -> Tensor:
        """The buffer at dotted path ``target``, as torch's."""
        path, _, name = target.rpartition(".")
        mod = self.get_submodule(path)
        if name not in mod._buffers or mod._buffers[name] is None:
            raise ParamInvalidError(f"get_buffer: {type(mod).__name__} has no buffer {name!r} (in {target!r})")
        return mod._buffers[name]

    def set_submodule(self, target: str, module: Module, strict: bool = False) -> None:
        """Put ``module`` at dotted path ``target`` (its parent must exist), as torch's: an existing
        attribute there must be a submodule; ``strict=True`` also requires one to be there already."""
        if not isinstance(target, str) or not target:
            raise ParamInvalidError(f"set_submodule: target must be a non-empty dotted path, got {target!r}")
        if not isinstance(module, Module):
            raise ParamInvalidError(f"set_submodule: module must be an opsnn.nn.Module, got {type(module).__name__}")
        path, _, name = target.rpartition(".")
        parent = self.get_submodule(path)
        present = name in parent._modules or name in parent._parameters or name in parent._buffers
        present = present or name in parent.__dict__
        if strict and not present:
            raise ParamInvalidError(f"set_submodule: {type(parent).__name__} has no attribute {name!r} (strict=True)")
        if present and name not in parent._modules:
            raise ParamInvalidError(f"set_submodule: {type(parent).__name__}.{name} is not a submodule")
        setattr(parent, name, module)

    def register_forward_pre_hook(self, hook) -> RemovableHandle:
        """``hook(module, args)`` runs before ``forward``; a result other than None replaces the
        positional arguments (a tuple, or one value). ``handle.remove()`` unregisters it."""
        return self._add_hook("_forward_pre_hooks", hook)

    def register_forward_hook(self, hook) -> RemovableHandle:
        """``hook(module, args, output)`` runs after ``forward``; a result other than None replaces
        the output. ``handle.remove()`` unregisters it."""
        return self._add_hook("_forward_hooks", hook)

    def register_full_backward_pre_hook(self, hook, prepend: bool = False) -> RemovableHandle:
        """``hook(module, grad_output)`` runs when the gradients of this call's outputs are computed
        (a tuple, None where an output is not a tensor or has no gradient); a tuple it returns replaces
        them. As torch's (an identity node on the outputs); ``prepend`` runs it before the others."""
        return self._add_hook("_backward_pre_hooks", hook, prepend)

    def register_full_backward_hook(self, hook, prepend: bool = False) -> RemovableHandle:
        """``hook(module, grad_input, grad_output)`` runs when the gradients of this call's positional
        inputs are computed; a tuple it returns replaces ``grad_input``. As torch's: ``grad_input`` has
        None for non-tensor arguments and those that need no gradient; when no input needs one, the hook
        runs at the outputs' gradients with all-None ``grad_input`` (and must return None)."""
        return self._add_hook("_backward_hooks", hook, prepend)

    def register_state_dict_pre_hook(self, hook) -> RemovableHandle:
        """``hook(module, prefix, keep_vars)`` runs before ``state_dict`` saves this module's entries."""
        return self._add_hook("_state_dict_pre_hooks", hook)

    def register_state_dict_post_hook(self, hook) -> RemovableHandle:
        """``hook(module, state_dict, prefix, local_metadata)`` runs after ``state_dict`` saved this
        module's subtree; it edits ``state_dict`` in place and returns None."""
        return self._add_hook("_state_dict_post_hooks", hook)

    def register_load_state_dict_pre_hook(self, hook) -> RemovableHandle:
        """``hook(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
        error_msgs)`` runs before ``load_state_dict`` reads this module's keys (torch's arguments; it may
        edit ``state_dict``, and a message appended to ``error_msgs`` fails the load)."""
        return self._add_hook("_load_state_dict_pre_hooks", hook)

    def register_load_state_dict_post_hook(self, hook) -> RemovableHandle:
        """``hook(module, incompatible_keys)`` runs after ``load_state_dict`` loaded this module's subtree;
        it may edit ``incompatible_keys.missing_keys`` / ``unexpected_keys`` before the strict check."""
        return self._add_hook("_load_state_dict_post_hooks", hook)

    def _add_hook(self, table: str, hook, prepend: bool = False) -> RemovableHandle:
        if not callable(hook):
            raise ParamInvalidError(
                f"{table.strip('_').replace('_', ' ')}: expected a callable, got {type(hook).__name__}"
            )
        hooks = self.__dict__.setdefault(table, OrderedDict())
        key = next(_HOOK_KEYS)
        hooks[key] = hook
        if prepend:
            hooks.move_to_end(key, last=False)
        return RemovableHandle(hooks, key)

    def to_empty(self, *, device, recurse: bool = True) -> Module:
        """torch's ``to_empty``: parameters and buffers on ``device`` with unspecified values. opsnn has no
        meta device, so every tensor already has CPU memory: each keeps its object and memory, whose
        values are from now on unspecified (caches derived from them are dropped). ``device``: the CPU."""
        _check_cpu("Module.to_empty", device)
        for m in self.modules() if recurse else [self]:
            m.__dict__.pop("_derived_caches", None)
        return self

    def type(self, dst_type) -> Module:
        """torch's ``type``: cast every parameter and buffer, floating or not, to ``dst_type`` (an opsnn
        dtype, a torch dtype or a ``"torch.FloatTensor"``-style name) in place; returns self."""
        dt = _dst_dtype(dst_type)
        for m in self.modules():
            for reg in ("_parameters", "_buffers"):
                d = m.__dict__[reg]
                for n, t in list(d.items()):
                    if t is None or t.dtype == dt:
                        continue
                    if isinstance(t, Parameter) and t.requires_grad and not _dt.is_float(dt):
                        raise DTypeError(
                            f"Module.type: parameter {n!r} of {type(m).__name__} requires grad, so it cannot "
                            f"become {_dt.name(dt)} (only floating tensors require grad)"
                        )
                    arr = t.numpy().astype(dt)
                    d[n] = Parameter(arr, requires_grad=t.requires_grad) if isinstance(t, Parameter) else tensor(arr)
        self._weights_loaded()
        return self

    def _cast(self, dtype) -> Module:
        """Cast floating parameters and buffers to ``dtype`` in place (returns self)."""
        dt = _dt.get(dtype)
        if not _dt.is_float(dt):
            raise DTypeError(f"Module.to: dtype must be a floating type, got {_dt.name(dt)}")
        for m in self.modules():
            for reg in ("_parameters", "_buffers"):
                d = m.__dict__[reg]
                for n, t in list(d.items()):
                    if t is not None and _dt.is_float(t.dtype) and t.dtype != dt:
                        arr = t.numpy().astype(dt)
                        d[n] = (
                            Parameter(arr, requires_grad=t.requires_grad) if isinstance(t, Parameter) else tensor(arr)
                        )
        self._weights_loaded()
        return self

    def apply(self, fn) -> Module:
        for m in list(self.modules())[::-1]:
            fn(m)
        return self

    # -- running -----------------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def __call__(self, *args, **kwargs):
        d = self.__dict__
        pre, post = d.get("_forward_pre_hooks"), d.get("_forward_hooks")
        if pre:
            for hook in list(pre.values()):
                res = hook(self, args)
                if res is not None:
                    args = res if isinstance(res, tuple) else (res,)
        bw = None
        if d.get("_backward_hooks") or d.get("_backward_pre_hooks"):
            bw = _BackwardHook(self, d.get("_backward_hooks"), d.get("_backward_pre_hooks"))
            args = bw.setup_input_hook(args)
        out = self.forward(*args, **kwargs)
        if post:
            for hook in list(post.values()):
                res = hook(self, args, out)
                if res is not None:
                    out = res
        if bw is not None:
            out = bw.setup_output_hook(out)
        return out

    def to_graph(self, example_inputs, dynamic_dims=None, name: str | None = None):
        """Trace ``forward(*example_inputs)`` into an :class:`opsnn.graph.Graph`; weights become
        initializers named by their ``state_dict`` keys, inputs take ``forward``'s argument
        names, nested tuple/list outputs are flattened (``None`` entries dropped).

        >>> import opsnn, numpy as np
        >>> lin = opsnn.nn.Linear(4, 2)
        >>> g = lin.to_graph([np.ones((3, 4), np.float32)], dynamic_dims={"x": {0: "batch"}})
        >>> sorted(g.initializers)
        ['bias', 'weight']
        """
        from ..graph.tracing import trace
        from ..ops import executor as _ex

        example_inputs = list(example_inputs)
        names = {id(t): n for n, t in self._tensor_state().items()}
        for n, p in self.named_parameters():
            names.setdefault(id(p), n)

        def traced(*args):
            tracer = _ex._tracer
            base = tracer.name_of

            def name_of(t):  # weights are named after their state_dict key the first time they are read
                n = names.get(id(t))
                if n is not None and id(t) not in tracer.names and n not in tracer.initializers:
                    tracer.initializers[n] = np.array(t.numpy())
                    tracer.track(t, n)
                return base(t)

            tracer.name_of = name_of
            return _flatten_outputs(self.forward(*args))

        try:
            params = [
                p
                for p in inspect.signature(self.forward).parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            ]
        except (TypeError, ValueError):
            params = []
        if len(params) >= len(example_inputs):
            traced.__signature__ = inspect.Signature(
                [inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_ONLY) for p in params[: len(example_inputs)]]
            )
        traced.__name__ = name or type(self).__name__
        return trace(traced, example_inputs, dynamic_dims, name=name or type(self).__name__)

    # -- display -----------------------------------------------------------------------------------
    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        head = f"{type(self).__name__}({self.extra_repr()}"
        kids = list(self.named_children())
        if not kids:
            return head + ")"
        lines = [head]
        for n, m in kids:
            sub = repr(m).replace("\n", "\n  ")
            lines.append(f"  ({n}): {sub}")
        return "\n".join(lines) + "\n)"


def _check_cpu(where: str, device) -> None:
    if device is None or isinstance(device, Device):
        return
    name = str(device)
    if name.split(":")[0] != "cpu":
        raise ParamInvalidError(f"{where}: opsnn runs on the CPU, got device {device!r}")


#: torch's legacy tensor type names, for ``Module.type``
_TYPE_NAMES = {
    "FloatTensor": "float32",
    "DoubleTensor": "float64",
    "HalfTensor": "float16",
    "BFloat16Tensor": "bfloat16",
    "LongTensor": "int64",
    "IntTensor": "int32",
    "ShortTensor": "int16",
    "CharTensor": "int8",
    "ByteTensor": "uint8",
    "BoolTensor": "bool",
}


def _dst_dtype(dst_type) -> np.dtype:
    name = dst_type if isinstance(dst_type, str) else None
    if name is None and type(dst_type).__module__ == "torch":  # a torch.dtype: its name after "torch."
        name = str(dst_type)
    if name is not None and name.startswith("torch."):
        name = name[len("torch.") :]
        name = _TYPE_NAMES.get(name, name)
    return _dt.get(dst_type if name is None else name)


class _BackwardHook:
    """One call's full backward hooks, as torch's ``BackwardHook``: the call's tensor inputs and outputs
    that need a gradient pass through one recorded identity node each side, whose backward runs the
    hooks on the gradients of all of them at once."""

    def __init__(self, module: Module, hooks, pre_hooks):
        self.module = module
        self.hooks = list((hooks or {}).values())
        self.pre_hooks = list((pre_hooks or {}).values())
        self.grad_outputs = None
        self.n_inputs = 0
        self.input_index = None

    @staticmethod
    def _wrap(values: tuple, fn):
        """``values`` with its tensors that need a gradient replaced by new handles joined to them by an
        identity node running ``fn(index, grads)``; None when no tensor needs one (nothing recorded)."""
        from ..autograd import is_grad_enabled
        from ..autograd.graph import Node, _attach, _edges
        from ..graph.tracing import TraceError, active_tracer

        index = [i for i, v in enumerate(values) if isinstance(v, Tensor) and v.requires_grad]
        if not index or not is_grad_enabled():
            return None
        tracer = active_tracer()
        if tracer is not None:
            if getattr(tracer, "records_tape", False):
                raise TraceError(
                    "a module backward hook would run only while the training step is traced, never at a "
                    "compiled call; remove it or run the step eagerly"
                )
            return None
        ins = [values[i] for i in index]
        outs = [Tensor(t._array, t.format, t._producer) for t in ins]
        node = Node("BackwardHookFunction", lambda grads: fn(index, grads), _edges(ins), ins, outs)
        _attach(node, outs, len(outs))
        res = list(values)
        for i, o in zip(index, outs):
            res[i] = o
        return tuple(res), index

    @staticmethod
    def _unpack(index: list, values, like: list) -> list:
        # a gradient a hook dropped (None) flows on as zeros: the node must give one to each input
        out = []
        for i, t in zip(index, like):
            g = values[i]
            if g is None:
                g = _zero_like(t)
            elif not isinstance(g, Tensor) or tuple(g.shape) != tuple(t.shape):
                raise ParamInvalidError(
                    f"backward hook: gradient {i} must be an opsnn Tensor of shape {tuple(t.shape)}, got "
                    + (f"shape {tuple(g.shape)}" if isinstance(g, Tensor) else type(g).__name__)
                )
            out.append(g)
        return out

    def setup_input_hook(self, args: tuple) -> tuple:
        self.n_inputs = len(args)
        wrapped = self._wrap(args, self._input_grads)
        if wrapped is None:
            return args
        args, self.input_index = wrapped
        self._inputs = [args[i] for i in self.input_index]
        return args

    def _input_grads(self, index: list, grads: list) -> list:
        if self.grad_outputs is None:  # the gradient reached the inputs without passing the outputs
            return [g if g is not None else _zero_like(t) for g, t in zip(grads, self._inputs)]
        res = [None] * self.n_inputs
        for i, g in zip(index, grads):
            res[i] = g
        res = tuple(res)
        for hook in self.hooks:
            out = hook(self.module, res, self.grad_outputs)
            if out is None:
                continue
            out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
            if len(out) != len(res):
                raise ParamInvalidError(
                    f"backward hook of {type(self.module).__name__}: returned {len(out)} grad_input, expected {len(res)}"
                )
            res = out
        self.grad_outputs = None
        return self._unpack(index, res, self._inputs)

    def setup_output_hook(self, out):
        if not isinstance(out, (Tensor, tuple)):
            import warnings

            warnings.warn(
                f"{type(self.module).__name__}: for backward hooks to be called, the module's output should be a "
                f"Tensor or a tuple of Tensors, got {type(out).__name__}",
                stacklevel=3,
            )
        values = out if isinstance(out, tuple) else (out,)
        self.n_outputs = len(values)
        wrapped = self._wrap(values, self._output_grads)
        if wrapped is None:
            return out
        values, index = wrapped
        self._outputs = [values[i] for i in index]
        return values if isinstance(out, tuple) else values[0]

    def _output_grads(self, index: list, grads: list) -> list:
        go = [None] * self.n_outputs
        for i, g in zip(index, grads):
            go[i] = g
        self.grad_outputs = tuple(go)
        for hook in self.pre_hooks:
            res = hook(self.module, self.grad_outputs)
            if res is None:
                continue
            res = tuple(res) if isinstance(res, (tuple, list)) else (res,)
            if len(res) != len(self.grad_outputs):
                raise ParamInvalidError(
                    f"backward pre-hook of {type(self.module).__name__}: returned {len(res)} grad_output, "
                    f"expected {len(self.grad_outputs)}"
                )
            self.grad_outputs = res
        local = self.grad_outputs
        if self.input_index is None:  # no input needs a gradient: the full hooks run here, with None inputs
            none = (None,) * self.n_inputs
            if self.hooks:
                import warnings

                warnings.warn(
                    f"{type(self.module).__name__}: full backward hook is firing when gradients are computed with "
                    "respect to module outputs since no inputs require gradients (as torch's)",
                    stacklevel=2,
                )
            for hook in self.hooks:
                res = hook(self.module, none, self.grad_outputs)
                if res is not None and not (isinstance(res, tuple) and all(r is None for r in res)):
                    raise ParamInvalidError(
                        f"backward hook of {type(self.module).__name__}: no input requires grad, so the hook must "
                        "return None (or all-None)"
                    )
            self.grad_outputs = None
        return self._unpack(index, local, self._outputs)


def _zero_like(t: Tensor) -> Tensor:
    z = empty(tuple(t.shape), t.dtype)
    z.numpy().fill(0)
    return z


def _castable(src: np.dtype, dst: np.dtype) -> bool:
    if src == dst:
        return True
    if _dt.is_float(dst):
        return _dt.is_float(src) or src.kind in "iu"
    return np.can_cast(src, dst, "same_kind")


def _flatten_outputs(out):
    if isinstance(out, dict):
        return {k: v for k, v in out.items() if v is not None}
    if isinstance(out, (tuple, list)):
        flat = []
        for o in out:
            f = _flatten_outputs(o)
            if isinstance(f, list):
                flat.extend(f)
            elif f is not None:
                flat.append(f)
        return flat
    return out


class Sequential(Module):
    """Modules applied in order; children are named ``0``, ``1``, ... (or by an OrderedDict)."""

    def __init__(self, *modules):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], (dict, OrderedDict)):
            for n, m in modules[0].items():
                self.register_module(n, m)
        else:
            for i, m in enumerate(modules):
                self.register_module(str(i), m)

    def __len__(self) -> int:
        return len(self._modules)

    def __getitem__(self, i):
        mods = list(self._modules.values())
        if isinstance(i, slice):
            return Sequential(*mods[i])
        return mods[i]

    def __iter__(self):
        return iter(self._modules.values())

    def append(self, module: Module) -> Sequential:
        self.register_module(str(len(self._modules)), module)
        return self

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x


class ModuleList(Module):
    """A list of submodules named ``0``, ``1``, ... (no forward of its own)."""

    def __init__(self, modules=()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, module: Module) -> ModuleList:
        self.register_module(str(len(self._modules)), module)
        return self

    def __len__(self) -> int:
        return len(self._modules)

    def __getitem__(self, i):
        mods = list(self._modules.values())
        return ModuleList(mods[i]) if isinstance(i, slice) else mods[i]

    def __iter__(self):
        return iter(self._modules.values())


class ModuleDict(Module):
    """Submodules by name (no forward of its own)."""

    def __init__(self, modules=None):
        super().__init__()
        for n, m in (modules or {}).items():
            self.register_module(n, m)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.register_module(key, module)

    def __contains__(self, key: str) -> bool:
        return key in self._modules

    def __len__(self) -> int:
        return len(self._modules)

    def keys(self):
        return self._modules.keys()

    def items(self):
        return self._modules.items()

    def values(self):
        return self._modules.values()


class ParameterList(Module):
    """A list of parameters named ``0``, ``1``, ... (arrays and tensors become Parameters)."""

    def __init__(self, values=()):
        super().__init__()
        for v in values:
            self.append(v)

    def append(self, value) -> ParameterList:
        self.register_parameter(str(len(self._parameters)), value)
        return self

    def extend(self, values) -> ParameterList:
        for v in values:
            self.append(v)
        return self

    def __len__(self) -> int:
        return len(self._parameters)

    def __getitem__(self, i):
        return list(self._parameters.values())[i]

    def __setitem__(self, i: int, value) -> None:
        n = len(self._parameters)
        if not -n <= i < n:
            raise ParamInvalidError(f"ParameterList: index {i} out of range for {n} parameters")
        self.register_parameter(str(i % n), value)

    def __iter__(self):
        return iter(self._parameters.values())


class ParameterDict(Module):
    """Parameters by name (arrays and tensors become Parameters). As torch's, a plain dict is taken in
    sorted key order (an OrderedDict or ParameterDict in its own order)."""

    def __init__(self, parameters=None):
        super().__init__()
        parameters = parameters or {}
        items = (
            parameters.items() if isinstance(parameters, (OrderedDict, ParameterDict)) else sorted(parameters.items())
        )
        for k, v in items:
            self.register_parameter(k, v)

    def __getitem__(self, key: str) -> Parameter:
        return self._parameters[key]

    def __setitem__(self, key: str, value) -> None:
        self.register_parameter(key, value)

    def __contains__(self, key: str) -> bool:
        return key in self._parameters

    def __len__(self) -> int:
        return len(self._parameters)

    def __iter__(self):
        return iter(self._parameters)

    def keys(self):
        return self._parameters.keys()

    def items(self):
        return self._parameters.items()

    def values(self):
        return self._parameters.values()


def new_parameter(shape, dtype="float32") -> Parameter:
    """An uninitialised parameter of ``shape`` (initializers in ``opsnn.nn.init`` fill it)."""
    return Parameter.wrap(empty(tuple(shape), dtype))
