"""The digits data the cells train on: scikit-learn's, read without importing scikit-learn."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from amprepro import datakinds
from amprepro.train import data

REPO = Path(__file__).resolve().parents[2]


def test_the_digits_are_load_digits_own_arrays():
    from sklearn.datasets import load_digits

    images, labels = data.digits_arrays()
    digits = load_digits()
    assert images.dtype == digits.images.dtype and \
        images.shape == digits.images.shape == (datakinds.DIGITS_SAMPLES, 8, 8)
    assert np.array_equal(images, digits.images) and np.array_equal(labels, digits.target)
    assert labels.dtype.kind == digits.target.dtype.kind == "i"


def test_a_cell_reads_the_digits_without_importing_scikit_learn():
    probe = ("import sys; from amprepro.train import data; (x, y), (tx, ty) = data.digits_split(); "
             "print(len(y), len(ty), sorted(m for m in sys.modules if m.split('.')[0] in ('sklearn', 'scipy')))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(REPO / "workflow")})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [str(datakinds.digits_train_size()),
                                   str(datakinds.DIGITS_SAMPLES - datakinds.digits_train_size()), "[]"]
