"""A small conv net (conv-bn-relu-pool x2, global pool, linear, softmax): the main job's model.

>>> import opsnn, numpy as np
>>> net = opsnn.models.SmallConvNet(seed=0)
>>> probs = net(opsnn.tensor(net.example_input()))
>>> probs.shape
(1, 10)
"""

from __future__ import annotations

import numpy as np

from .. import ops
from ..tensor import Tensor, tensor


class SmallConvNet:
    """conv3x3(3->16)-bn-relu-maxpool2 -> conv3x3/2(16->32)-bn-relu -> avgpool -> linear(32->10) -> softmax."""

    def __init__(self, seed: int = 0, in_channels: int = 3, num_classes: int = 10, image_size: int = 32):
        rng = np.random.default_rng(seed)
        self.image_size = image_size
        self.in_channels = in_channels

        def w(*shape, fan_in):
            return tensor((rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32))

        def bn(c):
            return dict(
                mean=tensor(rng.standard_normal(c).astype(np.float32) * 0.1),
                var=tensor(rng.uniform(0.5, 1.5, c).astype(np.float32)),
                weight=tensor(rng.uniform(0.8, 1.2, c).astype(np.float32)),
                bias=tensor(rng.standard_normal(c).astype(np.float32) * 0.1),
            )

        self.conv1 = w(16, in_channels, 3, 3, fan_in=in_channels * 9)
        self.bn1 = bn(16)
        self.conv2 = w(32, 16, 3, 3, fan_in=16 * 9)
        self.bn2 = bn(32)
        self.fc_w = w(num_classes, 32, fan_in=32)
        self.fc_b = tensor(np.zeros(num_classes, np.float32))
        self._rng = rng

    def example_input(self, batch: int = 1) -> np.ndarray:
        return self._rng.standard_normal((batch, self.in_channels, self.image_size, self.image_size)).astype(np.float32)

    def __call__(self, x: Tensor) -> Tensor:
        b1, b2 = self.bn1, self.bn2
        y = ops.conv2d(x, self.conv1, None, stride=1, padding=1)
        y = ops.relu(ops.batch_norm(y, b1["mean"], b1["var"], b1["weight"], b1["bias"], eps=1e-5))
        y = ops.max_pool2d(y, 2)
        y = ops.conv2d(y, self.conv2, None, stride=2, padding=1)
        y = ops.relu(ops.batch_norm(y, b2["mean"], b2["var"], b2["weight"], b2["bias"], eps=1e-5))
        y = ops.adaptive_avg_pool2d(y, 1)
        y = ops.flatten(y, 1)  # not reshape(y, (y.shape[0], -1)): a traced batch size would be baked in
        y = ops.linear(y, self.fc_w, self.fc_b)
        return ops.softmax(y, dim=-1)
