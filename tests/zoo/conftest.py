"""Issue 48's zoo tests use the eager device's fixtures (tests/eager/conftest.py) and load its
adapter before any test, as tests/conftest.py does for tests/eager."""
import pytest

from tests.eager.conftest import _clean_env, fp16_dev, fp32_dev  # noqa: F401 - fixtures


@pytest.fixture(scope="session", autouse=True)
def _adapter():
    from torchfl.runtime import eager

    eager.register()
    eager.ensure_adapter()
