"""Small models for tests, demos and benchmarks (the papers' large ones come from GluonCV)."""
from __future__ import annotations

from mxnet.gluon import nn


def lenet(classes: int = 10) -> nn.HybridSequential:
    """LeNet-5 style CNN for 28x28 grey images (about 96% on MNIST after one epoch)."""
    net = nn.HybridSequential()
    with net.name_scope():
        net.add(nn.Conv2D(20, kernel_size=5, activation="relu"),
                nn.MaxPool2D(pool_size=2, strides=2),
                nn.Conv2D(50, kernel_size=5, activation="relu"),
                nn.MaxPool2D(pool_size=2, strides=2),
                nn.Flatten(),
                nn.Dense(500, activation="relu"),
                nn.Dense(classes))
    return net


def alexnet_small(classes: int = 10) -> nn.HybridSequential:
    """The DSSP paper's downsized AlexNet (3 convolutions, 2 dense layers), scaled to 28x28.

    The dense layers hold most of the weights, as in the paper's model: that is
    what makes communication, and so the synchronisation model, matter.
    """
    net = nn.HybridSequential()
    with net.name_scope():
        net.add(nn.Conv2D(16, kernel_size=5, padding=2, activation="relu"),
                nn.MaxPool2D(pool_size=2, strides=2),          # 14x14
                nn.Conv2D(32, kernel_size=5, padding=2, activation="relu"),
                nn.MaxPool2D(pool_size=2, strides=2),          # 7x7
                nn.Conv2D(32, kernel_size=3, padding=1, activation="relu"),
                nn.MaxPool2D(pool_size=2, strides=2),          # 3x3
                nn.Flatten(),
                nn.Dense(256, activation="relu"),
                nn.Dense(classes))
    return net


def small_vgg(classes: int = 10) -> nn.HybridSequential:
    """The Adaptable Asynchrony dissertation's small VGG-like network (its section 4.1):
    normalisation, two 3x3 convolutions of 32 then two of 64 filters, each pair ending in a
    2x2 max pooling and dropout 0.1, a dense layer of 512, the output."""
    net = nn.HybridSequential()
    with net.name_scope():
        net.add(nn.BatchNorm(momentum=0.9),
                nn.Conv2D(32, kernel_size=3, padding=1, activation="relu"),
                nn.Conv2D(32, kernel_size=3, padding=1, activation="relu"),
                nn.MaxPool2D(pool_size=2), nn.Dropout(0.1),
                nn.Conv2D(64, kernel_size=3, padding=1, activation="relu"),
                nn.Conv2D(64, kernel_size=3, padding=1, activation="relu"),
                nn.MaxPool2D(pool_size=2), nn.Dropout(0.1),
                nn.Flatten(),
                nn.Dense(512, activation="relu"),
                nn.Dense(classes))
    return net


def cifar_resnet50_v1(classes: int = 10):
    """The DSSP paper's "ResNet-50" for CIFAR: MXNet's CIFAR ResNet with 50 layers (6n+2, n=8),
    which GluonCV builds but does not name in its model zoo."""
    from gluoncv.model_zoo.cifarresnet import get_cifar_resnet
    return get_cifar_resnet(1, 50, classes=classes)


MODELS = {"lenet": lenet, "alexnet_small": alexnet_small, "small_vgg": small_vgg,
          "cifar_resnet50_v1": cifar_resnet50_v1}


def forward_macs(net, input_shape) -> int:
    """Multiply-accumulates of one forward pass of ``net`` on one sample of ``input_shape``
    (C, H, W): the convolutions and dense layers, counted from the shapes they really see.
    ``kvstore_ext.devices`` turns these counts into emulated device times."""
    import mxnet as mx
    total = [0]

    def conv(block, inputs, output):
        kernel = block.weight.shape           # (out, in/groups, kh, kw)
        total[0] += output.size * kernel[1] * kernel[2] * kernel[3]

    def dense(block, inputs, output):
        total[0] += output.size * block.weight.shape[1]

    hooks = []

    def attach(block):
        if isinstance(block, nn.Conv2D):
            hooks.append(block.register_forward_hook(conv))
        elif isinstance(block, nn.Dense):
            hooks.append(block.register_forward_hook(dense))
        for child in block._children.values():
            attach(child)

    attach(net)
    try:
        net(mx.nd.zeros((1,) + tuple(input_shape)))
    finally:
        for h in hooks:
            h.detach()
    return total[0]
