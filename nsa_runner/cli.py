"""The ``nsa-run`` typer app. This module only wires commands: one module per command under
``nsa_runner/commands/``, each with ``register(app)``. Adding a command is one line in COMMANDS.
"""

from __future__ import annotations

import importlib

import typer

COMMANDS = (
    "nsa_runner.commands.oneshot",
    "nsa_runner.commands.stage",
    "nsa_runner.commands.list_stages",
    "nsa_runner.commands.compare",
    "nsa_runner.commands.report",
)

app = typer.Typer(
    name="nsa-run",
    help="Validate Native Sparse Attention kernels on this machine and keep the evidence.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("nsa-run")
        except PackageNotFoundError:  # a plain checkout that was never installed
            from nsa_runner import __version__ as v
        print(f"nsa-run {v}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the nsa-run version and exit."),
) -> None:
    """Validate Native Sparse Attention kernels on this machine and keep the evidence."""


for _module in COMMANDS:
    importlib.import_module(_module).register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
