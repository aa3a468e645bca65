"""Entry point of the ``torchfl`` command.

Subcommand modules are imported here, but each keeps torch and numba imports inside its
command functions, so ``torchfl --help`` and ``torchfl hcd validate`` start in well under
half a second. Click (not typer) is used for that reason: it is the smaller import.
"""

from __future__ import annotations

import importlib
import os

# pydantic scans every installed distribution for plugins on first model build (~40 ms);
# torchfl uses none, and the CLI's cold start is a budget (< 0.5 s).
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

import click  # noqa: E402

from torchfl.cli.quiet import silence_import_noise  # noqa: E402

# at import, not only in main(): the worker processes `kernels warmup` and the demo spawn run
# the console script again as their __mp_main__ (so they import this module, never call main())
# and import transformers, whose torchao logs "Failed to load ..." lines 230-280 columns wide
silence_import_noise()

# (module, attribute, parent group or None for the root)
_COMMANDS = (
    ("torchfl.cli.hcd_cmd", "hcd", None),
    ("torchfl.cli.registry_cmd", "registry", None),
    ("torchfl.cli.system_cmd", "system", None),
    ("torchfl.cli.support_cmd", "COMMANDS", "registry"),
    ("torchfl.cli.plan_cmd", "plan", None),
    ("torchfl.cli.whatif_cmd", "COMMANDS", "plan"),
    ("torchfl.cli.demo_cmd", "demo", None),
    ("torchfl.cli.kernels_cmd", "kernels", None),
    ("torchfl.cli.conformance_cmd", "conformance", None),
    ("torchfl.cli.fidelity_cmd", "fidelity", None),
    ("torchfl.cli.examples_cmd", "examples", None),
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="torchfl")
def cli() -> None:
    """Run standard PyTorch on AI chips described by HCD files (emulated here)."""


def _attach() -> None:
    for module_name, attr, parent in _COMMANDS:
        module = importlib.import_module(module_name)
        target = cli if parent is None else cli.commands[parent]
        value = getattr(module, attr)
        for command in value if isinstance(value, (list, tuple)) else [value]:
            target.add_command(command)


_attach()


def main() -> None:
    silence_import_noise()
    cli(prog_name="torchfl")


if __name__ == "__main__":
    main()
