"""Sliding-window branch: reference (reference.py) and its flash fast path (fast.py)."""
