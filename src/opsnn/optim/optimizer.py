"""``Optimizer``: torch's parameter groups, per-parameter state, ``zero_grad`` and state dicts.

Subclasses implement ``step`` as one fused multi-tensor kernel (``opsnn.kernels.cpu.optimizer``)
over all parameters that have a gradient, one launch per parameter dtype.
"""

from __future__ import annotations

import copy
import functools
from collections import OrderedDict

import numpy as np

from .. import dtypes as _dt
from ..autograd import no_grad
from ..autograd.graph import RemovableHandle
from ..errors import DTypeError, ParamInvalidError, real_number
from ..kernels.cpu import optimizer as K
from ..runtime.stream import current_stream
from ..tensor import Tensor, tensor, zeros


class OptimizerStateError(ParamInvalidError):
    """``load_state_dict`` got a state dict that does not fit this optimizer (groups, parameter
    counts, state shapes or keys); nothing is written when it is raised."""


class Optimizer:
    """Base class: ``params`` is an iterable of tensors or of dicts (parameter groups, each with
    ``"params"`` and any per-group option overriding ``defaults``)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "step" in cls.__dict__:  # an inherited step is already wrapped
            cls.step = _with_step_hooks(cls.step)

    def __init__(self, params, defaults: dict):
        self._optimizer_step_pre_hooks: OrderedDict = OrderedDict()
        self._optimizer_step_post_hooks: OrderedDict = OrderedDict()
        self.defaults = dict(defaults)
        self.state: dict = {}
        self.param_groups: list[dict] = []
        if isinstance(params, Tensor):
            raise ParamInvalidError(
                f"{type(self).__name__}: params must be an iterable of tensors or dicts, got a single Tensor"
            )
        groups = list(params)
        if not groups:
            raise ParamInvalidError(f"{type(self).__name__}: got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for g in groups:
            self.add_param_group(g)

    def add_param_group(self, group: dict) -> None:
        name = type(self).__name__
        if not isinstance(group, dict) or "params" not in group:
            raise ParamInvalidError(f"{name}: a parameter group must be a dict with a 'params' entry, got {group!r}")
        group = dict(group)
        ps = group["params"]
        group["params"] = [ps] if isinstance(ps, Tensor) else list(ps)
        unknown = set(group) - set(self.defaults) - {"params"}
        if unknown:
            raise ParamInvalidError(
                f"{name}: unknown option(s) {sorted(unknown)} in a parameter group; options: {sorted(self.defaults)}"
            )
        for k, v in self.defaults.items():
            group.setdefault(k, v)
        self._check_options(group)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        for i, p in enumerate(group["params"]):
            if not isinstance(p, Tensor):
                raise ParamInvalidError(f"{name}: parameter {i} of a group is a {type(p).__name__}, not a Tensor")
            if not _dt.is_float(p.dtype):
                raise DTypeError(
                    f"{name}: parameter {i} has dtype {_dt.name(p.dtype)}; only floating tensors can be optimized"
                )
            if getattr(p, "uninitialized", False):
                raise ParamInvalidError(
                    f"{name}: parameter {i} belongs to a lazy module (LazyLinear, LazyConv2d ...) that has not run "
                    "yet; call the model on an input once, then build the optimizer"
                )
            if not p.requires_grad:
                raise ParamInvalidError(
                    f"{name}: parameter {i} (shape {tuple(p.shape)}) does not require grad; "
                    "optimize only tensors with requires_grad=True"
                )
            if not p.is_leaf:
                raise ParamInvalidError(
                    f"{name}: parameter {i} (shape {tuple(p.shape)}) is not a leaf tensor (it "
                    "was computed from others); optimize leaves such as Parameters"
                )
            if not p.is_contiguous():
                raise ParamInvalidError(f"{name}: parameter {i} (shape {tuple(p.shape)}) is not contiguous")
            if id(p) in seen:
                raise ParamInvalidError(
                    f"{name}: parameter {i} (shape {tuple(p.shape)}) appears in more than one group"
                )
            seen.add(id(p))
        self.param_groups.append(group)

    def _check_options(self, group: dict) -> None:
        """Subclasses validate their options (learning rate, betas ...) here."""

    def _check_betas(self, group: dict) -> None:
        """``group["betas"]`` as two floats in [0, 1), or a ParamInvalidError."""
        name = type(self).__name__
        b = tuple(group["betas"]) if isinstance(group["betas"], (tuple, list)) else ()
        if len(b) != 2 or not all(0.0 <= real_number(name, "betas", v) < 1.0 for v in b):
            raise ParamInvalidError(f"{name}: betas must be two numbers in [0, 1), got {group['betas']}")
        group["betas"] = (float(b[0]), float(b[1]))

    def _refuse(self, **options) -> None:
        """torch options opsnn does not implement (``foreach``, ``capturable``, ``differentiable``,
        ``fused``): None or False pass (every step is one fused kernel, with torch's numbers), anything
        else is a ParamInvalidError rather than an option silently ignored."""
        for k, v in options.items():
            if v is not None and v is not False:
                raise ParamInvalidError(
                    f"{type(self).__name__}: {k}={v!r} is not supported (each step is one fused multi-tensor "
                    "kernel); leave it at None or False"
                )

    def _check_nonnegative(self, group: dict, keys) -> None:
        """Options ``keys`` of ``group`` as floats >= 0, or a ParamInvalidError naming the option."""
        name = type(self).__name__
        for k in keys:
            group[k] = real_number(name, k, group[k])
            if not group[k] >= 0.0:
                raise ParamInvalidError(f"{name}: {k} must be >= 0, got {group[k]}")

    def register_step_pre_hook(self, hook) -> RemovableHandle:
        """``hook(optimizer, args, kwargs)`` runs before every ``step`` (``args`` starts with the
        optimizer, as torch's); a result other than None must be ``(new_args, new_kwargs)`` and
        replaces them. ``handle.remove()`` unregisters it. Hooks are Python, so a step traced by
        ``opsnn.compile`` with a hook registered is a TraceError (they would run only while tracing).

        >>> import opsnn, numpy as np
        >>> p = opsnn.nn.Parameter(np.zeros(2, np.float32))
        >>> opt = opsnn.optim.SGD([p], lr=0.1)
        >>> h = opt.register_step_pre_hook(lambda o, args, kwargs: print("stepping", type(o).__name__))
        >>> opt.step()
        stepping SGD
        >>> h.remove()
        """
        return self._add_step_hook(self._optimizer_step_pre_hooks, hook)

    def register_step_post_hook(self, hook) -> RemovableHandle:
        """``hook(optimizer, args, kwargs)`` runs after every ``step``; its result is ignored.
        ``handle.remove()`` unregisters it."""
        return self._add_step_hook(self._optimizer_step_post_hooks, hook)

    def _add_step_hook(self, hooks: OrderedDict, hook) -> RemovableHandle:
        if not callable(hook):
            raise ParamInvalidError(f"{type(self).__name__}: a step hook must be callable, got {type(hook).__name__}")
        key = next(_HOOK_KEYS)
        hooks[key] = hook
        return RemovableHandle(hooks, key)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for g in self.param_groups:
            for p in g["params"]:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad = zeros(p.shape, p.dtype)

    # -- running a step ---------------------------------------------------------------------------------
    def _with_grads(self):
        """(group, param, flat param array, flat grad array) for every parameter with a gradient,
        after the stream has finished the kernels that produce them."""
        current_stream().synchronize()
        out = []
        for g in self.param_groups:
            for p in g["params"]:
                gr = p.grad
                if gr is None:
                    continue
                ga = gr.numpy()
                if ga.dtype != p.dtype:
                    raise DTypeError(
                        f"{type(self).__name__}: gradient of a parameter of shape {tuple(p.shape)} has "
                        f"dtype {_dt.name(ga.dtype)}, the parameter {_dt.name(p.dtype)}"
                    )
                out.append((g, p, p.numpy().reshape(-1), np.ascontiguousarray(ga).reshape(-1)))
        return out

    def _with_grads_by_dtype(self) -> list:
        """:meth:`_with_grads` grouped by parameter dtype: one fused kernel launch per group."""
        by_dtype: dict = {}
        for item in self._with_grads():
            by_dtype.setdefault(item[2].dtype, []).append(item)
        return list(by_dtype.values())

    @staticmethod
    def _launch(op: str, fn, args: tuple) -> None:
        """Run the fused update ``fn(*args)`` as a task of the current stream, named as a compiled
        step's node (``op``), so that the profiler, the timeline and other observers see it, then
        wait for it: the parameters change in place, so no tensor's producer would."""
        stream = current_stream()
        stream.launch(fn, op, {"kernel": f"{op.lower()}_numba"}, args)
        stream.synchronize()

    def _advance(self, p: Tensor) -> tuple[dict, float]:
        """``p``'s state and its ``step`` count, advanced by one (torch counts per parameter)."""
        st = self.state.setdefault(p, {})
        st["step"] = step = float(st.get("step", 0.0)) + 1.0
        return st, step

    def _state_buffer(self, p: Tensor, key: str) -> np.ndarray:
        st = self.state.setdefault(p, {})
        t = st.get(key)
        if t is None:
            t = st[key] = zeros(p.shape, p.dtype)
        return t.numpy().reshape(-1)

    def _state_tensor(self, p: Tensor, key: str) -> Tensor:
        """State ``key`` of ``p`` as a Tensor, created (zeros) when missing."""
        st = self.state.setdefault(p, {})
        t = st.get(key)
        if t is None:
            t = st[key] = zeros(p.shape, p.dtype)
        return t

    def step(self, closure=None):
        raise NotImplementedError

    # -- inside a traced training step --------------------------------------------------------------------
    def _traced_items(self, tracer, closure, key) -> dict:
        """The parameters with a gradient, grouped by ``key(group, param)``, for a step recorded into a
        graph (one Apply node per group); refuses what a graph cannot replay."""
        from ..graph.tracing import TraceError

        name = type(self).__name__
        if not hasattr(tracer, "call_inplace"):
            raise TraceError(
                f"{name}.step: opsnn.compile(fn, example_inputs) traces inference; compile a training step "
                "as opsnn.compile(train_step), which traces it on its first call"
            )
        if closure is not None:
            raise TraceError(f"{name}.step: a closure cannot be traced into a compiled step; call it before step()")
        groups: dict = {}
        for g in self.param_groups:
            for p in g["params"]:
                gr = p.grad
                if gr is None:
                    continue
                if gr.dtype != p.dtype:
                    raise DTypeError(
                        f"{name}: gradient of a parameter of shape {tuple(p.shape)} has dtype "
                        f"{_dt.name(gr.dtype)}, the parameter {_dt.name(p.dtype)}"
                    )
                groups.setdefault((p.dtype.str, key(g, p)), []).append((g, p))
        return groups

    def _traced_apply(self, tracer, op: str, host, items, state_keys, attrs) -> None:
        """Record one in-place ``op`` node over ``items``: ``host()`` -> (hyper, flags) arrays, called
        now and before every compiled call (learning rate, step counts are runtime inputs)."""
        from ..ops.registry import get_op

        hyper, flags = host()
        last = {}

        def hyper_fn():
            last["flags"] = (out := host())[1]
            return out[0]

        h = tensor(hyper)
        f = tensor(flags)
        label = f"{type(self).__name__.lower()}.{len(tracer.host_inputs) // 2}"
        tracer.add_input(h, f"{label}.hyper", hyper_fn)
        tracer.add_input(f, f"{label}.flags", lambda: last.pop("flags"))
        params = [p for _g, p in items]
        grads = []
        for _g, p in items:
            gr = p.grad
            # a gradient that depends on no input (bias of loss = model(x).sum()) is still the step's own
            if not tracer.is_traced(gr) and tracer.made_by.get(tracer.names.get(id(gr))) is None:
                from ..graph.tracing import TraceError

                raise TraceError(
                    f"{type(self).__name__}.step: the gradient of parameter {tracer.label(p)!r} was not "
                    "computed inside the traced step (call backward inside it)"
                )
            grads.append(gr)
        states, labels, getters = [], [], []
        for key in state_keys:
            for _g, p in items:
                states.append(self._state_tensor(p, key))
                labels.append(f"{tracer.label(p)}.{key}")
                getters.append(lambda p=p, key=key: self._state_tensor(p, key))
        n = len(params)
        tracer.call_inplace(
            get_op(op, "opsnn"),
            [h, f] + params + grads + states,
            attrs,
            params + states,
            labels=[None] * n + labels,
            getters=[None] * n + getters,
        )

    def _fused_step(self, closure, op: str, kernel, slots, uses, rows, attrs):
        """A step as one fused ``op`` over all parameters with a gradient: eager, ``kernel(params, grads,
        *state lists, chunks, hyper, flags)`` once per dtype; traced, one ``op`` node per dtype and
        ``uses``. ``slots`` are the state names the kernel takes, ``uses(group, param)`` which of them a
        parameter keeps (a tuple of bools; the first slot is always kept and stands in for the others),
        ``rows([(group, param)])`` the (hyper, flags) tables (it advances step counts), ``attrs(uses)``
        the node's attributes."""
        from ..graph.tracing import active_tracer

        tracer = active_tracer()
        if tracer is not None:
            groups = self._traced_items(tracer, closure, uses)
            for (_dt, used), items in groups.items():
                keys = [s for s, u in zip(slots, used) if u]
                self._traced_apply(tracer, op, lambda items=items: rows(items), items, keys, attrs(used))
            return None
        loss = self._closure(closure)
        for items in self._with_grads_by_dtype():
            hyper, flags = rows([(g, p) for g, p, _pa, _ga in items])
            states = [[] for _ in slots]
            for g, p, _pa, _ga in items:
                first = self._state_buffer(p, slots[0])
                for lst, slot, used in zip(states, slots, uses(g, p)):
                    lst.append(self._state_buffer(p, slot) if used else first)
            chunks = K.chunk_table([i[2].size for i in items])
            args = (K.typed_list([i[2] for i in items]), K.typed_list([i[3] for i in items]))
            self._launch(op, kernel, args + tuple(K.typed_list(s) for s in states) + (chunks, hyper, flags))
        return loss

    def _fused_fixed_step(self, closure, op: str, kernel, slots, rows):
        """:meth:`_fused_step` for an op whose parameters all keep every state in ``slots``."""
        used = (True,) * len(slots)
        return self._fused_step(closure, op, kernel, slots, lambda g, p: used, rows, lambda used: {})

    def _closure(self, closure):
        if closure is None:
            return None
        from ..autograd import enable_grad

        with enable_grad():
            return closure()

    # -- state dicts -------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """``{"state": {index: {name: value}}, "param_groups": [{options, "params": [index]}]}``
        (parameters by their position across the groups, as in torch; tensors are copies)."""
        index, groups, k = {}, [], 0
        for g in self.param_groups:
            ids = []
            for p in g["params"]:
                index[id(p)] = k
                ids.append(k)
                k += 1
            groups.append({**{n: copy.deepcopy(v) for n, v in g.items() if n != "params"}, "params": ids})
        state = {}
        for p, st in self.state.items():
            state[index[id(p)]] = {n: tensor(v) if isinstance(v, Tensor) else v for n, v in st.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a ``state_dict()`` of an optimizer of the same kind over parameters of the same
        shapes and grouping; anything else raises :class:`OptimizerStateError` and changes nothing."""
        name = type(self).__name__
        if not isinstance(state_dict, dict) or set(state_dict) != {"state", "param_groups"}:
            raise OptimizerStateError(
                f"{name}.load_state_dict: expected a dict with 'state' and 'param_groups', got "
                f"{sorted(state_dict) if isinstance(state_dict, dict) else type(state_dict)}"
            )
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise OptimizerStateError(
                f"{name}.load_state_dict: the state dict has {len(groups)} parameter groups, "
                f"this optimizer {len(self.param_groups)}"
            )
        params = []
        for i, (mine, theirs) in enumerate(zip(self.param_groups, groups)):
            if len(mine["params"]) != len(theirs.get("params", ())):
                raise OptimizerStateError(
                    f"{name}.load_state_dict: group {i} has {len(theirs.get('params', ()))} "
                    f"parameters in the state dict, {len(mine['params'])} here"
                )
            missing = set(self.defaults) - set(theirs)
            if missing:
                raise OptimizerStateError(
                    f"{name}.load_state_dict: group {i} lacks option(s) {sorted(missing)} "
                    f"(a state dict of another optimizer?)"
                )
            params += list(zip(theirs["params"], mine["params"]))
        by_index = dict(params)
        new_state = {}
        for k, st in state_dict["state"].items():
            if k not in by_index:
                raise OptimizerStateError(f"{name}.load_state_dict: state for parameter {k}, which no group lists")
            p = by_index[k]
            entry = {}
            for n, v in st.items():
                if n not in self._state_keys:
                    raise OptimizerStateError(
                        f"{name}.load_state_dict: parameter {k} has state {n!r}; {name} keeps "
                        f"{sorted(self._state_keys)}"
                    )
                arr = v.numpy() if isinstance(v, Tensor) else np.asarray(v)
                if n in self._scalar_state_keys:
                    if arr.size != 1:
                        raise OptimizerStateError(
                            f"{name}.load_state_dict: state {n!r} of parameter {k} must be one number, got "
                            f"shape {tuple(arr.shape)}"
                        )
                    entry[n] = float(arr.reshape(()))
                    continue
                if tuple(arr.shape) != tuple(p.shape):
                    raise OptimizerStateError(
                        f"{name}.load_state_dict: state {n!r} of parameter {k} has shape "
                        f"{tuple(arr.shape)}, the parameter {tuple(p.shape)}"
                    )
                entry[n] = tensor(arr.astype(p.dtype))
            new_state[p] = entry
        for mine, theirs in zip(self.param_groups, groups):
            for n in self.defaults:
                mine[n] = copy.deepcopy(theirs[n])
        self.state = new_state

    _state_keys: frozenset = frozenset()
    #: states kept as one Python float per parameter (torch's 0-d tensors)
    _scalar_state_keys: frozenset = frozenset({"step"})

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, g in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines += [f"    {k}: {v}" for k, v in sorted(g.items()) if k != "params"]
        return "\n".join(lines + [")"])


_HOOK_KEYS = iter(range(1 << 62))


def _with_step_hooks(step):
    """``step`` with the optimizer's step pre- and post-hooks around it, as torch's ``profile_hook_step``;
    a ``step`` that calls its parent's through ``super()`` runs the hooks once."""

    @functools.wraps(step)
    def wrapper(*args, **kwargs):
        self = args[0]
        if getattr(self, "_in_step_hooks", False):
            return step(*args, **kwargs)
        if getattr(self, "_optimizer_step_pre_hooks", None) or getattr(self, "_optimizer_step_post_hooks", None):
            from ..graph.tracing import TraceError, active_tracer

            if active_tracer() is not None:
                raise TraceError(
                    f"{type(self).__name__}.step: step hooks would run only while the step is traced, never at a "
                    "compiled call; remove them before opsnn.compile, or run the step eagerly"
                )
        for hook in list(getattr(self, "_optimizer_step_pre_hooks", {}).values()):
            result = hook(self, args, kwargs)
            if result is not None:
                if not (isinstance(result, tuple) and len(result) == 2):
                    raise ParamInvalidError(
                        f"{type(self).__name__}.step: a step pre-hook must return None or (new_args, new_kwargs), "
                        f"got {type(result).__name__}"
                    )
                args, kwargs = result
        self._in_step_hooks = True
        try:
            out = step(*args, **kwargs)
        finally:
            self._in_step_hooks = False
        for hook in list(getattr(self, "_optimizer_step_post_hooks", {}).values()):
            hook(self, args, kwargs)
        return out

    return wrapper


__all__ = ["Optimizer", "OptimizerStateError", "no_grad"]
