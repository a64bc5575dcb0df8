"""An image super-resolution conv stack (ESPCN-style): convs with ReLU at low resolution, then a
sub-pixel (pixel-shuffle) upsample.

Every conv is stride 1 with "same" padding, so the network is translation-equivariant and
its receptive field is finite: ``net.receptive_field()`` is the halo (input pixels on each
side) a tile needs for tiled inference to equal the whole-image result
(see :func:`opsnn.pipeline.tiled`)::

    >>> import opsnn, numpy as np
    >>> from opsnn.models.superres import superres
    >>> net = superres(scale=2, in_channels=1, channels=8, num_layers=3)
    >>> net(opsnn.tensor(np.zeros((1, 1, 16, 20), np.float32))).shape
    (1, 1, 32, 40)
    >>> net.receptive_field()
    4
"""

from __future__ import annotations

from .. import nn, ops
from ..errors import ParamInvalidError
from ..nn import init


class SuperResNet(nn.Module):
    """``conv(first_kernel) + ReLU``, ``num_layers - 2`` x ``conv3x3 + ReLU``, ``conv3x3 ->
    in_channels * scale**2``, ``pixel_shuffle(scale)`` (no shuffle when ``scale == 1``: a
    same-size enhancement/denoising stack). Submodules are ``body.0``, ``body.2``, ... (convs)
    in an ``nn.Sequential``."""

    def __init__(
        self, scale: int = 2, in_channels: int = 1, channels: int = 32, num_layers: int = 3, first_kernel: int = 5
    ):
        super().__init__()
        for n, v, lo in (
            ("scale", scale, 1),
            ("in_channels", in_channels, 1),
            ("channels", channels, 1),
            ("num_layers", num_layers, 2),
            ("first_kernel", first_kernel, 1),
        ):
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ParamInvalidError(f"SuperResNet: {n} must be an int >= {lo}, got {v!r}")
        if first_kernel % 2 == 0:
            raise ParamInvalidError(f"SuperResNet: first_kernel must be odd (same padding), got {first_kernel}")
        self.scale, self.in_channels, self.channels = scale, in_channels, channels
        self.kernels = [first_kernel] + [3] * (num_layers - 1)
        layers = []
        cin = in_channels
        for i, k in enumerate(self.kernels):
            last = i == num_layers - 1
            cout = in_channels * scale * scale if last else channels
            layers.append(nn.Conv2d(cin, cout, k, padding=k // 2))
            if not last:
                layers.append(nn.ReLU())
            cin = cout
        self.body = nn.Sequential(*layers)

    def forward(self, x):
        y = self.body(x)
        return ops.pixel_shuffle(y, self.scale) if self.scale > 1 else y

    def receptive_field(self) -> int:
        """Input pixels on each side that one output pixel depends on: sum of (k - 1) / 2."""
        return sum((k - 1) // 2 for k in self.kernels)

    def extra_repr(self) -> str:
        return f"scale={self.scale}"


def superres(
    scale: int = 2,
    in_channels: int = 1,
    channels: int = 32,
    num_layers: int = 3,
    first_kernel: int = 5,
    *,
    seed: int | None = 0,
) -> SuperResNet:
    """A :class:`SuperResNet` with deterministic random weights drawn from ``seed``."""
    with init.seeded(seed):
        return SuperResNet(scale, in_channels, channels, num_layers, first_kernel)


__all__ = ["SuperResNet", "superres"]
