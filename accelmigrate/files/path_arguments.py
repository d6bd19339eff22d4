"""Command-line paths that look like options.

A file may be named `-x.py`, or even `--help`: pre-commit passes whatever
files a commit holds after the hook's entry. Such a name must be checked as a
file, never taken for an option (a file named `--help` would turn `check`
into a help screen that exits 0 having checked nothing). So, for the
commands whose arguments are paths:

- every argument after `--` is a path (the hooks' entries end with `--`),
  `-` too (a file of that name, never stdin), except one of the command's
  own options that names no file (not `--help`): pre-commit puts a hook's
  `args:` (such as `[--to, ddp]`) after the entry, before the files;
- before `--`, an argument that is none of the command's options but names
  an existing path is a path;
- any other argument that looks like an option and is none is a usage error
  (exit 2) naming it whole.
"""

from __future__ import annotations

import difflib
import os
from typing import Mapping, Optional

import click


class PathsCommand(click.Command):
    """A click command whose positional arguments are paths, read as above."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, options_then_paths(args, _options(self, ctx), ctx))


def _options(command: click.Command, ctx: click.Context) -> dict[str, click.Option]:
    """Each option name of the command (`--to`, `-j`, `--help`) and its option."""
    return {
        name: param
        for param in command.get_params(ctx)
        if isinstance(param, click.Option)
        for name in (*param.opts, *param.secondary_opts)
    }


def options_then_paths(args: list[str], options: Mapping[str, click.Option], ctx: Optional[click.Context] = None) -> list[str]:
    """ARGS as the options (with their values), `--`, then the paths in the
    order given: what click then reads without taking a path for an option."""
    kept: list[str] = []
    paths: list[str] = []
    tokens = iter(args)
    after_separator = False
    for token in tokens:
        if token == "--" and not after_separator:
            after_separator = True
            continue
        if after_separator:
            if _is_option(token, options) and not _is_eager(token, options) and not os.path.lexists(token):  # a hook's args
                _keep_option(token, tokens, options, kept, ctx)
            else:
                paths.append(f".{os.sep}-" if token == "-" else token)  # after `--`, `-` is a file of that name
        elif token == "-" or not token.startswith("-"):
            paths.append(token)
        elif _is_option(token, options):
            _keep_option(token, tokens, options, kept, ctx)
        elif os.path.lexists(token):
            paths.append(token)
        else:
            close = difflib.get_close_matches(token, [name for name in options if name.startswith("--")])
            raise click.NoSuchOption(token, f"No such option: {token} (and no file of that name)", close, ctx)
    return [*kept, "--", *paths]


def _is_option(token: str, options: Mapping[str, click.Option]) -> bool:
    return token.startswith("-") and token != "-" and (token in options or _is_joined_option(token, options))


def _is_eager(token: str, options: Mapping[str, click.Option]) -> bool:
    """`--help` (or `--version`): after `--`, a file of that name, never a help screen."""
    option = options.get(token.split("=", 1)[0])
    return option is not None and option.is_eager


def _keep_option(token: str, tokens, options: Mapping[str, click.Option], kept: list[str], ctx) -> None:
    """The option `token`, with the value that follows it where it takes one."""
    kept.append(token)
    if token in options and _takes_value(options[token]):
        value = next(tokens, None)
        if value is None:
            raise click.BadOptionUsage(token, f"Option '{token}' requires an argument.", ctx)
        kept.append(value)


def _takes_value(option: click.Option) -> bool:
    return not option.is_flag and not option.count


def _is_joined_option(token: str, options: Mapping[str, click.Option]) -> bool:
    """`--to=ddp`, `-j4`, or short flags written together (`-hj4`); a flag
    given a value (`--diff=1`) too, for click to refuse."""
    if token.startswith("--"):
        return "=" in token and token.split("=", 1)[0] in options
    for position in range(1, len(token)):
        option = options.get("-" + token[position])
        if option is None:
            return False
        if _takes_value(option):
            return True  # the rest of the token is its value
    return True
