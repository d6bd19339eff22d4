"""The `Finding` type and the shape of skip marks, without LibCST: the
engine, the reports and the cache read them for files that LibCST never
parses."""

from __future__ import annotations

import dataclasses
from typing import Mapping, Optional

ALL_CODES = None  # a `# accelmigrate: skip` without [CODES] silences every code


@dataclasses.dataclass(frozen=True, order=True)
class Finding:
    """One thing a codemod saw. `fixed`: apply rewrote it (or, in check mode, can)."""

    line: int  # 1-based
    column: int  # 1-based, the same in every mode
    code: str
    message: str
    fixed: bool
    word: str

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


# line number -> the codes silenced on it (ALL_CODES for every code)
Suppressions = Mapping[int, Optional[frozenset]]
