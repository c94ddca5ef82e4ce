"""Data for the runs: scikit-learn's digits (real, labelled, ships inside the package) and synthetic tensors.

torch is imported where it is used. The split's sizes are amprepro.datakinds' (the config checks read them at DAG
build time).
"""

from __future__ import annotations

from pathlib import Path

from amprepro.datakinds import DIGITS_TEST_FRACTION

DIGITS_CLASSES = 10


def digits_arrays():
    """scikit-learn's digits as `load_digits()` gives them, (images (N, 8, 8) float64 in 0..16, labels): read from the
    file inside the installed package, as load_digits reads it, without importing scikit-learn (which imports SciPy:
    about 3.5 s of CPU at every cell's start). Where the file is not there, load_digits itself."""
    import gzip
    import importlib.util

    import numpy as np

    spec = importlib.util.find_spec("sklearn")  # finds the package; runs none of it
    if spec is None:
        raise ModuleNotFoundError("the digits data comes from scikit-learn, which is not installed here: "
                                  "pip install -r requirements.txt")
    folder = next(iter(spec.submodule_search_locations or []), None)
    packaged = Path(folder, "datasets", "data", "digits.csv.gz") if folder else None
    if packaged and packaged.is_file():
        with gzip.open(packaged, "rt", encoding="utf-8") as rows:
            data = np.loadtxt(rows, delimiter=",")
        return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)
    from sklearn.datasets import load_digits

    digits = load_digits()
    return digits.images, digits.target


def digits_split(seed: int = 0, test_fraction: float = DIGITS_TEST_FRACTION):
    """Digits as (N, 1, 8, 8) float images in [0, 1] and labels; a fixed split so all cells see the same data."""
    import torch

    images, targets = digits_arrays()
    images = torch.tensor(images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(targets, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    n_test = int(len(labels) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return (images[train], labels[train]), (images[test], labels[test])


class DigitsBatches:
    """Endless shuffled mini-batches of the digits training split, reproducible from the seed."""

    def __init__(self, batch_size: int, seed: int, device):
        import torch

        (self.x, self.y), (self.test_x, self.test_y) = digits_split()
        if batch_size > len(self.y):
            raise ValueError(f"batch_size {batch_size} is larger than the digits training split ({len(self.y)})")
        self.x, self.y = self.x.to(device), self.y.to(device)
        self.test_x, self.test_y = self.test_x.to(device), self.test_y.to(device)
        self.batch_size = batch_size
        self.generator = torch.Generator().manual_seed(seed)
        self.order, self.cursor = self._shuffle(), 0

    def _shuffle(self):
        import torch

        return torch.randperm(len(self.y), generator=self.generator)

    def next(self):
        if self.cursor + self.batch_size > len(self.order):
            self.order, self.cursor = self._shuffle(), 0
        index = self.order[self.cursor : self.cursor + self.batch_size].to(self.x.device)
        self.cursor += self.batch_size
        return self.x[index], self.y[index]

    def test_set(self):
        return self.test_x, self.test_y


def generator_on(seed: int, device, on_device: bool):
    """Where the synthetic values are drawn: on the CPU (the same values on every machine: the cells), or on the device
    itself (the largest-batch search's tries, where only the shape matters and drawing hundreds of images on the CPU
    would cost more than the try's step)."""
    import torch

    where = torch.device(device) if on_device else torch.device("cpu")
    return torch.Generator(device=where).manual_seed(seed), where


class SyntheticImages:
    """One fixed random batch reused every step: measures the model, not a data loader."""

    num_classes = 1000

    def __init__(self, batch_size: int, image_size: int, seed: int, device, on_device: bool = False):
        import torch

        generator, where = generator_on(seed, device, on_device)
        self.x = torch.randn(batch_size, 3, image_size, image_size, generator=generator, device=where).to(device)
        self.y = torch.randint(0, self.num_classes, (batch_size,), generator=generator, device=where).to(device)

    def to(self, device) -> SyntheticImages:
        """The same batch on `device`: a cell drew it on the CPU before its GPU was free (amprepro.train.train.stage);
        its own generator, so when it is drawn changes nothing."""
        self.x, self.y = self.x.to(device), self.y.to(device)
        return self

    def next(self):
        return self.x, self.y

    def test_set(self):
        return None


class SyntheticTokens:
    """Random token ids; the target is the next token (language-model shape, no meaning)."""

    def __init__(self, batch_size: int, seq_len: int, vocab_size: int, seed: int, device, on_device: bool = False):
        import torch

        generator, where = generator_on(seed, device, on_device)
        tokens = torch.randint(0, vocab_size, (batch_size, seq_len + 1), generator=generator, device=where).to(device)
        self.x, self.y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def next(self):
        return self.x, self.y

    def test_set(self):
        return None
