"""What a kind of data can give, torch-free: the digits split's size, so the most samples one batch of it can hold.

The config checks read it at DAG build time (a batch larger than the data is a config error); amprepro.train.data,
which loads the data, splits the digits by the same numbers.
"""

from __future__ import annotations

DIGITS_SAMPLES = 1797  # len(sklearn.datasets.load_digits().target); tests/backbone/test_data.py checks it
DIGITS_TEST_FRACTION = 0.2


def digits_train_size() -> int:
    """Samples in the digits training split: the largest batch a digits model can be given."""
    return DIGITS_SAMPLES - int(DIGITS_SAMPLES * DIGITS_TEST_FRACTION)


def largest_batch(data: str) -> int | None:
    """The most samples one batch of this data can hold; None when any batch size can be generated."""
    return digits_train_size() if data == "digits" else None
