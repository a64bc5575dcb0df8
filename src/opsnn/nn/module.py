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
from ..errors import ARGUMENT_ERRORS, DTypeError, OpsnnError, ParamInvalidError, bad_arguments_message
from ..runtime.device import Device
from ..tensor import Tensor, empty, tensor

#: keys of the forward hooks (one sequence: a handle removes only its own)
_HOOK_KEYS = itertools.count()


class StateDictError(ParamInvalidError):
    """``load_state_dict`` found missing, unexpected or mis-shaped tensors. The lists are kept
    as attributes: ``missing`` and ``unexpected`` (names), ``mismatched`` ((name, expected, got))."""

    def __init__(self, where: str, missing=(), unexpected=(), mismatched=()):
        self.missing, self.unexpected, self.mismatched = list(missing), list(unexpected), list(mismatched)
        parts = []
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
            self._forget(name)
            params[name] = value
        elif isinstance(value, Module):
            self._forget(name)
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

    def _forget(self, name: str) -> None:
        for reg in ("_parameters", "_buffers", "_modules"):
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
    def state_dict(self, prefix: str = "") -> OrderedDict[str, Tensor]:
        """Every parameter and persistent buffer by dotted name (the live tensors, not copies)."""
        out = OrderedDict()
        for mname, mod in self.named_modules(prefix, remove_duplicate=False):
            for n, t in mod._parameters.items():
                if t is not None:
                    out[f"{mname}.{n}" if mname else n] = t
            for n, t in mod._buffers.items():
                if t is not None and n not in mod._non_persistent:
                    out[f"{mname}.{n}" if mname else n] = t
        return out

    def _optional_names(self) -> set:
        names = set()
        for mname, mod in self.named_modules(remove_duplicate=False):
            for n in mod._optional_buffers:
                names.add(f"{mname}.{n}" if mname else n)
        return names

    def load_state_dict(self, state_dict, strict: bool = True) -> IncompatibleKeys:
        """Copy tensors (opsnn Tensors, numpy arrays, array-likes) into this module's
        parameters and buffers by name. Shapes must match exactly; floating values are cast
        to the parameter's dtype. Raises :class:`StateDictError` listing every missing,
        unexpected and mis-shaped tensor (missing/unexpected only when ``strict``); nothing
        is written when it raises.

        >>> import opsnn, numpy as np
        >>> lin = opsnn.nn.Linear(2, 3)
        >>> lin.load_state_dict({"weight": np.ones((3, 2)), "bias": np.zeros(3)})
        IncompatibleKeys(missing_keys=[], unexpected_keys=[])
        """
        if not hasattr(state_dict, "items"):
            raise ParamInvalidError(
                f"load_state_dict: expected a mapping of name -> tensor, got {type(state_dict).__name__}"
            )
        own = self.state_dict()
        optional = self._optional_names()
        missing = [k for k in own if k not in state_dict and k not in optional]
        unexpected = [k for k in state_dict if k not in own]
        mismatched, arrays = [], {}
        for k, v in state_dict.items():
            if k not in own:
                continue
            arr = _as_array(v, k)
            dst = own[k]
            if tuple(arr.shape) != tuple(dst.shape):
                mismatched.append((k, tuple(dst.shape), tuple(arr.shape)))
                continue
            if not _castable(arr.dtype, dst.dtype):
                mismatched.append(
                    (k, f"{tuple(dst.shape)} {_dt.name(dst.dtype)}", f"{tuple(arr.shape)} {_dt.name(arr.dtype)}")
                )
                continue
            arrays[k] = arr
        if mismatched or (strict and (missing or unexpected)):
            raise StateDictError(
                type(self).__name__, missing if strict else (), unexpected if strict else (), mismatched
            )
        for k, arr in arrays.items():
            own[k].copy_(arr)
        self._weights_loaded()
        return IncompatibleKeys(missing, unexpected)

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

        sd = source if hasattr(source, "items") else read_weights(source, names=self.state_dict())
        return self.load_state_dict(sd, strict=strict)

    def save_weights(self, path) -> str:
        """Write ``state_dict()`` to ``path`` (``.safetensors`` or ``.npz``)."""
        from .weights import write_weights

        return write_weights(self.state_dict(), path)

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

    def register_forward_pre_hook(self, hook) -> RemovableHandle:
        """``hook(module, args)`` runs before ``forward``; a result other than None replaces the
        positional arguments (a tuple, or one value). ``handle.remove()`` unregisters it."""
        return self._add_hook("_forward_pre_hooks", hook)

    def register_forward_hook(self, hook) -> RemovableHandle:
        """``hook(module, args, output)`` runs after ``forward``; a result other than None replaces
        the output. ``handle.remove()`` unregisters it."""
        return self._add_hook("_forward_hooks", hook)

    def _add_hook(self, table: str, hook) -> RemovableHandle:
        if not callable(hook):
            raise ParamInvalidError(
                f"{table.strip('_').replace('_', ' ')}: expected a callable, got {type(hook).__name__}"
            )
        hooks = self.__dict__.setdefault(table, OrderedDict())
        key = next(_HOOK_KEYS)
        hooks[key] = hook
        return RemovableHandle(hooks, key)

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
        out = self.forward(*args, **kwargs)
        if post:
            for hook in list(post.values()):
                res = hook(self, args, out)
                if res is not None:
                    out = res
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
        names = {id(t): n for n, t in self.state_dict().items()}
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
