"""Keeping black-formatted files black-formatted, and touching no other style."""

from __future__ import annotations

from typing import Mapping


def _mode(black_config: Mapping):
    import black  # imported only when a changed file needs it

    return black.Mode(
        line_length=int(black_config.get("line-length", black_config.get("line_length", 88))),
        string_normalization=not black_config.get("skip-string-normalization", False),
        magic_trailing_comma=not black_config.get("skip-magic-trailing-comma", False),
    )


def is_black_formatted(source: str, black_config: Mapping) -> bool:
    import black

    try:
        black.format_file_contents(source, fast=True, mode=_mode(black_config))
    except black.NothingChanged:
        return True
    except Exception:  # black cannot format it (e.g. syntax it does not know)
        return False
    return False


def black_format(source: str, black_config: Mapping) -> str:
    import black

    try:
        return black.format_file_contents(source, fast=False, mode=_mode(black_config))
    except black.NothingChanged:
        return source
