"""The graph IR: ``Graph`` (values, nodes in topological order, initializers) and its checks.

This is opsnn's one graph representation: the ONNX importer produces it, the
interpreter runs it, and graph passes rewrite it. Node op types are op-record names
(ONNX op types), attributes are plain Python values (str, int, float, lists, numpy
arrays for tensors, :class:`Graph` for subgraphs)::

    >>> import numpy as np
    >>> from opsnn.graph import Graph, Node, Value
    >>> g = Graph("tiny", inputs=[Value("x", np.float32, (2, "n"))], outputs=[Value("y")],
    ...           nodes=[Node("Relu", ["x"], ["y"])])
    >>> g.validate()
    >>> [n.op_type for n in g.nodes]
    ['Relu']
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ParamInvalidError

#: value kinds a :class:`Value` may have
KINDS = ("tensor", "sequence", "optional", "map", "unknown")


class GraphError(ParamInvalidError):
    """A graph is malformed (the message names the graph and the offending node/value)."""


class GraphCycleError(GraphError):
    """The nodes' data dependencies form a cycle."""


class DanglingValueError(GraphError):
    """A node reads (or the graph returns) a value that nothing defines."""


class DuplicateValueError(GraphError):
    """A value is defined twice (two producers, or a producer shadowing an input)."""


@dataclass
class Value:
    """A named value's type: ``kind`` tensor/sequence/optional/map, ``dtype`` (numpy, or None
    when unknown), ``shape`` (a tuple of ints, symbolic str dims or None for unknown dims;
    None for unknown rank). Sequences and optionals describe their element with ``elem``."""

    name: str
    dtype: Any = None
    shape: tuple | None = None
    kind: str = "tensor"
    elem: Value | None = None

    def __post_init__(self):
        if self.dtype is not None and not isinstance(self.dtype, np.dtype):
            self.dtype = np.dtype(self.dtype)
        if self.shape is not None:
            self.shape = tuple(self.shape)
        if self.kind not in KINDS:
            raise GraphError(f"Value {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    def is_static(self) -> bool:
        """True when every dim is a known int."""
        return self.shape is not None and all(isinstance(d, (int, np.integer)) for d in self.shape)

    def __repr__(self) -> str:
        if self.kind != "tensor":
            inner = f"{self.elem!r}" if self.elem is not None else "?"
            return f"Value({self.name!r}, {self.kind}<{inner}>)"
        dt = "?" if self.dtype is None else str(self.dtype)
        shape = "?" if self.shape is None else "x".join("?" if d is None else str(d) for d in self.shape)
        return f"Value({self.name!r}, {dt}[{shape}])"


_node_ids = itertools.count()


@dataclass(eq=False)
class Node:
    """One op application. ``inputs``/``outputs`` are value names ('' marks an absent
    optional input or an unused output); ``attrs`` holds Python values."""

    op_type: str
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    attrs: dict = field(default_factory=dict)
    domain: str = ""
    name: str = ""

    def __post_init__(self):
        self.inputs = list(self.inputs)
        self.outputs = list(self.outputs)
        self.attrs = dict(self.attrs)
        if self.domain == "ai.onnx":
            self.domain = ""
        if not self.name:
            self.name = f"{self.op_type}_{next(_node_ids)}"

    @property
    def qualified_type(self) -> str:
        return f"{self.domain}::{self.op_type}" if self.domain else self.op_type

    def subgraphs(self) -> Iterator[tuple[str, Graph]]:
        """``(attribute name, graph)`` for every graph-valued attribute."""
        for key, val in self.attrs.items():
            if isinstance(val, Graph):
                yield key, val
            elif isinstance(val, (list, tuple)) and val and isinstance(val[0], Graph):  # GRAPHS: all graphs
                for g in val:
                    yield key, g

    def present_inputs(self) -> list[str]:
        return [i for i in self.inputs if i]

    def __repr__(self) -> str:
        attrs = ", ".join(f"{k}={_short(v)}" for k, v in self.attrs.items())
        return (
            f"Node({self.name!r}: {self.qualified_type}({', '.join(self.inputs)}) -> "
            f"({', '.join(self.outputs)}){' {' + attrs + '}' if attrs else ''})"
        )


def _short(v) -> str:
    if isinstance(v, np.ndarray):
        return f"tensor{list(v.shape)}:{v.dtype}"
    if isinstance(v, Graph):
        return f"<graph {v.name}>"
    s = repr(v)
    return s if len(s) < 40 else s[:37] + "..."


class Graph:
    """A dataflow graph: named inputs and outputs, nodes in topological order, constant
    initializers (``{name: numpy array}``) and the opset versions its node forms follow
    (``{domain: version}``). A subgraph (If/Loop/Scan body) may read values of the graphs
    enclosing it."""

    def __init__(
        self,
        name: str = "graph",
        *,
        inputs=(),
        outputs=(),
        nodes=(),
        initializers=None,
        opset_imports=None,
        value_info=None,
        doc: str = "",
        metadata=None,
    ):
        self.name = name
        self.inputs: list[Value] = [v if isinstance(v, Value) else Value(v) for v in inputs]
        self.outputs: list[Value] = [v if isinstance(v, Value) else Value(v) for v in outputs]
        self.nodes: list[Node] = list(nodes)
        self.initializers: dict[str, np.ndarray] = dict(initializers or {})
        self.opset_imports: dict[str, int] = dict(opset_imports or {})
        self.value_info: dict[str, Value] = dict(value_info or {})
        self.doc = doc
        #: free-form facts about where the graph came from (producer, source opsets, ...)
        self.metadata: dict = dict(metadata or {})
        self._reserving = False  # inside reserving_names()
        self._reserved: set | None = None  # its names in use (collected on the first unique_name)

    # -- queries ---------------------------------------------------------------------------
    @property
    def input_names(self) -> list[str]:
        return [v.name for v in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [v.name for v in self.outputs]

    def producers(self) -> dict[str, Node]:
        """``{value name: node that writes it}``."""
        return {o: n for n in self.nodes for o in n.outputs if o}

    def consumers(self) -> dict[str, list[Node]]:
        """``{value name: nodes that read it}`` (including reads from inside subgraphs)."""
        users: dict[str, list[Node]] = {}
        for n in self.nodes:
            for name in set(n.present_inputs()) | free_names(n):
                users.setdefault(name, []).append(n)
        return users

    def value(self, name: str) -> Value:
        """The declared type of ``name`` (input, output, value_info or initializer)."""
        for v in itertools.chain(self.inputs, self.outputs):
            if v.name == name:
                return v
        if name in self.value_info:
            return self.value_info[name]
        if name in self.initializers:
            a = self.initializers[name]
            return Value(name, a.dtype, a.shape)
        return Value(name)

    def walk(self) -> Iterator[tuple[Graph, Node]]:
        """Every ``(graph, node)`` pair, subgraphs included (depth first)."""
        for n in self.nodes:
            yield self, n
            for _, sub in n.subgraphs():
                yield from sub.walk()

    def op_types(self) -> set[str]:
        return {n.qualified_type for _, n in self.walk()}

    def unique_name(self, hint: str) -> str:
        """A value name not used anywhere in this graph (or its subgraphs)."""
        reserved = None
        if getattr(self, "_reserving", False):
            if self._reserved is None:
                self._reserved = self._names()
            reserved = self._reserved
        taken = self._names() if reserved is None else reserved
        cand = hint
        for i in itertools.count(1):
            if cand not in taken and cand not in self.initializers:
                break
            cand = f"{hint}_{i}"
        if reserved is not None:
            reserved.add(cand)
        return cand

    @contextlib.contextmanager
    def reserving_names(self):
        """Within the block, :meth:`unique_name` checks one set of the graph's names collected on
        entry (plus every name it hands out and those given to :meth:`reserve_names`) instead of
        scanning the graph on each call: a pass that names K new values in a graph of N nodes costs
        O(N + K), not O(N * K). Names the block adds by other means must be passed to
        :meth:`reserve_names`."""
        if getattr(self, "_reserving", False):  # nested: the outer block's set stays in use
            yield self
            return
        self._reserving, self._reserved = True, None
        try:
            yield self
        finally:
            self._reserving, self._reserved = False, None

    def reserve_names(self, nodes) -> None:
        """Inside :meth:`reserving_names`: record the names ``nodes`` use (no-op outside it)."""
        reserved = getattr(self, "_reserved", None)
        if reserved is None:  # outside the block, or no set collected yet (it will see the nodes)
            return
        for n in nodes:
            reserved.update(n.outputs)
            reserved.update(n.inputs)
            reserved.add(n.name)
            for _, sub in n.subgraphs():
                reserved.update(sub._names())

    def _names(self) -> set[str]:
        names = set(self.initializers)
        names.update(v.name for v in self.inputs)
        names.update(v.name for v in self.outputs)
        update = names.update
        for n in self.nodes:
            update(n.outputs)
            update(n.inputs)
            update((n.name,))
            for _, sub in n.subgraphs():
                update(sub._names())
        return names

    # -- checks ------------------------------------------------------------------------------
    def validate(self, outer: frozenset | set = frozenset()) -> None:
        """Raise a :class:`GraphError` naming the node if a value is undefined, defined twice,
        read before it is written (the node list must be topologically sorted) or a cycle
        exists. ``outer``: names visible from enclosing graphs."""
        defined = set(self.initializers)
        for v in self.inputs:
            if v.name in defined and v.name not in self.initializers:
                raise DuplicateValueError(f"graph {self.name!r}: input {v.name!r} is declared twice")
            defined.add(v.name)
        producers = {}
        for n in self.nodes:
            for o in n.outputs:
                if not o:
                    continue
                if o in producers:
                    raise DuplicateValueError(
                        f"graph {self.name!r}: value {o!r} is written by node "
                        f"{producers[o].name!r} ({producers[o].op_type}) and node "
                        f"{n.name!r} ({n.op_type})"
                    )
                if o in defined:
                    raise DuplicateValueError(
                        f"graph {self.name!r}: node {n.name!r} ({n.op_type}) writes "
                        f"{o!r}, which is already a graph input or initializer"
                    )
                producers[o] = n
        visible = set(defined) | set(outer)
        for _i, n in enumerate(self.nodes):
            for name in n.present_inputs():
                if name in visible:
                    continue
                if name in producers:
                    self._raise_order(n, name, producers)
                raise DanglingValueError(
                    f"graph {self.name!r}: node {n.name!r} ({n.op_type}) reads {name!r}, "
                    "which is not a graph input, an initializer, an outer-scope value "
                    "or the output of any node"
                )
            for key, sub in n.subgraphs():
                try:
                    sub.validate(frozenset(visible))
                except DanglingValueError as exc:
                    missing = _missing_name(sub, visible)
                    if missing is not None and missing in producers:
                        self._raise_order(n, missing, producers)
                    raise DanglingValueError(
                        f"graph {self.name!r}: in attribute {key!r} of node {n.name!r} ({n.op_type}): {exc.args[0]}"
                    ) from None
            visible.update(o for o in n.outputs if o)
        for v in self.outputs:
            if v.name not in visible:
                raise DanglingValueError(
                    f"graph {self.name!r}: output {v.name!r} is not produced by any node "
                    "and is not an input or initializer"
                )

    def _raise_order(self, node: Node, name: str, producers: dict) -> None:
        # Either a cycle (report it) or merely an unsorted node list (say so).
        try:
            toposort(self.nodes, set(self.initializers) | set(self.input_names), graph_name=self.name)
        except GraphCycleError:
            raise
        raise GraphError(
            f"graph {self.name!r}: node {node.name!r} ({node.op_type}) reads {name!r} before node "
            f"{producers[name].name!r} writes it; the nodes are not in topological order "
            "(call graph.sort())"
        )

    def sort(self) -> Graph:
        """Reorder ``nodes`` topologically (stable); raises :class:`GraphCycleError`."""
        self.nodes = toposort(self.nodes, set(self.initializers) | set(self.input_names), graph_name=self.name)
        return self

    # -- display -------------------------------------------------------------------------------
    def __repr__(self) -> str:
        return (
            f"<Graph {self.name!r}: {len(self.inputs)} inputs, {len(self.outputs)} outputs, "
            f"{len(self.nodes)} nodes, {len(self.initializers)} initializers>"
        )

    def summary(self) -> str:
        """A readable listing: inputs, outputs, then one line per node."""
        lines = [f"graph {self.name} (opsets {self.opset_imports})"]
        lines += [f"  input  {v!r}" for v in self.inputs]
        lines += [f"  init   {k}: {list(a.shape)} {a.dtype}" for k, a in self.initializers.items()]
        lines += [f"  {n!r}" for n in self.nodes]
        lines += [f"  output {v!r}" for v in self.outputs]
        return "\n".join(lines)


def free_names(node: Node) -> set[str]:
    """Outer-scope names read inside ``node``'s subgraphs (its implicit inputs)."""
    names: set[str] = set()
    for _, sub in node.subgraphs():
        names |= _graph_free_names(sub)
    return names


def _graph_free_names(g: Graph) -> set[str]:
    local = set(g.initializers) | set(g.input_names)
    free: set[str] = set()
    for n in g.nodes:
        for name in set(n.present_inputs()) | free_names(n):
            if name not in local:
                free.add(name)
        local.update(o for o in n.outputs if o)
    for v in g.outputs:
        if v.name not in local:
            free.add(v.name)
    return free


def _missing_name(sub: Graph, visible: set) -> str | None:
    for name in _graph_free_names(sub):
        if name not in visible:
            return name
    return None


def toposort(nodes: list[Node], available: set[str], graph_name: str = "graph") -> list[Node]:
    """Order ``nodes`` so each runs after the producers of its inputs (including values its
    subgraphs read); stable for already-sorted lists. Raises :class:`GraphCycleError`."""
    producer = {o: i for i, n in enumerate(nodes) for o in n.outputs if o}
    deps = []
    for n in nodes:
        needed = (set(n.present_inputs()) | free_names(n)) - available
        deps.append({producer[x] for x in needed if x in producer})
    users: dict[int, list[int]] = {}
    for i, d in enumerate(deps):
        for j in d:
            users.setdefault(j, []).append(i)
    indeg = [len(d) for d in deps]
    ready = [i for i, d in enumerate(indeg) if d == 0]
    import heapq

    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users.get(i, ()):
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        stuck = [nodes[i] for i in range(len(nodes)) if indeg[i] > 0]
        cycle = _find_cycle(stuck, deps, nodes)
        raise GraphCycleError(
            f"graph {graph_name!r}: the nodes form a cycle: " + " -> ".join(f"{n.name} ({n.op_type})" for n in cycle)
        )
    return [nodes[i] for i in order]


def _find_cycle(stuck: list[Node], deps: list[set], nodes: list[Node]) -> list[Node]:
    index = {id(n): i for i, n in enumerate(nodes)}
    stuck_ids = {index[id(n)] for n in stuck}
    start = index[id(stuck[0])]
    seen: dict[int, int] = {}
    path = []
    cur = start
    while cur not in seen:
        seen[cur] = len(path)
        path.append(cur)
        nxt = [d for d in deps[cur] if d in stuck_ids]
        if not nxt:
            break
        cur = min(nxt)
    cyc = path[seen.get(cur, 0) :] + [cur]
    return [nodes[i] for i in reversed(cyc)]


__all__ = [
    "DanglingValueError",
    "DuplicateValueError",
    "Graph",
    "GraphCycleError",
    "GraphError",
    "KINDS",
    "Node",
    "Value",
    "free_names",
    "toposort",
]
