"""Measurement code used by the stages: shared timer (timing.py), flash probe and bench, baselines."""
