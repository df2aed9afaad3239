"""Built-in check stages, one module each, registered through the entry-point group
``nsa_runner.stages`` in pyproject.toml exactly like a third-party plugin (DESIGN §5)."""
