"""One module per ``nsa-run`` command; each exposes ``register(app: typer.Typer)``.

To add a command, write ``nsa_runner/commands/<name>.py`` with ``register`` and add its module
path to ``COMMANDS`` in ``nsa_runner/cli.py`` (one line).
"""
