"""See the package docstring of refattn."""
