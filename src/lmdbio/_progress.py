"""A one-line progress bar on a terminal's stderr (``lmdbio verify`` and
``lmdbio convert``).  Standard library only."""

import os

__all__ = ["is_terminal", "bar"]


def is_terminal(stream):
    """Whether `stream` (a file object) is a terminal."""
    try:
        return os.isatty(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return False


def bar(write, prog, what):
    """``(show, end)``: ``show(done, total)`` redraws one line through
    ``write(text)`` when the percentage changes; ``end()`` finishes the line
    (when one was drawn)."""
    state = {"shown": False, "last": -1}

    def show(done, total):
        pct = min(100, done * 100 // total) if total else 100
        if pct == state["last"]:
            return
        state["last"] = pct
        state["shown"] = True
        write("\r%s: [%-25s] %3d%% %s %d of %d" % (
            prog, "#" * (pct // 4), pct, what, done, total))

    def end():
        if state["shown"]:
            write("\n")
            state["shown"] = False

    return show, end
