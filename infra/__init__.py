"""Hosting and tooling: the local Lambda, the CLI, image and layer helpers. Never imported by the function."""
