"""Compressed branch: avg phi, visibility, reference attention (reference.py), flash fold-queries path (fast.py)."""
