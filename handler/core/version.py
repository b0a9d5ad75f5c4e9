"""warmstart's version, readable where the project is not installed as a distribution (a Lambda image copies
the code into its task root; `importlib.metadata` would not find it there). pyproject.toml holds the same
string (tests/unit/test_entrypoint.py checks)."""

VERSION = "0.1.0"
