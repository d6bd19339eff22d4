"""Each line of a rewritten version of a file mapped back to the original's.

The codemods run one after another, each on the previous one's output, and
report findings at lines of the version they read: a finding must point at the
user's line. Lines are matched as difflib matches them (without indentation);
in about linear time for long files with many repeated lines.
"""

from __future__ import annotations

import bisect
import dataclasses
import difflib
from collections import Counter
from typing import Optional, Sequence

from accelmigrate.codemods import Finding


def in_original_lines(
    findings: list[Finding], stage: str, original: str, line_maps: Optional[dict[str, dict[int, int]]] = None
) -> list[Finding]:
    """Findings positioned in an intermediate version of the file, moved to the
    matching lines of the original: a line that an earlier codemod re-indented
    or moved (main-guard puts a flat script's code under its guard) maps to
    its original line, the column shifted by the change of indentation; a line
    that an earlier codemod inserted maps to the original line where it was
    inserted. `line_maps` keeps each version's map for the codemods that
    report on the same version after this one."""
    if not findings:
        return findings
    before, after = lines_of(original), lines_of(stage)
    line_maps = {} if line_maps is None else line_maps
    to_original = line_maps.get(stage)
    if to_original is None:
        to_original = line_maps[stage] = line_map(before, after)
    moved = []
    for finding in findings:
        line = to_original.get(finding.line, finding.line)
        column = finding.column
        if finding.line <= len(after) and line <= len(before) and after[finding.line - 1].strip() == before[line - 1].strip():
            column = max(1, column - _indent_width(after[finding.line - 1]) + _indent_width(before[line - 1]))
        moved.append(dataclasses.replace(finding, line=line, column=column))
    return moved


def line_map(before: list[str], after: list[str]) -> dict[int, int]:
    """Each line of AFTER (1-based) -> its line in BEFORE. Lines are compared
    without their indentation; a line in a changed run whose text occurs once
    among BEFORE's unmatched lines is that line, moved; any other maps to the
    nearest line of the run it replaced (an insertion, to where it was inserted)."""
    stripped_before, stripped_after = [line.strip() for line in before], [line.strip() for line in after]
    opcodes = _line_opcodes(stripped_before, stripped_after)
    unmatched: dict[str, list[int]] = {}
    for tag, i1, i2, _, _ in opcodes:
        if tag != "equal":
            for i in range(i1, i2):
                unmatched.setdefault(stripped_before[i], []).append(i)
    to_original: dict[int, int] = {}
    for tag, i1, i2, j1, j2 in opcodes:
        for offset in range(j2 - j1):
            j = j1 + offset
            candidates = unmatched.get(stripped_after[j], []) if tag != "equal" and stripped_after[j] else []
            if tag == "equal":
                i = i1 + offset
            elif len(candidates) == 1:
                i = candidates[0]
            else:
                i = min(i1 + offset, max(i1, i2 - 1), max(len(before) - 1, 0))
            to_original[j + 1] = i + 1
    return to_original


# difflib compares each line with every equal line of the other side: past
# this many comparisons (a file of a few thousand lines, many of them blank
# or repeated) only the stretches between anchors go through it.
DIFFLIB_COMPARISONS = 200_000


def _line_opcodes(a: Sequence[str], b: Sequence[str]) -> list[tuple[str, int, int, int, int]]:
    """difflib's opcodes (autojunk off) turning lines A into lines B. Where
    difflib would compare too many equal lines, in about linear time: lines
    that occur as often in A as in B anchor the match (the k-th occurrence
    matches the k-th), in the longest run of them in the same order on both
    sides, and difflib aligns only the lines between two anchors."""
    counts_a, counts_b = Counter(a), Counter(b)
    if sum(n * counts_b[line] for line, n in counts_a.items()) <= DIFFLIB_COMPARISONS:
        return difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    blocks: list[tuple[int, int, int]] = []
    i_from = j_from = 0
    for i, j in [*_anchors(a, b, counts_a, counts_b), (len(a), len(b))]:
        blocks += _blocks_between(a, b, i_from, i, j_from, j)
        blocks.append((i, j, 1 if i < len(a) else 0))
        i_from, j_from = i + 1, j + 1
    return _opcodes_of(blocks)


def _anchors(a: Sequence[str], b: Sequence[str], counts_a: Counter, counts_b: Counter) -> list[tuple[int, int]]:
    """(i, j) pairs of equal lines, each line that occurs as often in A as
    in B paired occurrence by occurrence: the longest run in order on both sides."""
    places_b: dict[str, list[int]] = {}
    for j, line in enumerate(b):
        if counts_a[line] == counts_b[line]:
            places_b.setdefault(line, []).append(j)
    seen: Counter = Counter()
    pairs = []
    for i, line in enumerate(a):
        if line in places_b:
            pairs.append((i, places_b[line][seen[line]]))
            seen[line] += 1
    return _longest_increasing_run(pairs)


def _longest_increasing_run(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The longest run of PAIRS (in increasing order of i) whose j increase too."""
    ends: list[int] = []  # ends[n]: the smallest j that ends a run of n + 1
    end_at: list[int] = []  # the pair that ends it
    previous: list[Optional[int]] = []
    for k, (_, j) in enumerate(pairs):
        n = bisect.bisect_left(ends, j)
        previous.append(end_at[n - 1] if n else None)
        if n == len(ends):
            ends.append(j)
            end_at.append(k)
        else:
            ends[n], end_at[n] = j, k
    run = []
    k = end_at[-1] if end_at else None
    while k is not None:
        run.append(pairs[k])
        k = previous[k]
    return run[::-1]


def _blocks_between(a: Sequence[str], b: Sequence[str], i1: int, i2: int, j1: int, j2: int) -> list[tuple[int, int, int]]:
    """difflib's matching blocks of a[i1:i2] and b[j1:j2], after their common head and tail."""
    head = 0
    while i1 + head < i2 and j1 + head < j2 and a[i1 + head] == b[j1 + head]:
        head += 1
    tail = 0
    while i2 - tail > i1 + head and j2 - tail > j1 + head and a[i2 - tail - 1] == b[j2 - tail - 1]:
        tail += 1
    inner = difflib.SequenceMatcher(None, a[i1 + head : i2 - tail], b[j1 + head : j2 - tail], autojunk=False)
    found = [(i1 + head + i, j1 + head + j, n) for i, j, n in inner.get_matching_blocks() if n]
    return [(i1, j1, head), *found, (i2 - tail, j2 - tail, tail)]


def _opcodes_of(blocks: list[tuple[int, int, int]]) -> list[tuple[str, int, int, int, int]]:
    """Opcodes as difflib's get_opcodes makes them from matching blocks
    (in order; the last one empty and at the ends of both sides)."""
    opcodes = []
    i = j = 0
    for block_i, block_j, size in _merged(blocks):
        tag = "replace" if i < block_i and j < block_j else "delete" if i < block_i else "insert" if j < block_j else ""
        if tag:
            opcodes.append((tag, i, block_i, j, block_j))
        if size:
            opcodes.append(("equal", block_i, block_i + size, block_j, block_j + size))
        i, j = block_i + size, block_j + size
    return opcodes


def _merged(blocks: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Adjacent blocks joined, empty ones dropped but the last."""
    merged: list[tuple[int, int, int]] = []
    for i, j, size in blocks[:-1]:
        if size and merged and merged[-1][0] + merged[-1][2] == i and merged[-1][1] + merged[-1][2] == j:
            merged[-1] = (merged[-1][0], merged[-1][1], merged[-1][2] + size)
        elif size:
            merged.append((i, j, size))
    return [*merged, blocks[-1]]


def _indent_width(line: str) -> int:
    return len(line) - len(line.lstrip())


def lines_of(text: str) -> list[str]:
    """Lines as Python numbers them: str.splitlines would also break at form
    feeds and other separators that the tokenizer leaves inside a line."""
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines
