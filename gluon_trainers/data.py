"""The MNIST digits that ship with the project, split per worker."""
from __future__ import annotations

import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MNIST = os.path.join(HERE, "..", "data", "mnist10k.npz")
MNIST_ENV = "KVX_MNIST"


def mnist_path(path: str | None = None) -> str:
    """``path``, else ``$KVX_MNIST``, else the copy in the repository's data/ folder."""
    path = path or os.environ.get(MNIST_ENV) or DEFAULT_MNIST
    if not os.path.exists(path):
        raise FileNotFoundError(f"MNIST file not found: {path} (give --data PATH or set {MNIST_ENV})")
    return path


def load_mnist(path: str | None = None, train_size: int = 8000, test_size: int = 2000):
    """``(x_train, y_train, x_test, y_test)``: float32 NCHW images in [0, 1], float32 labels."""
    with np.load(mnist_path(path)) as f:
        images, labels = f["images"], f["labels"]
    if train_size + test_size > len(images):
        raise ValueError(f"asked for {train_size} + {test_size} digits, the file holds {len(images)}")
    x = images.astype(np.float32)[:, None, :, :] / 255.0
    y = labels.astype(np.float32)
    return (x[:train_size], y[:train_size],
            x[len(x) - test_size:], y[len(y) - test_size:])


def shard(x: np.ndarray, y: np.ndarray, rank: int, num_workers: int):
    """Worker ``rank``'s contiguous share of the training set (equal sizes, the rest dropped)."""
    per = len(x) // num_workers
    return x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
