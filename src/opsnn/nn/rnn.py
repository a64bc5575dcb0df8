"""``LSTM`` and ``GRU`` with torch's parameters, run by the ONNX ``LSTM`` / ``GRU`` ops.

Parameters keep torch's names and layout (``weight_ih_l{k}[_reverse]`` (G*H, in),
``weight_hh_l{k}`` (G*H, H), ``bias_ih_l{k}``, ``bias_hh_l{k}``), so torch checkpoints load
as they are. Each forward maps them onto the ONNX layout, one op call per layer:

* gate order: torch's LSTM stacks gates as (i, f, g, o), ONNX's as (i, o, f, c) (c is g),
  so the gate blocks are taken in order [0, 3, 1, 2]; torch's GRU stacks (r, z, n),
  ONNX's (z, r, h), so the blocks are taken in order [1, 0, 2];
* ``W`` = reordered ``weight_ih`` stacked over directions (dirs, G*H, in), ``R`` likewise
  from ``weight_hh``, ``B`` = [reordered ``bias_ih``, reordered ``bias_hh``] (dirs, 2*G*H);
* GRU uses ``linear_before_reset=1``: torch applies the reset gate after the hidden
  matmul, ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))``;
* ONNX's Y (L, dirs, N, H) becomes torch's (L, N, dirs*H); Y_h of every layer is stacked
  into h_n (layers*dirs, N, H).

>>> import opsnn, numpy as np
>>> lstm = opsnn.nn.LSTM(8, 16, num_layers=2, batch_first=True)
>>> out, (h, c) = lstm(opsnn.tensor(np.random.rand(3, 5, 8).astype(np.float32)))
>>> out.shape, h.shape
((3, 5, 16), (2, 3, 16))
"""

from __future__ import annotations

import math

import numpy as np

from .. import ops
from ..autograd import is_grad_enabled
from ..errors import ParamInvalidError
from ..tensor import as_tensor
from . import init
from .functional import dropout, reshape
from .module import Module


class _RNNBase(Module):
    GATES = 1
    ORDER = (0,)

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        proj_size: int = 0,
        dtype="float32",
    ):
        super().__init__()
        name = type(self).__name__
        if proj_size:
            raise ParamInvalidError(f"{name}: proj_size is not supported")
        if num_layers < 1 or hidden_size < 1 or input_size < 1:
            raise ParamInvalidError(
                f"{name}: input_size, hidden_size and num_layers must be >= 1, got "
                f"{input_size}, {hidden_size}, {num_layers}"
            )
        if not 0.0 <= dropout <= 1.0:
            raise ParamInvalidError(f"{name}: dropout must be in [0, 1], got {dropout}")
        self.input_size, self.hidden_size, self.num_layers = int(input_size), int(hidden_size), int(num_layers)
        self.bias, self.batch_first, self.dropout = bool(bias), bool(batch_first), float(dropout)
        self.bidirectional = bool(bidirectional)
        self.num_directions = 2 if bidirectional else 1
        H, G = self.hidden_size, self.GATES
        bound = 1.0 / math.sqrt(H)
        for layer in range(self.num_layers):
            in_size = self.input_size if layer == 0 else H * self.num_directions
            for sfx in self._suffixes(layer):
                self.register_parameter(f"weight_ih{sfx}", init.uniform((G * H, in_size), -bound, bound, dtype))
                self.register_parameter(f"weight_hh{sfx}", init.uniform((G * H, H), -bound, bound, dtype))
                if bias:
                    self.register_parameter(f"bias_ih{sfx}", init.uniform((G * H,), -bound, bound, dtype))
                    self.register_parameter(f"bias_hh{sfx}", init.uniform((G * H,), -bound, bound, dtype))

    def _suffixes(self, layer: int) -> list[str]:
        return [f"_l{layer}"] + ([f"_l{layer}_reverse"] if self.bidirectional else [])

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}"
        if self.batch_first:
            s += ", batch_first=True"
        if self.bidirectional:
            s += ", bidirectional=True"
        return s

    def _reorder(self, a: np.ndarray) -> np.ndarray:
        H = self.hidden_size
        return np.concatenate([a[g * H : (g + 1) * H] for g in self.ORDER], axis=0)

    def onnx_weights(self, layer: int) -> tuple:
        """``(W, R, B)`` of ``layer`` in the ONNX layout (numpy; ``B`` None without bias)."""
        W, R, B = [], [], []
        for sfx in self._suffixes(layer):
            W.append(self._reorder(getattr(self, f"weight_ih{sfx}").numpy()))
            R.append(self._reorder(getattr(self, f"weight_hh{sfx}").numpy()))
            if self.bias:
                B.append(
                    np.concatenate(
                        [
                            self._reorder(getattr(self, f"bias_ih{sfx}").numpy()),
                            self._reorder(getattr(self, f"bias_hh{sfx}").numpy()),
                        ]
                    )
                )
        return np.stack(W), np.stack(R), (np.stack(B) if self.bias else None)

    def _onnx_weight_tensors(self, layer: int) -> tuple:
        """``onnx_weights`` built with ops from the Parameters, so gradients reach them."""
        H = self.hidden_size

        def reorder(t):
            parts = ops.split(t, [H] * self.GATES, dim=0)
            return ops.concat([parts[g] for g in self.ORDER], dim=0)

        W, R, B = [], [], []
        for sfx in self._suffixes(layer):
            W.append(ops.unsqueeze(reorder(getattr(self, f"weight_ih{sfx}")), 0))
            R.append(ops.unsqueeze(reorder(getattr(self, f"weight_hh{sfx}")), 0))
            if self.bias:
                B.append(
                    ops.unsqueeze(
                        ops.concat(
                            [reorder(getattr(self, f"bias_ih{sfx}")), reorder(getattr(self, f"bias_hh{sfx}"))], dim=0
                        ),
                        0,
                    )
                )

        def cat(ts):
            return ts[0] if len(ts) == 1 else ops.concat(ts, dim=0)

        return cat(W), cat(R), (cat(B) if self.bias else None)

    def _weights(self, layer: int) -> tuple:
        if is_grad_enabled() and any(p.requires_grad for p in self.parameters()):
            return self._onnx_weight_tensors(layer)
        return self.onnx_weights(layer)

    def _check_input(self, x):
        x = as_tensor(x)
        name = type(self).__name__
        if x.ndim not in (2, 3) or x.shape[-1] != self.input_size:
            raise ParamInvalidError(
                f"{name}: input must be (L, N, {self.input_size}) (or (N, L, ...) with "
                f"batch_first, or 2-D unbatched), got {x.shape}"
            )
        return x

    def _state(self, s, N: int, what: str):
        if s is None:
            return None
        s = as_tensor(s)
        want = (self.num_layers * self.num_directions, N, self.hidden_size)
        if tuple(s.shape) != want:
            raise ParamInvalidError(f"{type(self).__name__}: {what} must be {want}, got {s.shape}")
        return s

    def _layer_state(self, s, layer: int):
        if s is None:
            return None
        d = self.num_directions
        return ops.slice(s, [layer * d], [(layer + 1) * d], axes=[0])

    def _run(self, x, states: list):
        """Shared driver: returns (output, [stacked final states])."""
        x = self._check_input(x)
        unbatched = x.ndim == 2
        if unbatched:
            x = ops.unsqueeze(x, 1)
            states = [None if s is None else ops.unsqueeze(s, 1) for s in states]
        elif self.batch_first:
            x = ops.transpose(x, (1, 0, 2))
        N = x.shape[1]
        states = [self._state(s, N, w) for s, w in zip(states, ("h_0", "c_0"))]
        direction = "bidirectional" if self.bidirectional else "forward"
        finals = [[] for _ in states]
        for layer in range(self.num_layers):
            W, R, B = self._weights(layer)
            init_states = [self._layer_state(s, layer) for s in states]
            outs = self._op(x, W, R, B, init_states, direction)
            y = outs[0]  # (L, dirs, N, H)
            x = reshape(ops.transpose(y, (0, 2, 1, 3)), (0, 0, self.num_directions * self.hidden_size))
            for f, o in zip(finals, outs[1:]):
                f.append(o)
            if layer + 1 < self.num_layers:  # torch: every layer's output but the last's
                x = dropout(x, self.dropout, self.training, f"{type(self).__name__}(dropout={self.dropout})")
        final = [f[0] if len(f) == 1 else ops.concat(f, dim=0) for f in finals]
        if unbatched:
            x = ops.squeeze(x, 1)
            final = [ops.squeeze(f, 1) for f in final]
        elif self.batch_first:
            x = ops.transpose(x, (1, 0, 2))
        return x, final


class LSTM(_RNNBase):
    """torch.nn.LSTM: ``forward(x, (h_0, c_0)=None) -> (output, (h_n, c_n))``."""

    GATES = 4
    ORDER = (0, 3, 1, 2)  # torch (i, f, g, o) -> ONNX (i, o, f, c)

    def _op(self, x, W, R, B, init_states, direction):
        h0, c0 = init_states
        if (h0 is None) != (c0 is None):  # ONNX needs both or neither
            zero = np.zeros((self.num_directions, x.shape[1], self.hidden_size), x.dtype)
            h0 = zero if h0 is None else h0
            c0 = zero if c0 is None else c0
        return ops.lstm(x, W, R, B, None, h0, c0, hidden_size=self.hidden_size, direction=direction)

    def forward(self, x, hx=None):
        h0, c0 = (None, None) if hx is None else hx
        y, (h, c) = self._run(x, [h0, c0])
        return y, (h, c)


class GRU(_RNNBase):
    """torch.nn.GRU: ``forward(x, h_0=None) -> (output, h_n)``."""

    GATES = 3
    ORDER = (1, 0, 2)  # torch (r, z, n) -> ONNX (z, r, h)

    def _op(self, x, W, R, B, init_states, direction):
        return ops.gru(
            x, W, R, B, None, init_states[0], hidden_size=self.hidden_size, direction=direction, linear_before_reset=1
        )

    def forward(self, x, hx=None):
        y, (h,) = self._run(x, [hx])
        return y, h


class RNN(_RNNBase):
    """torch.nn.RNN (Elman, ``nonlinearity`` 'tanh' or 'relu'): ``forward(x, h_0=None) -> (output, h_n)``;
    torch's argument order (``nonlinearity`` fourth)."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        nonlinearity: str = "tanh",
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        dtype="float32",
    ):
        if nonlinearity not in ("tanh", "relu"):
            raise ParamInvalidError(f"RNN: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, dtype=dtype)
        self.nonlinearity = nonlinearity

    def _op(self, x, W, R, B, init_states, direction):
        act = "Tanh" if self.nonlinearity == "tanh" else "Relu"
        return ops.rnn(
            x,
            W,
            R,
            B,
            None,
            init_states[0],
            hidden_size=self.hidden_size,
            direction=direction,
            activations=[act] * self.num_directions,
        )

    def forward(self, x, hx=None):
        y, (h,) = self._run(x, [hx])
        return y, h


class _CellBase(Module):
    """One step of a recurrent layer with torch's cell parameters (``weight_ih`` (G*H, in),
    ``weight_hh`` (G*H, H), ``bias_ih``, ``bias_hh``), written with opsnn ops (gradients through their
    rules). Inputs are (N, in) or one unbatched (in,) vector."""

    GATES = 1

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, dtype="float32"):
        super().__init__()
        name = type(self).__name__
        if input_size < 1 or hidden_size < 1:
            raise ParamInvalidError(f"{name}: input_size and hidden_size must be >= 1, got {input_size}, {hidden_size}")
        self.input_size, self.hidden_size, self.bias = int(input_size), int(hidden_size), bool(bias)
        G, H = self.GATES, self.hidden_size
        bound = 1.0 / math.sqrt(H)
        self.register_parameter("weight_ih", init.uniform((G * H, self.input_size), -bound, bound, dtype))
        self.register_parameter("weight_hh", init.uniform((G * H, H), -bound, bound, dtype))
        if bias:
            self.register_parameter("bias_ih", init.uniform((G * H,), -bound, bound, dtype))
            self.register_parameter("bias_hh", init.uniform((G * H,), -bound, bound, dtype))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)

    def _batched(self, x, states):
        x = as_tensor(x)
        if x.ndim not in (1, 2) or x.shape[-1] != self.input_size:
            raise ParamInvalidError(
                f"{type(self).__name__}: input must be (N, {self.input_size}) or ({self.input_size},), got {tuple(x.shape)}"
            )
        one = x.ndim == 1
        x = ops.unsqueeze(x, 0) if one else x
        n = x.shape[0]
        out = []
        for s in states:
            if s is None:
                out.append(as_tensor(np.zeros((n, self.hidden_size), x.dtype)))
            else:
                s = as_tensor(s)
                s = ops.unsqueeze(s, 0) if one and s.ndim == 1 else s
                if tuple(s.shape) != (n, self.hidden_size):
                    raise ParamInvalidError(
                        f"{type(self).__name__}: a state must be ({n}, {self.hidden_size}), got {tuple(s.shape)}"
                    )
                out.append(s)
        return x, out, one

    def _gates(self, x, h):
        gi = ops.linear(x, self.weight_ih, self.bias_ih)
        gh = ops.linear(h, self.weight_hh, self.bias_hh)
        return gi, gh

    @staticmethod
    def _unbatched(t, one):
        return ops.squeeze(t, 0) if one else t

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}" + ("" if self.bias else ", bias=False")


class RNNCell(_CellBase):
    """torch.nn.RNNCell: ``h' = act(x W_ih^T + b_ih + h W_hh^T + b_hh)``."""

    def __init__(
        self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh", dtype="float32"
    ):
        if nonlinearity not in ("tanh", "relu"):
            raise ParamInvalidError(f"RNNCell: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        super().__init__(input_size, hidden_size, bias, dtype)
        self.nonlinearity = nonlinearity

    def forward(self, x, hx=None):
        x, (h,), one = self._batched(x, [hx])
        gi, gh = self._gates(x, h)
        act = ops.tanh if self.nonlinearity == "tanh" else ops.relu
        return self._unbatched(act(ops.add(gi, gh)), one)


class LSTMCell(_CellBase):
    """torch.nn.LSTMCell: gates (i, f, g, o); ``forward(x, (h, c)=None) -> (h', c')``."""

    GATES = 4

    def forward(self, x, hx=None):
        h0, c0 = (None, None) if hx is None else hx
        x, (h, c), one = self._batched(x, [h0, c0])
        gi, gh = self._gates(x, h)
        i, f, g, o = ops.split(ops.add(gi, gh), [self.hidden_size] * 4, dim=1)
        c2 = ops.add(ops.mul(ops.sigmoid(f), c), ops.mul(ops.sigmoid(i), ops.tanh(g)))
        h2 = ops.mul(ops.sigmoid(o), ops.tanh(c2))
        return self._unbatched(h2, one), self._unbatched(c2, one)


class GRUCell(_CellBase):
    """torch.nn.GRUCell: gates (r, z, n), ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))``."""

    GATES = 3

    def forward(self, x, hx=None):
        x, (h,), one = self._batched(x, [hx])
        gi, gh = self._gates(x, h)
        H = self.hidden_size
        ir, iz, i_n = ops.split(gi, [H, H, H], dim=1)
        hr, hz, h_n = ops.split(gh, [H, H, H], dim=1)
        r = ops.sigmoid(ops.add(ir, hr))
        z = ops.sigmoid(ops.add(iz, hz))
        n = ops.tanh(ops.add(i_n, ops.mul(r, h_n)))
        one_minus = ops.sub(as_tensor(np.ones((), x.dtype)), z)
        return self._unbatched(ops.add(ops.mul(one_minus, n), ops.mul(z, h)), one)
