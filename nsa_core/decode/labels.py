"""Attribution labels of the decode step (decode-bench shares that add up to 100%).

Every piece of the step runs inside a ``torch.profiler.record_function("nsa::<label>")`` scope
and every decode kernel carries a label (``KERNEL_LABEL``): the one branch it serves (cmp, sel,
win), or "shared" when it serves several (the append feeds all three caches; the sel/win tile
kernel, the combine and the fused kernels serve two or three branches). What no scope or kernel
claims is the caller's "other" (projections, RoPE, gate MLP, output projection). ``label_of``
names the label of a profiler interval: a scope (CPU ops) or a kernel name (CUDA). The scopes
cost nothing inside a CUDA graph and well under a microsecond each when no profiler runs.
"""

from __future__ import annotations

from torch.profiler import record_function

SCOPE = "nsa::"
BRANCH_LABELS = ("cmp", "sel", "win", "shared")

# The compressed pass also writes the logits the selection scores reuse: it is counted as "cmp". The
# five-launch step's _append_cmp_kernel is that pass with the append riding in its chunk 0 (a few rows
# written per (b, g), next to the chunk's reads): "cmp" too.
KERNEL_LABEL = {"_append_kernel": "shared", "_append_cmp_kernel": "cmp", "_cmp_partial_kernel": "cmp",
                "_cmp_probs_kernel": "sel", "_select_kernel": "sel", "_scores_topn_kernel": "sel",
                "_block_scores_kernel": "sel", "_topn_kernel": "sel",
                "_selwin_kernel": "shared", "_combine_kernel": "shared", "_fused_cmp_kernel": "shared",
                "_fused_tiles_kernel": "shared", "_split_cmp_win_kernel": "shared", "_split_sel_kernel": "shared"}


def scope(label: str):
    """``with scope("cmp"): ...`` marks the work inside as that label's."""
    if label not in BRANCH_LABELS:
        raise ValueError(f"unknown attribution label {label!r}; expected one of {BRANCH_LABELS}")
    return record_function(SCOPE + label)


def label_of(name: str) -> str | None:
    """The label of a profiler interval named ``name`` (an ``nsa::`` scope or a decode kernel), or
    None (the caller counts it as "other")."""
    if name.startswith(SCOPE):
        label = name[len(SCOPE):]
        return label if label in BRANCH_LABELS else None
    for kernel, label in KERNEL_LABEL.items():
        if name == kernel or name.startswith((kernel + "_", kernel + "(")):
            return label
    return None
