"""Host ranges as Ansible writes them: `a6k-[01:40]` expanded to names, and names compressed back
into ranges for reading (`gpu-a[01:03] gpu-b7`)."""

from __future__ import annotations

import re
from typing import Sequence

from ddtree_ops.errors import ProfileError

_RANGE = re.compile(r"\[([^\]]*)\]")


def expand(pattern: str, where: str = "") -> list[str]:
    """Ansible host ranges: `a6k-[01:40]` (zero padding kept), `db-[a:f]`, `n[0:10:2]`."""
    m = _RANGE.search(pattern)
    if m is None:
        return [pattern]
    parts = m.group(1).split(":")
    bad = ProfileError([f"{where} host range {pattern!r}: expected [start:end] or [start:end:step], "
                        "e.g. a6k-[01:40]".lstrip()])
    if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
        raise bad
    start, end = parts[0], parts[1]
    try:
        step = int(parts[2]) if len(parts) == 3 else 1
    except ValueError:
        raise bad from None
    if step < 1:
        raise bad
    if start.isdigit() and end.isdigit():
        width = len(start) if start.startswith("0") else 0
        values = [str(i).zfill(width) for i in range(int(start), int(end) + 1, step)]
    elif len(start) == len(end) == 1 and start.isalpha() and end.isalpha():
        values = [chr(c) for c in range(ord(start), ord(end) + 1, step)]
    else:
        raise bad
    if not values:
        raise ProfileError([f"{where} host range {pattern!r} is empty (start after end)".lstrip()])
    head, tail = pattern[:m.start()], pattern[m.end():]
    return [name for v in values for name in expand(head + v + tail, where)]


_NUMBERED = re.compile(r"^(.*?)(\d+)(\D*)$")


def compress(names: Sequence[str]) -> str:
    """The inverse of `expand` for reading: `gpu-a01 gpu-a02 gpu-a03 gpu-b7` -> `gpu-a[01:03] gpu-b7`
    (runs of three or more; order of first appearance kept)."""
    runs: dict[tuple[str, str, int], list[int]] = {}
    order: list[tuple[str, str, int] | str] = []
    for n in names:
        m = _NUMBERED.match(n)
        if m is None:
            order.append(n)
            continue
        digits = m.group(2)
        key = (m.group(1), m.group(3), len(digits))  # same width: zfill gives each name back
        if key not in runs:
            runs[key] = []
            order.append(key)
        runs[key].append(int(digits))
    out: list[str] = []
    for item in order:
        if isinstance(item, str):
            out.append(item)
            continue
        head, tail, width = item
        nums = sorted(set(runs[item]))
        start = prev = nums[0]
        for x in nums[1:] + [None]:  # type: ignore[list-item]
            if x is not None and x == prev + 1:
                prev = x
                continue
            if prev - start >= 2:
                out.append(f"{head}[{str(start).zfill(width)}:{str(prev).zfill(width)}]{tail}")
            else:
                out.extend(f"{head}{str(v).zfill(width)}{tail}" for v in range(start, prev + 1))
            if x is not None:
                start = prev = x
    return " ".join(out)
