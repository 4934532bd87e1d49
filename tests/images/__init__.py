"""The image store's tests (a package: its conftest and helpers must not shadow tests/conftest.py)."""
