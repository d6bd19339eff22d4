"""What a command runs: the nearest `[tool.accelmigrate]` and the codemods
chosen by --to, the config or the defaults, as `apply`, `check` and `verify`
all take them (so verify checks the migration that apply writes)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import click

from accelmigrate.codemods import UnknownCodemod, check_exclusions, parse_words, resolve_infos
from accelmigrate.config import Config, ConfigError, common_start, load_config, read_config
from accelmigrate.engine import plan_of

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
