"""Real labelled images for users who have them: data: cifar10 or data: imagefolder, at model_config data_path.

- cifar10: the "CIFAR-10 python version" directory as its authors ship it (``<data_path>/cifar-10-batches-py/`` with
  data_batch_1..5 and test_batch, each a pickle of {b"data": uint8 N x 3072, b"labels": [...]}), read here directly.
  Where it is missing and ``download: true`` is set, torchvision's checksummed download fetches it (its md5 is
  checked by torchvision); without network or torchvision the cell is skipped, with the reason. Each file's md5 is
  recorded, and whether it is the one torchvision lists for the official release.
- imagefolder: ``<data_path>/train/<class>/*.png|jpg`` and ``<data_path>/val/<class>/...`` (torchvision's ImageFolder
  layout), read with Pillow and resized to image_size; the class list is the sorted train/ subdirectories.

The whole dataset is held in memory: this is for small datasets (CIFAR-10 is 180 MB as uint8). torch is imported where
it is used: amprepro.config reads this module at DAG build time.
"""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path

from amprepro.modelsettings import ModelSettings

KINDS = ("cifar10", "imagefolder")
CIFAR_DIR = "cifar-10-batches-py"
CIFAR_TRAIN = [f"data_batch_{i}" for i in range(1, 6)]
CIFAR_TEST = ["test_batch"]
# torchvision.datasets.CIFAR10's md5s of the official files (torchvision 0.28), so a record says whether the files
# read are the official release without torchvision being importable.
CIFAR_MD5 = {"data_batch_1": "c99cafc152244af753f735de768cd75f", "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
             "data_batch_3": "54ebc095f3ab1f0389bbae665268c751", "data_batch_4": "634d18415352ddfa80567beed471001a",
             "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb", "test_batch": "40351d587109b95175f43aff81a1287e"}
CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")


def unavailable_reason(settings: ModelSettings | dict) -> str | None:
    """Why this image data cannot be read here (with the fix); None when it can (or is not image data)."""
    settings = ModelSettings.of(settings)
    kind = settings.data
    if kind not in KINDS:
        return None
    path = settings.data_path
    if not path:
        return f"data: {kind} needs data_path (the dataset's directory). Fix: set runs.models.<model>.data_path"
    root = Path(path)
    if kind == "cifar10":
        missing = [name for name in CIFAR_TRAIN + CIFAR_TEST if not (root / CIFAR_DIR / name).is_file()]
        if not missing:
            return None
        if settings.download:
            return download_cifar(root)
        return (f"CIFAR-10 is not at {root / CIFAR_DIR} (missing {', '.join(missing)}); set download: true where the "
                "machine has network (torchvision's checksummed download), or put the python-version files there")
    for split in ("train", "val"):
        if not classes_in(root / split):
            return (f"imagefolder {root} has no {split}/<class>/ directories with images. Fix: lay it out as "
                    f"{root}/train/<class>/*.png and {root}/val/<class>/*.png")
    if classes_in(root / "val") != classes_in(root / "train"):
        return f"imagefolder {root}: val/ and train/ have different classes. Fix: give both the same class folders"
    return None


def download_cifar(root: Path) -> str | None:
    """torchvision's download (md5-checked); the reason it could not, or None."""
    try:
        from torchvision.datasets import CIFAR10
        from torchvision.datasets.utils import download_and_extract_archive
    except Exception as exc:  # ImportError, or a torchvision built for another torch
        return (f"CIFAR-10 is not at {root / CIFAR_DIR} and torchvision, which would download it, is not importable "
                f"({exc})")
    try:
        download_and_extract_archive(CIFAR10.url, str(root), filename=CIFAR10.filename, md5=CIFAR10.tgz_md5)
    except Exception as exc:  # no network, a proxy, a checksum mismatch
        return f"CIFAR-10 is not at {root / CIFAR_DIR} and its download failed ({type(exc).__name__}: {exc})"
    return None


def classes_in(directory: Path) -> list[str]:
    if not directory.is_dir():
        return []
    return sorted(d.name for d in directory.iterdir()
                  if d.is_dir() and any(f.suffix.lower() in IMAGE_SUFFIXES for f in d.iterdir()))


def num_classes(settings: ModelSettings) -> int:
    if settings.data == "cifar10":
        return 10
    return len(classes_in(Path(settings.data_path) / "train"))


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes(), usedforsecurity=False).hexdigest()


def read_cifar(root: Path):
    """((train x, y), (test x, y), record): float images (N, 3, 32, 32) normalised with CIFAR-10's channel stats."""
    import numpy as np
    import torch

    def load(names):
        xs, ys = [], []
        for name in names:
            with open(root / CIFAR_DIR / name, "rb") as handle:
                batch = pickle.load(handle, encoding="bytes")  # the format CIFAR-10's authors ship
            xs.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
            ys.extend(batch[b"labels"])
        x = torch.from_numpy(np.concatenate(xs)).float() / 255.0
        mean, std = torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1), torch.tensor(CIFAR_STD).view(1, 3, 1, 1)
        return (x - mean) / std, torch.tensor(ys, dtype=torch.long)

    md5 = {name: _md5(root / CIFAR_DIR / name) for name in CIFAR_TRAIN + CIFAR_TEST}
    record = {"kind": "cifar10", "root": str(root), "md5": md5,
              "official_release": all(md5[name] == CIFAR_MD5[name] for name in md5)}
    train, test = load(CIFAR_TRAIN), load(CIFAR_TEST)
    record.update(train_images=len(train[1]), test_images=len(test[1]))
    return train, test, record


def read_imagefolder(root: Path, image_size: int):
    import numpy as np
    import torch
    from PIL import Image

    classes = classes_in(root / "train")
    manifest = hashlib.sha256()

    def load(split):
        xs, ys = [], []
        for label, name in enumerate(classes):
            for path in sorted((root / split / name).iterdir()):
                if path.suffix.lower() not in IMAGE_SUFFIXES:
                    continue
                manifest.update(f"{split}/{name}/{path.name}\t{hashlib.sha256(path.read_bytes()).hexdigest()}\n"
                                .encode())
                with Image.open(path) as image:
                    pixels = np.asarray(image.convert("RGB").resize((image_size, image_size)), dtype=np.uint8)
                xs.append(torch.from_numpy(pixels.copy()).permute(2, 0, 1))
                ys.append(label)
        return torch.stack(xs).float() / 255.0, torch.tensor(ys, dtype=torch.long)

    train, test = load("train"), load("val")
    record = {"kind": "imagefolder", "root": str(root), "classes": classes, "train_images": len(train[1]),
              "test_images": len(test[1]), "image_size": image_size, "files_sha256": manifest.hexdigest()}
    return train, test, record


class ImageBatches:
    """Shuffled mini-batches of a labelled training split held in memory, reproducible from the seed."""

    def __init__(self, train, test, record: dict, batch_size: int, seed: int, device):
        import torch

        (self.x, self.y), (test_x, test_y) = train, test
        if batch_size > len(self.y):
            raise ValueError(f"batch_size {batch_size} is larger than the training split ({len(self.y)} images)")
        self.x, self.y = self.x.to(device), self.y.to(device)
        self.test_x, self.test_y = test_x.to(device), test_y.to(device)
        self.batch_size, self.record = batch_size, record
        self.generator = torch.Generator().manual_seed(seed)
        self.order, self.cursor = torch.randperm(len(self.y), generator=self.generator), 0

    def next(self):
        import torch

        if self.cursor + self.batch_size > len(self.order):
            self.order, self.cursor = torch.randperm(len(self.y), generator=self.generator), 0
        index = self.order[self.cursor:self.cursor + self.batch_size].to(self.x.device)
        self.cursor += self.batch_size
        return self.x[index], self.y[index]

    def test_set(self):
        return self.test_x, self.test_y


def batches(settings: ModelSettings, seed: int, device) -> ImageBatches:
    root = Path(settings.data_path)
    if settings.data == "cifar10":
        train, test, record = read_cifar(root)
    else:
        train, test, record = read_imagefolder(root, settings.folder_image_size)
    return ImageBatches(train, test, record, settings.batch_size, seed, device)
