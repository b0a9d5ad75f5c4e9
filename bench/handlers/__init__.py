"""Baseline handlers the cold-start benchmark compares warmstart against (never deployed)."""
