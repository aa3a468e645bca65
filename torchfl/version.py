"""The package version, in a leaf module every layer may import (the package face,
``torchfl/__init__.py``, re-exports it; a layer importing the face would reach above itself)."""

__version__ = "0.1.0"
