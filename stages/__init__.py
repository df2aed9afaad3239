"""Built-in check stages, one module each, registered through the entry-point group
``nsa_runner.stages`` in pyproject.toml exactly like a third-party plugin (DESIGN §5).

This folder installs (wheel or editable) as the package ``nsa_run_stages`` — a name no other
project owns — so modules here import each other relatively (``from . import _seed``), never as
``stages.X`` (tests/runner/test_packaging.py checks it).
"""
