"""The nasty values the injection tests put in every string field of the spec (issue 13, part 2)."""

from __future__ import annotations

# what no file line can carry: every line break str.splitlines splits on, and the other control characters
LINE_BREAKING = ["a\nExecStartPre=/bin/touch /tmp/pwned", "a\rb", "a\x0bb", "a\x0cb", "a\x1cb", "a\x1db",
                 "a\x1eb", "a\x85b", "a\u2028b", "a\u2029b"]
CONTROL = ["a\x00b", "a\tb", "a\x1bb", "a\x7fb", "a\x9bb"]
REFUSED = LINE_BREAKING + CONTROL
# what the templates must quote for their destination: accepted (or refused by the field's own rule)
QUOTED = ["with space", 'dq"uote', "sq'uote", "dollar$HOME", "brace${HOME}", "subst$(touch /tmp/pwned)",
          "percent%n%%", "back\\slash", "trailing\\", "semi;colon", ";", "Qwen/模型", "emoji🚀", "é\u0301",
          " lead and trail ", "#hash", "!bang", "[x]", "-dash", "&amp"]
NASTY = REFUSED + QUOTED
