import os

os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", "..", ".cache", "numba"))

import numpy as np
import pytest

from torchfl.kernels import ChipModel, DeviceMemory, DeviceTensor


@pytest.fixture
def chip():
    return ChipModel()


@pytest.fixture
def mem(chip):
    return DeviceMemory(chip)


@pytest.fixture
def rng():
    return np.random.default_rng(0)
