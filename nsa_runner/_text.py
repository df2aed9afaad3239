"""Terminal text hygiene shared by the console, the executor and compare (imports nothing of the runner)."""

from __future__ import annotations

import re

# terminal control: CSI / OSC / other ESC sequences, and C0/C1 control characters but tab and newline
CONTROL = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])?"
                     r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]")
