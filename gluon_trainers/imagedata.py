"""Image classification data for the papers' runs: CIFAR-10/100, ImageNet records, MNIST, synthetic.

Every source gives a worker its share of the training set as batches whose order
and augmentation depend only on ``(seed, epoch, rank)``, never on a running random
state: a run resumed from a checkpoint then sees exactly the batches that an
uninterrupted run would.  Test data is never augmented.  Nothing is downloaded
unless asked: missing files raise :class:`DataError`, whose message names every
path looked for and how to get the data.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .data import load_mnist, shard
from .evaluation import evaluate

#: per-channel mean and standard deviation of the RGB training images, in [0, 1]
CIFAR10_NORM = ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010))
CIFAR100_NORM = ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762))
IMAGENET_NORM = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
SYNTHETIC_NORM = ((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
CROP_PADDING = 4          # CIFAR: random 32x32 crops of the image padded by 4 pixels
IMAGENET_RESIZE = 0.875   # ImageNet test images: shorter side to size / 0.875, centre crop


class DataError(Exception):
    """Missing or unreadable data; the message says which files and how to get them."""


def epoch_rng(seed: int, epoch: int, rank: int) -> np.random.RandomState:
    """The random stream of one worker's epoch, a pure function of its three numbers."""
    return np.random.RandomState([seed % 2**32, epoch, rank])


# -- in-memory images (CIFAR, MNIST, synthetic) ------------------------------------------------
class ArrayImages:
    """Images held in memory and batched in numpy.

    ``x`` is uint8 NHWC (augmented and normalised per batch with ``norm``) or, with
    ``norm=None``, float32 NCHW already scaled (used as it is, e.g. MNIST).
    """

    def __init__(self, name: str, x_train, y_train, x_test, y_test, classes: int,
                 norm=None, augment: bool = True):
        self.name, self.classes = name, classes
        self.x_train, self.y_train = x_train, y_train.astype(np.float32)
        self.y_test = y_test.astype(np.float32)
        self.norm = norm
        self.augment = augment and norm is not None
        self.x_test = self._prepare(x_test)   # normalised once: evaluated every epoch

    @property
    def input_shape(self) -> tuple[int, ...]:
        """One image as the network sees it: (channels, height, width)."""
        return self.x_test.shape[1:]

    @property
    def num_train(self) -> int:
        return len(self.x_train)

    def subset(self, train_size: int | None, test_size: int | None) -> ArrayImages:
        """The first ``train_size`` training and ``test_size`` test images (None: all)."""
        for label, size, have in (("--train-size", train_size, len(self.x_train)),
                                  ("--test-size", test_size, len(self.x_test))):
            if size is not None and not 0 < size <= have:
                raise DataError(f"{label} {size}: {self.name} has {have} such images")
        self.x_train, self.y_train = self.x_train[:train_size], self.y_train[:train_size]
        self.x_test, self.y_test = self.x_test[:test_size], self.y_test[:test_size]
        return self

    def shard(self, rank: int, num_workers: int) -> None:
        """Keep worker ``rank``'s contiguous share of the training set."""
        self.x_train, self.y_train = shard(self.x_train, self.y_train, rank, num_workers)

    def steps_per_epoch(self, batch_size: int) -> int:
        return len(self.x_train) // batch_size

    def train_batches(self, epoch: int, batch_size: int, seed: int, rank: int):
        """This epoch's batches as (data, label) NDArrays: shuffled, augmented, normalised."""
        import mxnet as mx
        rng = epoch_rng(seed, epoch, rank)
        order = rng.permutation(len(self.x_train))
        for b in range(self.steps_per_epoch(batch_size)):
            idx = order[b * batch_size:(b + 1) * batch_size]
            images = self.x_train[idx]
            if self.augment:
                images = random_crop_flip(images, rng, CROP_PADDING)
            yield mx.nd.array(self._prepare(images)), mx.nd.array(self.y_train[idx])

    def test_accuracy(self, net, batch_size: int) -> float:
        return evaluate(net, self.x_test, self.y_test, batch_size)

    def _prepare(self, images: np.ndarray) -> np.ndarray:
        if self.norm is None:
            return images
        mean, std = (np.asarray(v, np.float32).reshape(1, 1, 1, 3) for v in self.norm)
        scaled = (images.astype(np.float32) / 255.0 - mean) / std
        return np.ascontiguousarray(scaled.transpose(0, 3, 1, 2))


def random_crop_flip(images: np.ndarray, rng: np.random.RandomState, pad: int) -> np.ndarray:
    """Random crops of the zero-padded NHWC images, half of them mirrored (the CIFAR recipe)."""
    n, h, w, _ = images.shape
    padded = np.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    tops, lefts = rng.randint(0, 2 * pad + 1, n), rng.randint(0, 2 * pad + 1, n)
    flips = rng.rand(n) < 0.5
    out = np.empty_like(images)
    for i in range(n):
        crop = padded[i, tops[i]:tops[i] + h, lefts[i]:lefts[i] + w]
        out[i] = crop[:, ::-1] if flips[i] else crop
    return out


# -- CIFAR ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CifarSpec:
    title: str
    gluon_class: str      # mx.gluon.data.vision.<this>
    files: tuple          # the binary files Gluon reads from its root folder
    archive_folder: str   # the folder the official archive unpacks to
    url: str
    classes: int
    norm: tuple


CIFAR = {
    "cifar10": CifarSpec("CIFAR-10", "CIFAR10",
                         tuple(f"data_batch_{i}.bin" for i in range(1, 6)) + ("test_batch.bin",),
                         "cifar-10-batches-bin",
                         "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz", 10, CIFAR10_NORM),
    "cifar100": CifarSpec("CIFAR-100", "CIFAR100", ("train.bin", "test.bin"), "cifar-100-binary",
                          "https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz", 100,
                          CIFAR100_NORM),
}


def default_data_dir(dataset: str) -> str:
    """Where Gluon and GluonCV keep a data set: ``$MXNET_HOME/datasets/<name>``."""
    home = os.environ.get("MXNET_HOME", os.path.join("~", ".mxnet"))
    return os.path.expanduser(os.path.join(home, "datasets", dataset))


def cifar_root(dataset: str, data_dir: str | None) -> str:
    """The folder holding the CIFAR binary files: ``data_dir`` itself (Gluon's layout) or the
    official archive's folder unpacked inside it; :class:`DataError` names every missing file."""
    spec = CIFAR[dataset]
    data_dir = os.path.abspath(os.path.expanduser(data_dir or default_data_dir(dataset)))
    candidates = [data_dir, os.path.join(data_dir, spec.archive_folder)]
    missing = []
    for root in candidates:
        absent = [os.path.join(root, f) for f in spec.files if not os.path.isfile(os.path.join(root, f))]
        if not absent:
            return root
        missing += absent
    archive = os.path.basename(spec.url)
    raise DataError(
        f"{spec.title} binary files not found. Looked for:\n  " + "\n  ".join(missing) + "\n"
        f"Download {spec.url} and unpack it into {data_dir} (tar xzf {archive} -C {data_dir}), "
        f"or point --data-dir at the folder that holds the files; on a machine with internet, "
        f"--download lets Gluon fetch them into --data-dir.")


def load_cifar(dataset: str, data_dir: str | None, download: bool = False) -> ArrayImages:
    """CIFAR-10 or CIFAR-100 (fine labels) through Gluon's dataset classes, uint8 in memory."""
    import mxnet as mx
    spec = CIFAR[dataset]
    if download:
        root = os.path.abspath(os.path.expanduser(data_dir or default_data_dir(dataset)))
    else:
        root = cifar_root(dataset, data_dir)   # Gluon would download whatever it does not find
    cls = getattr(mx.gluon.data.vision, spec.gluon_class)
    extra = {"fine_label": True} if dataset == "cifar100" else {}
    try:
        train, test = (cls(root=root, train=t, **extra) for t in (True, False))
        (x_train, y_train), (x_test, y_test) = train[:], test[:]
    except Exception as exc:  # noqa: BLE001  (a failed SHA-1 check makes Gluon try to download)
        raise DataError(f"{spec.title} files in {root} could not be read: {exc.__class__.__name__}: "
                        f"{exc} (Gluon checks each file's SHA-1 and downloads the archive "
                        f"again when one differs; get a fresh copy from {spec.url})") from None
    return ArrayImages(dataset, x_train.asnumpy(), y_train, x_test.asnumpy(), y_test,
                       spec.classes, norm=spec.norm)


# -- MNIST and synthetic -------------------------------------------------------------------------
def load_mnist_images(path: str | None, train_size: int | None, test_size: int | None) -> ArrayImages:
    """The project's MNIST digits (1x28x28 in [0, 1], no augmentation)."""
    try:
        x_train, y_train, x_test, y_test = load_mnist(path, train_size or 8000, test_size or 2000)
    except (FileNotFoundError, ValueError) as exc:
        raise DataError(str(exc)) from None
    return ArrayImages("mnist", x_train, y_train, x_test, y_test, 10, norm=None)


def synthetic(train_size: int, test_size: int, image_size: int, classes: int,
              seed: int) -> ArrayImages:
    """Generated RGB images, deterministic by ``seed``: each class is a coarse colour pattern
    plus noise, so a network can learn it; the same pipeline as CIFAR from there on."""
    rng = np.random.RandomState(seed)
    grid = 4
    cell = -(-image_size // grid)
    patterns = rng.randint(0, 256, size=(classes, grid, grid, 3)).astype(np.float32)
    patterns = patterns.repeat(cell, axis=1).repeat(cell, axis=2)[:, :image_size, :image_size]

    def draw(n):
        labels = rng.randint(0, classes, n)
        images = np.empty((n, image_size, image_size, 3), np.uint8)
        for start in range(0, n, 256):   # bounded memory for large images
            part = labels[start:start + 256]
            noise = rng.normal(0.0, 48.0, size=(len(part), image_size, image_size, 3))
            images[start:start + 256] = np.clip(patterns[part] + noise, 0, 255)
        return images, labels

    x_train, y_train = draw(train_size)
    x_test, y_test = draw(test_size)
    return ArrayImages("synthetic", x_train, y_train, x_test, y_test, classes,
                       norm=SYNTHETIC_NORM)


# -- ImageNet record files -----------------------------------------------------------------------
IMAGENET_FILES = ("train.rec", "train.idx", "val.rec", "val.idx")


def imagenet_paths(data_dir: str | None, rec_train=None, rec_train_idx=None, rec_val=None,
                   rec_val_idx=None) -> dict:
    """The four record files (given ones win over ``data_dir``); :class:`DataError` if missing."""
    where = os.path.abspath(os.path.expanduser(data_dir or default_data_dir("imagenet")))
    given = dict(zip(IMAGENET_FILES, (rec_train, rec_train_idx, rec_val, rec_val_idx)))
    paths = {name: os.path.abspath(os.path.expanduser(given[name] or os.path.join(where, name)))
             for name in IMAGENET_FILES}
    missing = [p for p in paths.values() if not os.path.isfile(p)]
    if missing:
        raise DataError(
            "ImageNet record files not found. Looked for:\n  " + "\n  ".join(missing) + "\n"
            "ImageNet cannot be downloaded automatically: get ILSVRC2012 from image-net.org and "
            "pack it with MXNet's tools/im2rec.py (or GluonCV's scripts/datasets/imagenet.py), "
            "then give --data-dir or --rec-train/--rec-train-idx/--rec-val/--rec-val-idx.")
    return paths


class RecordImages:
    """ImageNet from MXNet record files through ``mx.io.ImageRecordIter`` (GluonCV's recipe:
    random resized crop, mirror and colour jitter for training; resize and centre crop for test).

    Order and augmentation are seeded per (seed, epoch, rank); with several decoding threads the
    augmentation is not bit-for-bit repeatable, the order is.
    """

    def __init__(self, paths: dict, image_size: int = 224, classes: int = 1000, threads: int = 2):
        self.paths, self.image_size, self.classes, self.threads = paths, image_size, classes, threads
        self.rank, self.num_workers = 0, 1
        self.num_train = count_records(paths["train.idx"])
        self.name = "imagenet"

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (3, self.image_size, self.image_size)

    def subset(self, train_size: int | None, test_size: int | None) -> RecordImages:
        if test_size is not None:
            raise DataError("--test-size does not apply to ImageNet: the whole val.rec is used")
        if train_size is not None:
            self.num_train = min(self.num_train, train_size)
        return self

    def shard(self, rank: int, num_workers: int) -> None:
        self.rank, self.num_workers = rank, num_workers

    def steps_per_epoch(self, batch_size: int) -> int:
        return self.num_train // self.num_workers // batch_size

    def _normalisation(self) -> dict:
        mean, std = IMAGENET_NORM
        return {f"{k}_{c}": v * 255 for k, values in (("mean", mean), ("std", std))
                for c, v in zip("rgb", values)}

    def train_batches(self, epoch: int, batch_size: int, seed: int, rank: int):
        import mxnet as mx
        it = mx.io.ImageRecordIter(
            path_imgrec=self.paths["train.rec"], path_imgidx=self.paths["train.idx"],
            preprocess_threads=self.threads, shuffle=True, batch_size=batch_size,
            data_shape=self.input_shape, rand_mirror=True, random_resized_crop=True,
            max_aspect_ratio=4.0 / 3.0, min_aspect_ratio=3.0 / 4.0, max_random_area=1.0,
            min_random_area=0.08, brightness=0.4, saturation=0.4, contrast=0.4, pca_noise=0.1,
            num_parts=self.num_workers, part_index=self.rank,
            seed=int(epoch_rng(seed, epoch, rank).randint(2**31)), **self._normalisation())
        for _, batch in zip(range(self.steps_per_epoch(batch_size)), it):
            # the iterator hands out pinned memory; the network's weights live on the CPU
            yield batch.data[0].as_in_context(mx.cpu()), batch.label[0].as_in_context(mx.cpu())

    def test_accuracy(self, net, batch_size: int) -> float:
        import mxnet as mx
        it = mx.io.ImageRecordIter(
            path_imgrec=self.paths["val.rec"], path_imgidx=self.paths["val.idx"],
            preprocess_threads=self.threads, shuffle=False, batch_size=batch_size,
            resize=round(self.image_size / IMAGENET_RESIZE), data_shape=self.input_shape,
            **self._normalisation())   # the last batch is filled from the start: batch.pad
        correct = total = 0
        for batch in it:
            keep = batch_size - batch.pad
            predicted = net(batch.data[0].as_in_context(mx.cpu())).argmax(axis=1).asnumpy()[:keep]
            correct += int((predicted == batch.label[0].asnumpy()[:keep]).sum())
            total += keep
        return correct / max(total, 1)


def count_records(idx_path: str) -> int:
    """Records in an MXNet .idx file (one line each)."""
    with open(idx_path, "rb") as f:
        return sum(1 for line in f if line.strip())
