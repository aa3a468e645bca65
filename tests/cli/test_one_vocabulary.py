"""Facts every command shares are stated once: the CLI's options take them from there."""
import click

from torchfl.cli.main import cli
from torchfl.hcd.dtypes import PRECISION_CHOICES, PRECISIONS


def _commands(group, path=()):
    for name, command in group.commands.items():
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))


def test_every_precision_option_takes_the_same_choices():
    """``plan explain``, ``plan memory|compare|...`` once disagreed (one lacked float32)."""
    seen = {}
    for path, command in _commands(cli):
        for param in command.params:
            if "--precision" in getattr(param, "opts", ()):
                seen[" ".join(path)] = tuple(param.type.choices)
    assert len(seen) >= 4, seen            # plan explain and the what-if commands at least
    assert {k: v for k, v in seen.items() if v != PRECISION_CHOICES} == {}
    assert PRECISION_CHOICES == ("auto", *PRECISIONS, "none")


def test_the_planner_refuses_what_the_cli_does_not_offer():
    """The planner's check and the CLI's choices are one list: a policy outside it is refused
    with the list in the message."""
    import pytest

    from torchfl.hcd import load_hcd
    from torchfl.planner.constraints import check_precision
    from torchfl.planner.errors import ChoiceError
    from torchfl.resources import bundled_path

    hcd = load_hcd(next(bundled_path("hcd_registry").glob("*.hcd")))
    with pytest.raises(ChoiceError, match=", ".join(PRECISIONS)):
        check_precision(hcd, "float8")
