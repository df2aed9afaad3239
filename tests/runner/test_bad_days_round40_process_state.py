"""Bad days, red-team round 40 B40-1 / B40-2, through the CLI: nsa_core's classes were not copied before an adapter's
call, and its tables were compared by identity only. An adapter that rebound ``NSAConfig.num_sel_blocks`` made the next
adapter FAIL, the writer never named; one that added ``NSAConfig.__copy__ = lambda self: self`` undid round 39's cfg
copy (every later part handed the stage's own cfg); one that loosened ``nsa_core.testing.TOLERANCES`` in place made a
wrong adapter PASS decode-bench. Expected: each put back after the adapter's code and named; the next verdicts stand."""

from __future__ import annotations

try:
    from _bad_days import changes_then_checks, put_back_and_named
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import changes_then_checks, put_back_and_named

CHANGES = """
ORIG = {}


def _select(q, k_cmp, cfg):
    import torch
    from nsa_core import functional as F, testing
    from nsa_core.config import NSAConfig

    out = F.select_blocks(q, k_cmp, cfg)
    ORIG.update(num_sel_blocks=NSAConfig.num_sel_blocks, fp32=testing.TOLERANCES[torch.float32],
                names=list(testing.DTYPE_NAMES))
    NSAConfig.num_sel_blocks = lambda self, T: (T + self.l_sel - 1) // self.l_sel + 1  # B40-1a: off by one
    NSAConfig.__copy__ = lambda self: self  # B40-1b: "immutable, so copying is free"
    testing.TOLERANCES[torch.float32] = 0.5  # B40-2: its own tolerance loosened in place
    testing.DTYPE_NAMES.pop(torch.float16)
    return out


from nsa_runner.impls import Impl

IMPL = Impl("r40m", {"select": _select})
"""
CHECKS = """
import sys


def _select(q, k_cmp, cfg):
    import copy
    import torch
    from nsa_core import functional as F, testing
    from nsa_core.config import NSAConfig

    orig = sys.modules["r40_changes"].ORIG
    left = {"num_sel_blocks": NSAConfig.num_sel_blocks is not orig["num_sel_blocks"],
            "__copy__": "__copy__" in vars(NSAConfig), "copy": copy.copy(cfg) is cfg,
            "TOLERANCES": testing.TOLERANCES[torch.float32] != orig["fp32"],
            "DTYPE_NAMES": list(testing.DTYPE_NAMES) != orig["names"]}
    assert not any(left.values()), f"left: {sorted(k for k, v in left.items() if v)}"
    return F.select_blocks(q, k_cmp, cfg)


from nsa_runner.impls import Impl

IMPL = Impl("r40k", {"select": _select})
"""


def test_nsa_cores_classes_and_tables_changed_by_an_adapter_are_put_back_and_named(plugins, tmp_path):
    result = changes_then_checks(plugins, tmp_path, "r40", CHANGES, CHECKS)
    put_back_and_named(result, ("nsa_core.config.NSAConfig.num_sel_blocks",
                                "nsa_core.config.NSAConfig.__copy__ (added)",
                                "nsa_core.testing.TOLERANCES (changed in place)",
                                "nsa_core.testing.DTYPE_NAMES (changed in place)"))
    assert "__slotnames__" not in result[2], result[2][-3000:]  # copy.copy(cfg)'s cache on the class: copyreg's


def test_a_part_gets_its_own_cfg_even_where_the_class_says_a_copy_is_itself():
    import dataclasses

    import pytest

    from nsa_runner.impls import Impl, WroteIntoInput, plain_impl

    @dataclasses.dataclass(frozen=True)
    class Cfg:
        n_sel: int = 6

        def __copy__(self):
            return self

    seen = []

    def select(q, k_cmp, cfg):
        seen.append(cfg)
        object.__setattr__(cfg, "n_sel", 4)
        return q

    impl, why = plain_impl(Impl("selfcopy", {"select": select}), "selfcopy")
    assert impl is not None, why
    cfg = Cfg()
    with pytest.raises(WroteIntoInput, match=r"selfcopy's select wrote into its input argument 2 \(n_sel: 6 -> 4\)"):
        impl.parts["select"](1, 2, cfg)
    assert seen[0] is not cfg and cfg.n_sel == 6


def test_later_commands_show_the_newest_and_clip_what_a_hand_edit_made_long():
    """Round 40 U40-2: past 20 later commands into one folder, summary.md / report.html showed the first 20 and hid
    the newest (the ones that made the records shown); a 1 MB ``started`` was written whole."""
    from nsa_runner.results.summary import LATER_SHOWN, later_commands

    ups = [{"argv": ["nsa-run", "stage", f"s{i}"], "started": f"t{i}"} for i in range(LATER_SHOWN + 5)]
    ups[-1]["started"] = "x" * 1_000_000
    lines = later_commands({"updates": ups})
    assert len(lines) == LATER_SHOWN + 1 and lines[0].startswith("... 5 earlier"), lines[:2]
    assert lines[1].startswith("nsa-run stage s5 ") and lines[-1].startswith(f"nsa-run stage s{LATER_SHOWN + 4} ")
    assert max(map(len, lines)) < 200, max(map(len, lines))
