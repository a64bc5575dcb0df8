"""Symbolic dims: integer expressions over named sizes ("batch", "seq") for shape inference.

Per-op inference functions are written with plain int arithmetic; fed :class:`Sym` dims
they compute symbolic output shapes (``floor((H + -1)/2) + 1`` for a stride-2 conv).
Comparisons that depend on a symbol's value raise :class:`SymbolicError`, and the graph
engine then falls back to probing with concrete values or leaves the dim unknown::

    >>> H = Sym("H")
    >>> (H + 2 * 1 - 3) // 1 + 1
    H
    >>> ((H + 2 - 3) // 2 + 1).evaluate({"H": 224})
    112
"""

from __future__ import annotations

from typing import Union

from ..errors import InferShapeError

IntLike = Union[int, "Sym"]


class SymbolicError(InferShapeError, TypeError):
    """An inference step needs the concrete value of a symbolic dim."""


def _mono_str(mono: tuple) -> str:
    return "*".join(a if p == 1 else f"{a}^{p}" for a, p in mono)


class Sym:
    """A polynomial with integer coefficients over atoms (names or opaque floor/mod/max terms)."""

    __slots__ = ("terms", "_atoms")

    def __init__(self, name_or_terms, atoms: dict | None = None):
        if isinstance(name_or_terms, str):
            self.terms = {((name_or_terms, 1),): 1}
            self._atoms = {name_or_terms: None}
        else:
            self.terms = {m: c for m, c in name_or_terms.items() if c != 0}
            self._atoms = atoms or {}

    # -- construction helpers ---------------------------------------------------------------
    @staticmethod
    def _lift(x) -> Sym:
        if isinstance(x, Sym):
            return x
        if isinstance(x, bool) or not isinstance(x, int):
            try:
                x = int(x)  # numpy ints
            except (TypeError, ValueError):
                raise SymbolicError(f"cannot mix a symbolic dim with {x!r}") from None
        return Sym({(): x} if x else {})

    @staticmethod
    def _wrap(terms: dict, atoms: dict):
        s = Sym(terms, atoms)
        c = s.constant()
        return c if c is not None else s

    def constant(self) -> int | None:
        if not self.terms:
            return 0
        if len(self.terms) == 1 and () in self.terms:
            return self.terms[()]
        return None

    def _merge_atoms(self, other: Sym) -> dict:
        return {**self._atoms, **other._atoms}

    # -- arithmetic ---------------------------------------------------------------------------
    def __add__(self, other):
        o = Sym._lift(other)
        terms = dict(self.terms)
        for m, c in o.terms.items():
            terms[m] = terms.get(m, 0) + c
        return Sym._wrap(terms, self._merge_atoms(o))

    __radd__ = __add__

    def __neg__(self):
        return Sym._wrap({m: -c for m, c in self.terms.items()}, self._atoms)

    def __sub__(self, other):
        return self + (-Sym._lift(other))

    def __rsub__(self, other):
        return Sym._lift(other) + (-self)

    def __mul__(self, other):
        o = Sym._lift(other)
        terms: dict = {}
        for m1, c1 in self.terms.items():
            for m2, c2 in o.terms.items():
                powers: dict = {}
                for a, p in m1 + m2:
                    powers[a] = powers.get(a, 0) + p
                m = tuple(sorted(powers.items()))
                terms[m] = terms.get(m, 0) + c1 * c2
        return Sym._wrap(terms, self._merge_atoms(o))

    __rmul__ = __mul__

    def _opaque(self, kind: str, other) -> Sym:
        name = (
            f"{kind}({self}, {other})"
            if kind in ("max", "min")
            else (f"floor(({self})/{other})" if kind == "floor" else f"(({self}) mod {other})")
        )
        return Sym({((name, 1),): 1}, {**self._atoms, name: (kind, self, other)})

    def __floordiv__(self, other):
        o = Sym._lift(other)
        d = o.constant()
        if d is None:
            return self._opaque("floor", o)
        if d == 0:
            raise SymbolicError("symbolic dim divided by zero")
        if all(c % d == 0 for c in self.terms.values()):
            return Sym._wrap({m: c // d for m, c in self.terms.items()}, self._atoms)
        inner, k = self._atom_plus_constant()
        if d > 0 and inner is not None and inner[0] == "floor" and isinstance(inner[2], int) and inner[2] > 0:
            # floor((floor(a/p) + k)/d) = floor((a + k*p)/(p*d)): a chain of strided pools stays one term
            return (inner[1] + k * inner[2]) // (inner[2] * d)
        return self._opaque("floor", d)

    def _atom_plus_constant(self):
        """``(spec, k)`` when this is exactly one opaque term (coefficient 1) plus a constant ``k``."""
        k = self.terms.get((), 0)
        rest = [(m, c) for m, c in self.terms.items() if m]
        if len(rest) != 1 or rest[0][1] != 1 or len(rest[0][0]) != 1 or rest[0][0][0][1] != 1:
            return None, 0
        return self._atoms.get(rest[0][0][0][0]), k

    def __rfloordiv__(self, other):
        return Sym._lift(other)._opaque("floor", self)

    def __mod__(self, other):
        o = Sym._lift(other)
        d = o.constant()
        if d is not None and d != 0 and all(c % d == 0 for c in self.terms.values()):
            return 0
        return self._opaque("mod", other)

    def __truediv__(self, other):
        raise SymbolicError(f"true division of symbolic dim {self} (use //)")

    # -- comparisons ---------------------------------------------------------------------------
    def __eq__(self, other):
        if isinstance(other, (Sym, int)) and not isinstance(other, bool):
            diff = self - other
            return (diff if isinstance(diff, int) else diff.constant()) == 0
        try:
            return self == int(other)
        except (TypeError, ValueError):
            return NotImplemented

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self):
        return hash(tuple(sorted(self.terms.items())))

    def _cmp(self, other) -> int:
        diff = self - other
        c = diff if isinstance(diff, int) else diff.constant()
        if c is None:
            raise SymbolicError(f"comparison of {self} with {other} depends on the value of a symbolic dim")
        return c

    def __lt__(self, o):
        return self._cmp(o) < 0

    def __le__(self, o):
        return self._cmp(o) <= 0

    def __gt__(self, o):
        return self._cmp(o) > 0

    def __ge__(self, o):
        return self._cmp(o) >= 0

    def __int__(self):
        c = self.constant()
        if c is None:
            raise SymbolicError(f"symbolic dim {self} has no concrete value yet")
        return c

    __index__ = __int__

    def __bool__(self):
        raise SymbolicError(f"truth value of symbolic dim {self} is unknown")

    # -- evaluation ----------------------------------------------------------------------------
    def atoms(self) -> set[str]:
        """The named symbols this expression depends on (through opaque terms too)."""
        # each opaque term is visited once: a term's atoms include its operands' (recursing into
        # every one of them took 2**depth steps for a chain of strided pools)
        names, seen, todo = set(), set(), [self]
        while todo:
            for name, spec in todo.pop()._atoms.items():
                if name in seen:
                    continue
                seen.add(name)
                if spec is None:
                    names.add(name)
                else:
                    todo.extend(part for part in spec[1:] if isinstance(part, Sym))
        return names

    def evaluate(self, bindings: dict) -> int:
        def atom_value(name):
            spec = self._atoms.get(name)
            if spec is None:
                if name not in bindings:
                    raise SymbolicError(f"no value bound for symbolic dim {name!r}")
                return int(bindings[name])
            kind, a, b = spec
            av = a.evaluate(bindings) if isinstance(a, Sym) else int(a)
            bv = b.evaluate(bindings) if isinstance(b, Sym) else int(b)
            return {
                "floor": lambda: av // bv,
                "mod": lambda: av % bv,
                "max": lambda: max(av, bv),
                "min": lambda: min(av, bv),
            }[kind]()

        total = 0
        for mono, c in self.terms.items():
            v = c
            for a, p in mono:
                v *= atom_value(a) ** p
            total += v
        return total

    def __repr__(self) -> str:
        parts = []
        for mono, c in sorted(self.terms.items(), key=lambda mc: (len(mc[0]) == 0, mc[0])):
            if not mono:
                parts.append(str(c))
            elif c == 1:
                parts.append(_mono_str(mono))
            elif c == -1:
                parts.append("-" + _mono_str(mono))
            else:
                parts.append(f"{c}*{_mono_str(mono)}")
        return " + ".join(parts) if parts else "0"


def sym_max(a: IntLike, b: IntLike) -> IntLike:
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    try:
        return a if Sym._lift(a) >= b else b
    except SymbolicError:
        return Sym._lift(a)._opaque("max", b)


def is_symbolic(d) -> bool:
    return isinstance(d, Sym)


def as_dim(d):
    """A Value's dim as inference sees it: int stays, a str becomes a symbol, None stays None."""
    if isinstance(d, str):
        return Sym(d)
    return d


def bind(shape: tuple, bindings: dict) -> tuple:
    """Evaluate a symbolic shape under concrete bindings."""
    return tuple(d.evaluate(bindings) if isinstance(d, Sym) else d for d in shape)
