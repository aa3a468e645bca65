"""The ``torchfl`` command: a thin face over the layers' Python APIs."""
