"""Bad days, red-team round 2 (issue 16): plugin text printed to the terminal (description, option
help and choices, reasons) is plain text: rich markup such as ``[/]`` is printed literally (it crashed
``list m`` / ``stage m --help`` with a MarkupError), escape sequences and control characters are
removed, ``:smile:`` stays a word."""

from __future__ import annotations

import pytest

MARKUP = """
from nsa_runner import Option, Stage, StageResult, Status

class M(Stage):
    name, order = "m", 10
    description = ("desc [/] [bold red]x[/bold red] \\x1b]0;pwned\\x07 \\x1b[2J :smile: "
                   "[link=javascript:alert(1)]click[/link]")
    options = (Option("--x", str, help="help [/] \\x1b[31mred :o: [/nope]", choices=("[/]", "\\x1b[1m")),)
    def run(self, ctx):
        return StageResult(Status.PASS, "ok :o: [/] \\x1b[2J")
"""


@pytest.mark.parametrize("args", [("list", "m"), ("stage", "m", "--help"), ("list",)])
def test_plugin_text_is_printed_as_plain_text(plugins, cli, args):
    plugins.make("mk-plugin", "mk_mod", MARKUP, {"m": "mk_mod:M"})
    r = cli(*args, "--device", "cpu")
    assert r.exit_code == 0, r.stdout + r.stderr
    text = r.stdout + r.stderr
    assert "\x1b" not in text and "\x07" not in text
    if args[0] != "list" or len(args) > 1:
        assert "help [/]" in text and "[/nope]" in text and ":smile:" in text
