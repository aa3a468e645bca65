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
