"""Terminal text hygiene shared by the console, the executor and compare (imports nothing of the runner)."""

from __future__ import annotations

import re

# terminal control: CSI / OSC / other ESC sequences, C0/C1 control characters but tab and newline,
# and the Unicode bidi controls (LRM/RLM, ALM, embeddings/overrides U+202A-E, isolates U+2066-9),
# which reorder what a terminal shows: "PASS" can be made to read as something else
CONTROL = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])?"
                     r"|[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
