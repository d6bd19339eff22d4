"""Loaded into each run of benchmarks/real_corpus.py --run (as sitecustomize,
through PYTHONPATH): the same seed for the original and its copies, data sets
that torchvision would download replaced by small generated ones of the same
shape (no network here), and a cap of CORPUS_STEP_CAP optimizer steps, after
which the run writes "STEPS CHECKSUM" (the sum of every stepped parameter) to
CORPUS_REPORT and ends.

Nothing here changes what a script computes between two optimizer steps: the
original and the migrated copy are watched alike.
"""

import atexit
import importlib.abc
import os
import sys

CAP = int(os.environ.get("CORPUS_STEP_CAP", "0"))
REPORT = os.environ.get("CORPUS_REPORT", "")
# image data sets torchvision downloads: name -> (channels, side, classes)
IMAGE_SETS = {
    "MNIST": (1, 28, 10), "FashionMNIST": (1, 28, 10), "KMNIST": (1, 28, 10), "EMNIST": (1, 28, 26),
    "CIFAR10": (3, 32, 10), "CIFAR100": (3, 32, 100), "SVHN": (3, 32, 10), "STL10": (3, 96, 10),
}
GENERATED_ITEMS = 64
_TORCHVISION_OPS = None  # kept alive: the library's definitions last as long as it


def _generated(name, channels, side, classes):
    """A stand-in for torchvision.datasets.NAME: GENERATED_ITEMS random images
    of the real one's shape and kind, with the attributes scripts read
    (`data`, `targets`, `classes`, and the old `train_data`/`train_labels`),
    taking (and ignoring) its other arguments."""
    import numpy
    import torch
    from PIL import Image

    class Generated(torch.utils.data.Dataset):
        def __init__(self, root=None, train=True, transform=None, target_transform=None, download=False, **_):
            draws = torch.Generator().manual_seed(0 if train else 1)
            shape = (GENERATED_ITEMS, side, side) if channels == 1 else (GENERATED_ITEMS, side, side, channels)
            images = torch.randint(0, 256, shape, generator=draws, dtype=torch.uint8)
            labels = torch.randint(0, classes, (GENERATED_ITEMS,), generator=draws)
            # as torchvision keeps them: MNIST-like sets as tensors, the others as numpy and lists
            self.data, self.targets = (images, labels) if channels == 1 else (images.numpy(), labels.tolist())
            self.train_data = self.test_data = self.data
            self.train_labels = self.test_labels = self.labels = self.targets
            self.classes = [str(c) for c in range(classes)]
            self.transform, self.target_transform = transform, target_transform

        def __len__(self):
            return GENERATED_ITEMS

        def __getitem__(self, index):
            image = Image.fromarray(numpy.asarray(self.data[index]), mode="L" if channels == 1 else "RGB")
            target = int(self.targets[index])
            if self.transform is not None:
                image = self.transform(image)
            if self.target_transform is not None:
                target = self.target_transform(target)
            return image, target

    Generated.__name__ = name
    return Generated


class _PatchTorchvisionDatasets(importlib.abc.MetaPathFinder):
    """Swap the downloading data sets once torchvision.datasets is imported."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "torchvision.datasets":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module):
            original_exec(module)
            for name, shape in IMAGE_SETS.items():
                if hasattr(module, name):
                    setattr(module, name, _generated(name, *shape))

        loader.exec_module = exec_module
        return spec


def _torchvision_without_its_kernels():
    """torchvision's wheel for another torch build (a CUDA one beside a CPU
    torch) cannot load its kernels, and its import then stops at two fake
    registrations for ops that do not exist. Declaring them lets the pure
    Python parts (data sets, transforms, models) import; nms still has no kernel."""
    global _TORCHVISION_OPS
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.origin:
        return
    import torch

    kernels = os.path.join(os.path.dirname(spec.origin), "_C.so")
    try:
        torch.ops.load_library(kernels)
        return
    except (OSError, RuntimeError):
        pass
    _TORCHVISION_OPS = torch.library.Library("torchvision", "DEF")
    for op in ("nms", "qnms"):
        _TORCHVISION_OPS.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def _watch_steps():
    import random

    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    random.seed(0)
    torch.manual_seed(0)
    try:
        import numpy

        numpy.random.seed(0)
    except ImportError:
        pass
    optimizers, steps = {}, [0]

    def report():
        parameters = [p for o in optimizers.values() for g in o.param_groups for p in g["params"]]
        checksum = sum(float(p.detach().double().sum()) for p in parameters)
        with open(REPORT, "w") as handle:
            handle.write(f"{steps[0]} {checksum!r}\n")

    def after_step(optimizer, *_):
        optimizers.setdefault(id(optimizer), optimizer)
        steps[0] += 1
        if steps[0] >= CAP:
            report()
            sys.stdout.flush()
            os._exit(0)

    register_optimizer_step_post_hook(after_step)
    atexit.register(report)  # a script that ends before the cap


if CAP and REPORT:
    import importlib.util

    _torchvision_without_its_kernels()
    if os.environ.get("CORPUS_DATA", "").startswith("torchvision:"):
        sys.meta_path.insert(0, _PatchTorchvisionDatasets())
    _watch_steps()
