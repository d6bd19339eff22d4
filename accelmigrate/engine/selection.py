"""What a command runs: the nearest `[tool.accelmigrate]` and the codemods
chosen by --to, the config or the defaults, as `apply`, `check` and `verify`
all take them (so verify checks the migration that apply writes)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional, Sequence

import click

from accelmigrate.codemods import UnknownCodemod, check_exclusions, parse_words, resolve_infos
from accelmigrate.engine.config import Config, ConfigError, close_match, common_start, load_config, read_config
from accelmigrate.engine.migrate import known_codes, plan_of

EXIT_ERROR = 2


class UsageError(click.UsageError):
    exit_code = EXIT_ERROR


def config_for(paths: Sequence[str], config_file: Optional[str] = None) -> Config:
    """The configuration of `config_file` (--config) where given, else the
    nearest pyproject.toml above the first path."""
    try:
        return read_config(Path(config_file)) if config_file is not None else load_config(common_start(paths))
    except ConfigError as error:
        raise UsageError(str(error)) from None


def plan_for(words: Optional[str], config: Config, default: Sequence[str]):
    """The codemods to run: --to's words, else the config's, else `default`.
    A mistake is reported where it was made: the command line or pyproject.toml."""
    if words is not None:
        spec, source = words, "--to"
    elif config.to is not None:
        spec, source = config.to, f"{config.path}: [tool.accelmigrate] 'to'"
    else:
        spec, source = list(default), "the default words"
    try:
        selected = parse_words(spec)
        if not selected:
            raise UnknownCodemod("names no codemod; see `accelmigrate list`")
        resolved = resolve_infos(selected, config.options)
        check_exclusions(resolved)
        return plan_of(resolved)
    except UnknownCodemod as error:
        raise UsageError(f"{source}: {error}") from None


def codes_given(value: Sequence[str]) -> Optional[list[str]]:
    """Repeatable, comma-separated codes or prefixes, upper-cased (None: not given)."""
    codes = [code.strip().upper() for chunk in value for code in chunk.split(",") if code.strip()]
    return codes if value else None


def with_codes(config: Config, select: Sequence[str], ignore: Sequence[str]) -> Config:
    """The config with --select (replacing its `select`) and --ignore (added
    to its `ignore`); a code or prefix of the command line that names no
    code is a usage error."""
    chosen, ignored = codes_given(select), codes_given(ignore) or []
    if chosen == []:  # `--select ''`: a check that selects nothing would pass having checked nothing
        raise UsageError("--select: names no code; give codes or prefixes (AM1, AM501), or leave --select out for every code")
    known = known_codes()
    for flag, codes in (("--select", chosen or []), ("--ignore", ignored)):
        unknown = [code for code in codes if not any(k.startswith(code) for k in known)]
        if unknown:
            raise UsageError(f"{flag}: unknown code(s) {', '.join(unknown)}{close_match(unknown[0], known)}; see `accelmigrate list`")
    return dataclasses.replace(
        config, select=chosen if chosen is not None else config.select, ignore=[*config.ignore, *ignored]
    )
