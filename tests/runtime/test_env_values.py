"""torchfl's environment variables are read one way (kernels/envvars.py): a yes/no variable is
1/0, true/false, yes/no or on/off; a value that is none of these is an error naming the
variable and what it takes. Before, ``TORCHFL_STRICT=maybe`` silently meant strict and
``TORCHFL_COMPILE_HELPERS=abc`` silently meant 2 helpers."""
import pytest
import torch

from torchfl.kernels import envvars


@pytest.mark.parametrize("raw, want", [("", False), ("0", False), ("off", False), ("No", False),
                                       ("1", True), ("TRUE", True), (" yes ", True), ("on", True)])
def test_yes_no_values(monkeypatch, raw, want):
    monkeypatch.setenv("TORCHFL_STRICT", raw)
    assert envvars.flag("TORCHFL_STRICT") is want


def test_strict_maybe_is_an_error_at_the_call(monkeypatch):
    monkeypatch.setenv("TORCHFL_STRICT", "maybe")
    m = torch.nn.Linear(4, 3)
    c = torch.compile(m, backend="torchfl", options={"chip": "TFL-X1"})
    with pytest.raises(Exception, match=r"TORCHFL_STRICT='maybe' is not a yes/no value"):
        c(torch.randn(2, 4))


def test_compile_helpers_must_be_a_count(monkeypatch):
    from torchfl.kernels import precompile

    monkeypatch.setenv("TORCHFL_COMPILE_HELPERS", "abc")
    with pytest.raises(envvars.EnvError, match=r"TORCHFL_COMPILE_HELPERS='abc' is not a count"):
        precompile.count()
    monkeypatch.setenv("TORCHFL_COMPILE_HELPERS", "off")
    assert precompile.count() == 0
