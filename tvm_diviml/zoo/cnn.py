"""Convolutional zoo models (torchvision layouts): ResNet-18/50, MobileNetV2 and Inception-v3.

``relax.frontend.nn`` has neither pooling nor batch norm, so this module supplies them (pooling wraps
Relax ops; batch norm at inference is a per-channel scale and shift) together with the small
building blocks that the models, and the random-wired networks in ``randwire.py``, share.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tvm import relax
from tvm.relax.frontend import nn

from .registry import register

ImageInputs = dict[str, tuple[tuple[int, ...], str]]
Activation = Callable[[nn.Tensor], nn.Tensor] | None


class BatchNorm(nn.Module):
    """Inference batch norm: a trained network's statistics and affine terms fold into one
    per-channel scale and shift, which is all that runs (and all that the placement sees)."""

    def __init__(self, channels: int):
        self.scale = nn.Parameter((channels,))
        self.shift = nn.Parameter((channels,))

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return x * self.scale.reshape(1, -1, 1, 1) + self.shift.reshape(1, -1, 1, 1)


class ConvBN(nn.Module):
    """Convolution without bias, batch norm, optional activation: the unit of every CNN here.
    Padding defaults to half the kernel (size-preserving at stride 1), per spatial dimension."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int = 1,
        padding: int | tuple[int, int] | None = None,
        groups: int = 1,
        act: Activation = nn.op.relu,
    ):
        kernel = (kernel_size, kernel_size) if isinstance(kernel_size, int) else tuple(kernel_size)
        padding = tuple(k // 2 for k in kernel) if padding is None else padding
        self.conv = nn.Conv2D(in_channels, out_channels, list(kernel), stride, padding, groups=groups, bias=False)
        self.bn = BatchNorm(out_channels)
        self.act = act

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        x = self.bn(self.conv(x))
        return self.act(x) if self.act else x


class Pool(nn.Module):
    """Max or average pooling as a module, so that a pooling branch can sit in a ModuleList.
    Average pooling counts padded zeros, as torchvision's default does."""

    def __init__(self, kind: str, size: int, stride: int, padding: int = 0):
        if kind not in ("max", "avg"):
            raise ValueError(f"pooling kind must be 'max' or 'avg', got '{kind}'")
        self.kind, self.size, self.stride, self.padding = kind, size, stride, padding

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        pool = relax.op.nn.max_pool2d if self.kind == "max" else relax.op.nn.avg_pool2d
        return nn.op.wrap_nested(
            pool(x._expr, pool_size=self.size, strides=self.stride, padding=self.padding, count_include_pad=True),
            name=f"{self.kind}_pool",
        )


class Parallel(nn.Module):
    """Branches applied to one input, outputs concatenated along channels (Inception's blocks)."""

    def __init__(self, branches: Sequence[nn.Module]):
        self.branches = nn.ModuleList(list(branches))

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return nn.op.concat([branch(x) for branch in self.branches], dim=1)


def sequential(*modules: nn.Module) -> nn.ModuleList:
    """A ModuleList's forward chains its modules, which makes it nn's Sequential."""
    return nn.ModuleList(list(modules))


def global_avg_pool(x: nn.Tensor) -> nn.Tensor:
    """(N, C, H, W) -> (N, C): the mean over the spatial axes."""
    return nn.op.wrap_nested(relax.op.mean(x._expr, axis=[2, 3]), name="global_avg_pool")


class ImageClassifier(nn.Module):
    """A feature extractor followed by global average pooling and a fully connected layer."""

    def __init__(self, features: nn.Module, feature_channels: int, classes: int):
        self.features = features
        self.fc = nn.Linear(feature_channels, classes)

    def forward(self, data: nn.Tensor) -> nn.Tensor:
        return self.fc(global_avg_pool(self.features(data)))


def image_inputs(batch: int, resolution: int, **sizes: int) -> ImageInputs:
    """The input spec of an RGB image model, after checking that every size option is a positive int."""
    for name, value in {"batch": batch, "resolution": resolution, **sizes}.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return {"data": ((batch, 3, resolution, resolution), "float32")}


# ----------------------------------------------------------------------------------------- ResNet


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_channels: int, width: int, stride: int):
        self.conv1 = ConvBN(in_channels, width, 3, stride)
        self.conv2 = ConvBN(width, width, 3, act=None)
        self.downsample = _projection(in_channels, width, stride)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        shortcut = self.downsample(x) if self.downsample else x
        return nn.op.relu(self.conv2(self.conv1(x)) + shortcut)


class Bottleneck(nn.Module):
    """torchvision's ResNet v1.5 bottleneck: the stride sits on the 3x3 convolution."""

    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int):
        self.conv1 = ConvBN(in_channels, width, 1)
        self.conv2 = ConvBN(width, width, 3, stride)
        self.conv3 = ConvBN(width, width * self.expansion, 1, act=None)
        self.downsample = _projection(in_channels, width * self.expansion, stride)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        shortcut = self.downsample(x) if self.downsample else x
        return nn.op.relu(self.conv3(self.conv2(self.conv1(x))) + shortcut)


def _projection(in_channels: int, out_channels: int, stride: int) -> ConvBN | None:
    """The 1x1 shortcut projection, needed only where the shape changes."""
    if stride == 1 and in_channels == out_channels:
        return None
    return ConvBN(in_channels, out_channels, 1, stride, act=None)


def resnet(block: type[BasicBlock | Bottleneck], blocks_per_stage: Sequence[int], classes: int) -> ImageClassifier:
    """torchvision's ResNet: 7x7/2 stem, 3x3/2 max pool, four stages of 64..512 widths, the later ones
    starting with stride 2."""
    layers: list[nn.Module] = [ConvBN(3, 64, 7, 2), Pool("max", 3, 2, 1)]
    channels = 64
    for stage, (blocks, width) in enumerate(zip(blocks_per_stage, (64, 128, 256, 512))):
        for index in range(blocks):
            layers.append(block(channels, width, 2 if stage > 0 and index == 0 else 1))
            channels = width * block.expansion
    return ImageClassifier(sequential(*layers), channels, classes)


@register("resnet18", "ResNet-18 (torchvision layout: basic blocks [2, 2, 2, 2])")
def resnet18(batch: int = 1, resolution: int = 224, classes: int = 1000):
    return resnet(BasicBlock, (2, 2, 2, 2), classes), image_inputs(batch, resolution, classes=classes)


@register("resnet50", "ResNet-50 (torchvision layout: bottlenecks [3, 4, 6, 3])")
def resnet50(batch: int = 1, resolution: int = 224, classes: int = 1000):
    return resnet(Bottleneck, (3, 4, 6, 3), classes), image_inputs(batch, resolution, classes=classes)


# ------------------------------------------------------------------------------------ MobileNetV2

# (expansion t, output channels c, repeats n, first stride s), from the MobileNetV2 paper's Table 2.
MOBILENET_V2_STAGES = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


class InvertedResidual(nn.Module):
    """Expand (1x1) -> depthwise 3x3 -> linear projection (1x1), with a residual when shapes allow."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, expansion: int):
        hidden = in_channels * expansion
        expand = [ConvBN(in_channels, hidden, 1, act=nn.op.relu6)] if expansion != 1 else []
        self.layers = sequential(
            *expand,
            ConvBN(hidden, hidden, 3, stride, groups=hidden, act=nn.op.relu6),
            ConvBN(hidden, out_channels, 1, act=None),
        )
        self.residual = stride == 1 and in_channels == out_channels

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return x + self.layers(x) if self.residual else self.layers(x)


@register("mobilenet_v2", "MobileNetV2 (torchvision layout, width 1.0): inverted residuals, depthwise convs, ReLU6")
def mobilenet_v2(batch: int = 1, resolution: int = 224, classes: int = 1000):
    inputs = image_inputs(batch, resolution, classes=classes)
    layers: list[nn.Module] = [ConvBN(3, 32, 3, 2, act=nn.op.relu6)]
    channels = 32
    for expansion, out_channels, repeats, stride in MOBILENET_V2_STAGES:
        for index in range(repeats):
            layers.append(InvertedResidual(channels, out_channels, stride if index == 0 else 1, expansion))
            channels = out_channels
    layers.append(ConvBN(channels, 1280, 1, act=nn.op.relu6))
    return ImageClassifier(sequential(*layers), 1280, classes), inputs


# ----------------------------------------------------------------------------------- Inception-v3
# Blocks as in torchvision's inception.py (its Mixed_5b ... Mixed_7c); auxiliary classifier left out,
# as it is at inference. Unpadded ("valid") 3x3 convolutions pass padding=0.


def inception_a(in_channels: int, pool_features: int) -> Parallel:
    return Parallel(
        [
            ConvBN(in_channels, 64, 1),
            sequential(ConvBN(in_channels, 48, 1), ConvBN(48, 64, 5)),
            sequential(ConvBN(in_channels, 64, 1), ConvBN(64, 96, 3), ConvBN(96, 96, 3)),
            sequential(Pool("avg", 3, 1, 1), ConvBN(in_channels, pool_features, 1)),
        ]
    )


def inception_b(in_channels: int) -> Parallel:
    return Parallel(
        [
            ConvBN(in_channels, 384, 3, 2, padding=0),
            sequential(ConvBN(in_channels, 64, 1), ConvBN(64, 96, 3), ConvBN(96, 96, 3, 2, padding=0)),
            Pool("max", 3, 2),
        ]
    )


def inception_c(in_channels: int, channels_7x7: int) -> Parallel:
    c7 = channels_7x7
    return Parallel(
        [
            ConvBN(in_channels, 192, 1),
            sequential(ConvBN(in_channels, c7, 1), ConvBN(c7, c7, (1, 7)), ConvBN(c7, 192, (7, 1))),
            sequential(
                ConvBN(in_channels, c7, 1),
                ConvBN(c7, c7, (7, 1)),
                ConvBN(c7, c7, (1, 7)),
                ConvBN(c7, c7, (7, 1)),
                ConvBN(c7, 192, (1, 7)),
            ),
            sequential(Pool("avg", 3, 1, 1), ConvBN(in_channels, 192, 1)),
        ]
    )


def inception_d(in_channels: int) -> Parallel:
    return Parallel(
        [
            sequential(ConvBN(in_channels, 192, 1), ConvBN(192, 320, 3, 2, padding=0)),
            sequential(
                ConvBN(in_channels, 192, 1),
                ConvBN(192, 192, (1, 7)),
                ConvBN(192, 192, (7, 1)),
                ConvBN(192, 192, 3, 2, padding=0),
            ),
            Pool("max", 3, 2),
        ]
    )


def inception_e(in_channels: int) -> Parallel:
    def split_1x3_3x1() -> Parallel:
        return Parallel([ConvBN(384, 384, (1, 3)), ConvBN(384, 384, (3, 1))])

    return Parallel(
        [
            ConvBN(in_channels, 320, 1),
            sequential(ConvBN(in_channels, 384, 1), split_1x3_3x1()),
            sequential(ConvBN(in_channels, 448, 1), ConvBN(448, 384, 3), split_1x3_3x1()),
            sequential(Pool("avg", 3, 1, 1), ConvBN(in_channels, 192, 1)),
        ]
    )


INCEPTION_V3_MIN_RESOLUTION = 75  # below it Mixed_7a's stride-2 convolution gets an empty input


@register("inception_v3", "Inception-v3 (torchvision layout, no auxiliary head): A/B/C/D/E blocks, 299x299")
def inception_v3(batch: int = 1, resolution: int = 299, classes: int = 1000):
    inputs = image_inputs(batch, resolution, classes=classes)
    if resolution < INCEPTION_V3_MIN_RESOLUTION:
        raise ValueError(f"inception_v3 needs resolution >= {INCEPTION_V3_MIN_RESOLUTION}, got {resolution}")
    features = sequential(
        ConvBN(3, 32, 3, 2, padding=0),
        ConvBN(32, 32, 3, padding=0),
        ConvBN(32, 64, 3),
        Pool("max", 3, 2),
        ConvBN(64, 80, 1),
        ConvBN(80, 192, 3, padding=0),
        Pool("max", 3, 2),
        inception_a(192, 32),
        inception_a(256, 64),
        inception_a(288, 64),
        inception_b(288),
        inception_c(768, 128),
        inception_c(768, 160),
        inception_c(768, 160),
        inception_c(768, 192),
        inception_d(768),
        inception_e(1280),
        inception_e(2048),
    )
    return ImageClassifier(features, 2048, classes), inputs
