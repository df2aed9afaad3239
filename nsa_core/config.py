"""NSA hyper-parameters (DESIGN §2), validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

PHIS = ("avg", "mlp")
BRANCHES = ("cmp", "slc", "win")  # the three NSA branches, in gate order (Eq. 5); "slc" = selection


@dataclass(frozen=True)
class NSAConfig:
    """Block geometry of Native Sparse Attention.

    l      compression block length          (paper default 32)
    d      compression stride                (16)
    l_sel  selection block length  (l')      (64)
    n_sel  selected blocks incl. 1 initial + 2 local (16)
    w      sliding window                    (512)
    phi    compression function: "avg" (mean, no parameters) or "mlp" (learnable)
    """

    l: int = 32
    d: int = 16
    l_sel: int = 64
    n_sel: int = 16
    w: int = 512
    phi: str = "avg"

    def __post_init__(self) -> None:
        for name in ("l", "d", "l_sel", "n_sel", "w"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"NSAConfig.{name} must be an int, got {type(v).__name__} {v!r}")
            if v <= 0:
                raise ValueError(f"NSAConfig.{name} must be positive, got {v}")
        if self.l % self.d:
            raise ValueError(f"NSAConfig: d must divide l (l={self.l}, d={self.d})")
        if self.l_sel % self.d:
            raise ValueError(f"NSAConfig: d must divide l_sel (l_sel={self.l_sel}, d={self.d})")
        if self.l > self.l_sel:
            raise ValueError(f"NSAConfig: l must be <= l_sel (l={self.l}, l_sel={self.l_sel})")
        if self.n_sel < 3:
            raise ValueError(
                f"NSAConfig.n_sel must be >= 3 (1 initial + 2 local blocks are forced), got {self.n_sel}"
            )
        if self.phi not in PHIS:
            raise ValueError(f"NSAConfig.phi must be one of {PHIS}, got {self.phi!r}")

    # ---- derived geometry -------------------------------------------------------------
    def num_cmp(self, T: int) -> int:
        """Compressed tokens that exist once T raw tokens exist (visible to query T-1)."""
        return 0 if T < self.l else (T - self.l) // self.d + 1

    def num_sel_blocks(self, T: int) -> int:
        """Selection blocks touched by T raw tokens."""
        return (T + self.l_sel - 1) // self.l_sel

    def to_dict(self) -> dict:
        return {"l": self.l, "d": self.d, "l_sel": self.l_sel, "n_sel": self.n_sel, "w": self.w, "phi": self.phi}
