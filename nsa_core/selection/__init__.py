"""Selection branch: overlap map + top-n + reference (reference.py), scoring.py, Triton attention (attention.py)."""
