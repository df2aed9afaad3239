"""nsa_core: Native Sparse Attention (DeepSeek 2025, arXiv 2502.11089) — the library nsa-run validates."""

from nsa_core import functional
from nsa_core.config import NSAConfig

__all__ = ["NSAConfig", "functional", "NSAAttention"]


def __getattr__(name):  # NSAAttention imports nn modules; keep `import nsa_core` light
    if name == "NSAAttention":
        from nsa_core.module import NSAAttention

        return NSAAttention
    raise AttributeError(name)
