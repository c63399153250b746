"""Randomly wired networks (Xie et al. 2019), small regime: wide, irregular DAGs of small kernels,
the placement problem that regular chains like ResNet do not pose.

Layout (the paper's Table 1, small regime, at 224x224): conv1 3x3/2 with C/2 channels (112), conv2 3x3/2
with C (56), then ``stages`` random-wired stages of C, 2C, 4C, ... channels, each halving the
resolution in its input node (28, 14, 7), then a 1x1 conv to 1280, global average pool and fc.
"""

from __future__ import annotations

from tvm.relax.frontend import nn

from .cnn import ConvBN, ImageClassifier, image_inputs, sequential
from .randwire_graph import StageGraph, stage_graph
from .registry import register

HEAD_CHANNELS = 1280


class RandomWiredNode(nn.Module):
    """Weighted sum of the inputs (sigmoid of a learnable weight per input edge, keeping the weights
    positive as in the paper) -> ReLU -> separable conv (3x3 depthwise, 1x1 pointwise) -> BN.
    A node with one input skips the sum: a positive scale before ReLU-conv-BN is absorbed by them."""

    def __init__(self, fan_in: int, in_channels: int, out_channels: int, stride: int):
        self.edge_logits = nn.Parameter((fan_in,)) if fan_in > 1 else None
        self.depthwise = nn.Conv2D(in_channels, in_channels, 3, stride, 1, groups=in_channels, bias=False)
        self.pointwise = ConvBN(in_channels, out_channels, 1, act=None)

    def forward(self, inputs: list[nn.Tensor]) -> nn.Tensor:
        x = inputs[0]
        if self.edge_logits is not None:
            gates = nn.op.split(nn.op.sigmoid(self.edge_logits), len(inputs))
            weighted = [gate.reshape(1, 1, 1, 1) * tensor for gate, tensor in zip(gates, inputs)]
            x = sum(weighted[1:], weighted[0])
        return self.pointwise(self.depthwise(nn.op.relu(x)))


class RandomWiredStage(nn.Module):
    """One stage DAG: its input node is a stride-2 node that changes the channel count; its output
    node is the plain average of the graph's sinks (no convolution, as in the paper)."""

    def __init__(self, graph: StageGraph, in_channels: int, channels: int):
        self.graph = graph
        self.nodes = nn.ModuleList(
            [RandomWiredNode(1, in_channels, channels, stride=2)]
            + [RandomWiredNode(len(graph.predecessors[v]), channels, channels, stride=1) for v in graph.nodes[1:-1]]
        )

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        outputs = {self.graph.input_node: self.nodes[0]([x])}
        for v in self.graph.nodes[1:-1]:
            outputs[v] = self.nodes[v]([outputs[u] for u in self.graph.predecessors[v]])
        sinks = [outputs[u] for u in self.graph.predecessors[self.graph.output_node]]
        return sum(sinks[1:], sinks[0]) * (1.0 / len(sinks)) if len(sinks) > 1 else sinks[0]


def randwire(generator: str, nodes: int, seed: int, channels: int, stages: int, classes: int) -> ImageClassifier:
    """Stage ``i`` draws its graph with seed ``seed + i``; channels double from the second stage on."""
    if channels < 2:
        raise ValueError(f"channels must be at least 2 (the stem's first conv has channels / 2), got {channels}")
    layers: list[nn.Module] = [ConvBN(3, channels // 2, 3, 2), ConvBN(channels // 2, channels, 3, 2, act=None)]
    in_channels = channels
    for stage in range(stages):
        out_channels = channels * 2**stage
        layers.append(RandomWiredStage(stage_graph(generator, nodes, seed + stage), in_channels, out_channels))
        in_channels = out_channels
    layers += [nn.ReLU(), ConvBN(in_channels, HEAD_CHANNELS, 1)]
    return ImageClassifier(sequential(*layers), HEAD_CHANNELS, classes)


def _builder(generator: str):
    def build(
        nodes: int = 32,
        seed: int = 0,
        channels: int = 78,
        stages: int = 3,
        resolution: int = 224,
        batch: int = 1,
        classes: int = 1000,
    ):
        inputs = image_inputs(batch, resolution, nodes=nodes, channels=channels, stages=stages, classes=classes)
        return randwire(generator, nodes, seed, channels, stages, classes), inputs

    return build


randwire_ws = register("randwire_ws", "Randomly wired network, Watts-Strogatz graphs WS(N, k=4, p=0.75) per stage")(
    _builder("ws")
)
randwire_er = register("randwire_er", "Randomly wired network, Erdos-Renyi graphs ER(N, p=0.2) per stage")(
    _builder("er")
)
randwire_ba = register("randwire_ba", "Randomly wired network, Barabasi-Albert graphs BA(N, m=5) per stage")(
    _builder("ba")
)
