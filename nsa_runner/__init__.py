"""nsa-run: a validation runner for Native Sparse Attention kernels."""

from nsa_runner._early import early_interrupts

early_interrupts()  # first: the nsa-run script's Ctrl-C / TERM / HUP from here on (``_early``)

from nsa_runner.stage import Option, Stage, StageResult, Status, int_list  # noqa: E402 - after the handlers

__all__ = ["Option", "Stage", "StageResult", "Status", "int_list"]
__version__ = "0.1.0"
