"""ResNet (torchvision layout and parameter names: ``conv1``, ``bn1``, ``layer1.0.conv1``,
``layer1.0.downsample.0``, ``fc``), so torchvision checkpoints saved as safetensors/npz load
directly. Deterministic random init from ``seed`` (kaiming-normal convs, as torchvision).

>>> import opsnn, numpy as np
>>> net = opsnn.models.resnet50(num_classes=10, seed=0)
>>> net(opsnn.tensor(np.zeros((1, 3, 64, 64), np.float32))).shape
(1, 10)
"""

from __future__ import annotations

from .. import nn, ops
from ..errors import ParamInvalidError
from ..nn import init


def _conv(cin, cout, k, stride=1, padding=0, groups=1, dilation=1):
    return nn.Conv2d(cin, cout, k, stride=stride, padding=padding, groups=groups, dilation=dilation, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None, groups=1, base_width=64):
        super().__init__()
        if groups != 1 or base_width != 64:
            raise ParamInvalidError("BasicBlock: only groups=1 and base_width=64 are supported")
        self.conv1 = _conv(inplanes, planes, 3, stride, 1)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU()
        self.conv2 = _conv(planes, planes, 3, 1, 1)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        out = self.bn1(self.conv1(x), relu=True)
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return ops.relu(ops.add(out, identity))


class Bottleneck(nn.Module):
    """torchvision's v1.5 bottleneck: the stride sits on the 3x3 conv."""

    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None, groups=1, base_width=64):
        super().__init__()
        width = int(planes * (base_width / 64.0)) * groups
        self.conv1 = _conv(inplanes, width, 1)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = _conv(width, width, 3, stride, 1, groups)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = _conv(width, planes * self.expansion, 1)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU()
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        out = self.bn1(self.conv1(x), relu=True)
        out = self.bn2(self.conv2(out), relu=True)
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return ops.relu(ops.add(out, identity))


class ResNet(nn.Module):
    """``forward(x (N, 3, H, W)) -> logits (N, num_classes)``."""

    def __init__(self, block, layers, num_classes: int = 1000, groups: int = 1, width_per_group: int = 64):
        super().__init__()
        if len(layers) != 4:
            raise ParamInvalidError(f"ResNet: layers must list 4 stage depths, got {layers!r}")
        self.block, self.layers_cfg, self.num_classes = block, list(layers), int(num_classes)
        self.groups, self.base_width = groups, width_per_group
        self.inplanes = 64
        self.conv1 = _conv(3, 64, 7, 2, 3)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], 2)
        self.layer3 = self._make_layer(block, 256, layers[2], 2)
        self.layer4 = self._make_layer(block, 512, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512 * block.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _make_layer(self, block, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                _conv(self.inplanes, planes * block.expansion, 1, stride), nn.BatchNorm2d(planes * block.expansion)
            )
        layers = [block(self.inplanes, planes, stride, downsample, self.groups, self.base_width)]
        self.inplanes = planes * block.expansion
        for _ in range(1, blocks):
            layers.append(block(self.inplanes, planes, 1, None, self.groups, self.base_width))
        return nn.Sequential(*layers)

    def features(self, x):
        """The pooled 512*expansion feature vector (N, C)."""
        x = self.maxpool(self.bn1(self.conv1(x), relu=True))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return nn.functional.reshape(self.avgpool(x), (0, -1))

    def forward(self, x):
        x = nn.functional.as_image(x, 3, "ResNet")
        return self.fc(self.features(x))


def _build(block, layers, num_classes, seed, weights, strict):
    with init.seeded(seed):
        model = ResNet(block, layers, num_classes)
    if weights is not None:
        from .weights import load_weights

        load_weights(model, weights, strict=strict)
    return model


def resnet50(num_classes: int = 1000, *, seed: int | None = 0, weights=None, strict: bool = True) -> ResNet:
    """ResNet-50 (bottleneck [3, 4, 6, 3]); ``weights``: a local .safetensors/.npz/.onnx file
    or a state dict with torchvision names."""
    return _build(Bottleneck, [3, 4, 6, 3], num_classes, seed, weights, strict)


def resnet18(num_classes: int = 1000, *, seed: int | None = 0, weights=None, strict: bool = True) -> ResNet:
    """ResNet-18 (basic blocks [2, 2, 2, 2])."""
    return _build(BasicBlock, [2, 2, 2, 2], num_classes, seed, weights, strict)


__all__ = ["BasicBlock", "Bottleneck", "ResNet", "resnet18", "resnet50"]
