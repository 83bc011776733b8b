"""Passage windows for the cross-encoder, chosen by late interaction's token-level similarities.

Late interaction already knows, for every query token, how similar each passage token is. The window of ``width``
consecutive passage tokens whose MaxSim (each query token's best similarity inside the window, summed) is highest
is where the passage answers the query; the cross-encoder then scores only that window. A pair of 20 query and 48
passage pieces costs well under half of a 128-piece pair (the encoder's cost grows with length, attention's
quadratically).
"""

from __future__ import annotations

import numpy as np


def best_window(sims: np.ndarray, width: int) -> tuple[int, int]:
    """The token span ``[start, end)`` of ``min(width, t)`` tokens with the highest windowed MaxSim.

    ``sims``: float [t, q], passage token x query token similarities. Ties go to the earliest window.

    >>> s = np.array([[0.1, 0.0], [0.9, 0.1], [0.2, 0.8], [0.0, 0.1]], dtype=np.float32)
    >>> best_window(s, 2)  # tokens 1 and 2 hold both query tokens' best matches
    (1, 3)
    >>> best_window(s, 10)  # wider than the passage: all of it
    (0, 4)
    """
    t = len(sims)
    if width <= 0:
        raise ValueError(f"window width must be >= 1, got {width}")
    if t <= width:
        return 0, t
    windows = np.lib.stride_tricks.sliding_window_view(np.asarray(sims, dtype=np.float32), width, axis=0)
    score = windows.max(axis=2).sum(axis=1)  # [t - width + 1]: windowed MaxSim per start
    start = int(np.argmax(score))
    return start, start + width


def char_span(offsets: list[tuple[int, int]], content: list[int], start: int, end: int) -> tuple[int, int]:
    """The character span of content tokens ``[start, end)`` of a passage.

    ``offsets``: the tokenizer's (begin, end) character offsets of every token of the encoding; ``content``: the
    positions in it of the content tokens (not [CLS]/[SEP]), in order, i.e. the tokens the stored token vectors
    were made from. ``end`` beyond the encoded tokens (the encoder cut the passage) stops at the last one.

    >>> char_span([(0, 0), (0, 5), (6, 8), (9, 14), (0, 0)], [1, 2, 3], 1, 3)
    (6, 14)
    """
    end = min(end, len(content))
    if start >= end:
        return 0, 0
    return offsets[content[start]][0], offsets[content[end - 1]][1]
