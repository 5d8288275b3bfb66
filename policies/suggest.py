""" "Did you mean": the closest known word to a mistyped one, for messages about a config."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def suggestion(word: str, choices: Iterable[str]) -> str:
    """Return "; did you mean `x`?" for the closest of `choices` to a mistyped word, or ""."""
    options = sorted(set(choices))
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    if not close:
        folded = {choice.lower().replace("_", "-"): choice for choice in options}
        close = [folded[key]] if (key := word.lower().replace("_", "-")) in folded else []
    return f"; did you mean `{close[0]}`?" if close else ""
