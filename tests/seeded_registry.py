"""A session-wide SQLite registry seeded with the bundled chips and rule packs, in a temporary
directory (never the user's), that every test of a folder plans against (its conftest imports
these two fixtures), Dynamo started afresh around each test."""
import pytest


@pytest.fixture(scope="session")
def registry_url(tmp_path_factory):
    from torchfl.registry import Registry

    path = tmp_path_factory.mktemp("runtime-registry") / "registry.db"
    url = f"sqlite:///{path}"
    Registry(url).init(seed=True)
    return url


@pytest.fixture(autouse=True)
def _registry_env(registry_url, monkeypatch):
    """Every test plans against the seeded temporary registry, and starts Dynamo afresh."""
    import torch

    monkeypatch.setenv("TORCHFL_REGISTRY_URL", registry_url)
    monkeypatch.delenv("TORCHFL_STRICT", raising=False)
    monkeypatch.delenv("TORCH_FL_DEBUG", raising=False)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
