"""The domain: what the API's routes and the workers do, one module per resource (its layers:
pyproject.toml's import contracts)."""
