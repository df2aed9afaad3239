"""Decode: caches + read counters (cache.py), eager step (reference.py), static step (static.py), kernels.py."""
