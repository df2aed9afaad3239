"""Flash kernels: adapters over SDPA / FA-2 / FA-3 / FA-4 / varlen (adapters.py) and which path
runs a call (pick.py)."""
