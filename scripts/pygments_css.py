"""Write the code blocks' token colours into chatstream.css, from Pygments' own styles.

rendering.py highlights code with Pygments, which marks each token with a class ("k" for a
keyword, "s2" for a double-quoted string); the colours for those classes are Pygments' "xcode"
style in the light scheme and "github-dark" in the dark one (each token colour reads at 4.5:1 or
more on ``--cs-code-bg``, WCAG AA), scoped to ``.cs-code`` and set inside prefers-color-scheme
media queries. They live between the two marker comments in the "Code blocks and copying"
section of chatstream.css; tests/test_rendering.py checks that they match this script's output.

    python scripts/pygments_css.py          # rewrite them (after changing a style here)
    python scripts/pygments_css.py --check  # exit 1 if chatstream.css differs
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from pygments.formatters import HtmlFormatter
from pygments.token import STANDARD_TYPES

CSS = Path(__file__).resolve().parents[1] / "chatstream/static/chatstream/chatstream.css"
BEGIN = "/* Token colours, written by scripts/pygments_css.py: run it rather than editing them. */"
END = "/* End of the token colours. */"
STYLES = {"light": "xcode", "dark": "github-dark"}
SCOPE = ".cs-code"


def rules(style: str) -> list[str]:
    """``style``'s CSS rules for the classes rendering.py keeps (no other class can occur)."""
    classes = {name for name in STANDARD_TYPES.values() if name}
    lines = HtmlFormatter(style=style).get_token_style_defs(SCOPE)
    return [_HEX.sub(_long_lower_case, line) for line in lines
            if line.split()[1].removeprefix(".") in classes]


# Pygments releases write the same colour differently (#000, #000000, #A5D6FF, #a5d6ff): one
# spelling keeps the output the same for every version the project supports.
_HEX = re.compile(r"#([0-9A-Fa-f]{6}|[0-9A-Fa-f]{3})\b")


def _long_lower_case(match: re.Match[str]) -> str:
    digits = match[1].lower()
    return "#" + (digits if len(digits) == 6 else "".join(digit * 2 for digit in digits))


def generate() -> str:
    """The whole generated region, markers included."""
    lines = [BEGIN]
    for scheme, style in STYLES.items():
        lines.append(f"@media (prefers-color-scheme: {scheme}) {{ /* Pygments' {style} */")
        lines += [f"  {rule}" for rule in rules(style)]
        lines.append("}")
    lines.append(END)
    return "\n".join(lines)


def written(css: str) -> str:
    """The generated region as chatstream.css has it now."""
    return css[css.index(BEGIN):css.index(END) + len(END)]


def main(argv: list[str]) -> int:
    css = CSS.read_text(encoding="utf-8")
    old, new = written(css), generate()
    if "--check" in argv:
        if old != new:
            print(f"{CSS} has other token colours: run {__file__}", file=sys.stderr)
            return 1
        return 0
    CSS.write_text(css.replace(old, new), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
