"""Runtime tests: a real SQLite registry seeded with the bundled chips and rule packs, in a
temporary directory (never the user's), real torch graphs, real Numba kernels."""
from tests.seeded_registry import _registry_env, registry_url  # noqa: F401 (fixtures)
