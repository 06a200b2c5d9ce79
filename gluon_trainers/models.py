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


MODELS = {"lenet": lenet}
