"""nsa-run: a validation runner for Native Sparse Attention kernels."""

from nsa_runner.stage import Option, Stage, StageResult, Status, int_list

__all__ = ["Option", "Stage", "StageResult", "Status", "int_list"]
__version__ = "0.1.0"
