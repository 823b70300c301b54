"""Stop strings that span a resume: the new engine checks only the text it generates itself."""

from __future__ import annotations


class SpanningStop:
    """Finds a stop string that begins in the text before a resume and ends in the new attempt's.

    Only the earlier text's last `longest - 1` characters can start such a string, and only the new
    text's first `longest - 1` characters can end it: once the attempt's text is that long and was
    checked with enough tokens, `done` is true and the caller drops this (no per-chunk cost after)."""

    def __init__(self, earlier: str, stops: list[str]) -> None:
        self.stops = [stop for stop in stops if len(stop) > 1]
        reach = max((len(stop) for stop in self.stops), default=1) - 1
        self.before = len(earlier)  # characters of the output before this attempt
        self.tail = earlier[-reach:] if reach else ""  # all of it when it is shorter than the reach
        self.reach = reach
        self.done = not self.tail

    def find(self, text: str, may_stop: bool) -> int | None:
        """Where the output's text ends before the spanning stop string (the trim point), or None.

        `text` is the attempt's text so far; `may_stop` is false while min_new_tokens is not met."""
        first = self._first_start(text)
        if first is not None and may_stop:
            return self.before - len(self.tail) + first
        self.done = may_stop and len(text) >= self.reach
        return None

    def completed_in(self, text: str) -> bool:
        """Whether the attempt's `text` already completes a stop string begun before the resume."""
        return self._first_start(text) is not None

    def _first_start(self, text: str) -> int | None:
        """Where, in the earlier text's tail, the first spanning stop string starts, or None."""
        window, edge = self.tail + text[: self.reach], len(self.tail)
        # only an occurrence that starts in the earlier text and ends in this attempt's is ours
        starts = (
            window.find(stop, max(0, edge - len(stop) + 1), edge + len(stop) - 1) for stop in self.stops
        )
        return min((at for at in starts if at >= 0), default=None)
