"""The `accelmigrate` command.

Exit codes (every command):
  0  done, or nothing to do
  1  changes pending (`apply --diff`) or findings (`check`)
  2  usage error, an input that could not be processed, or a codemod
     that failed on a file (AM000)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, Sequence

import click

from accelmigrate import __version__
from accelmigrate.cache import cache_folder
from accelmigrate.codemods import DEFAULT_WORDS, UnknownCodemod, all_codemods, find, parse_words, resolve, words_without_values
from accelmigrate.config import Config, ConfigError, common_start, load_config
from accelmigrate.engine import CODEMOD_FAILED, FileResult, plan_of, process_files
from accelmigrate.report import Reporter
from accelmigrate.sources import iter_python_files

EXIT_OK, EXIT_PENDING, EXIT_ERROR = 0, 1, 2

EXIT_CODES_HELP = """\b
Exit codes:
  0  done, or nothing to do
  1  changes pending (apply --diff) or findings (check)
  2  usage error, an input that could not be processed,
     or a codemod that failed on a file (AM000)"""


class UsageError(click.UsageError):
    exit_code = EXIT_ERROR


@click.group(epilog=EXIT_CODES_HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="accelmigrate")
def main() -> None:
    """Migrate PyTorch training scripts to fast, idiomatic PyTorch, as a reviewable diff."""


def _config_for(paths: Sequence[str]) -> Config:
    try:
        return load_config(common_start(paths))
    except ConfigError as error:
        raise UsageError(str(error)) from None


def _plan(words: Optional[str], config: Config, default: Sequence[str]):
    spec = words if words is not None else (config.to if config.to is not None else list(default))
    try:
        return plan_of(resolve(parse_words(spec), config.options))
    except UnknownCodemod as error:
        raise UsageError(str(error)) from None


def _files(paths: Sequence[str], exclude: Sequence[str], config: Config) -> list[str]:
    files = [str(p) for p in iter_python_files(paths, [*config.exclude, *exclude])]
    return files


def _cache_folder(config: Config, no_cache: bool) -> Optional[Path]:
    """`.accelmigrate_cache` at the project root (the folder of the nearest
    pyproject.toml, else the current one), unless --no-cache."""
    if no_cache:
        return None
    return cache_folder(config.path.parent if config.path is not None else Path.cwd())


def _codemod_failures(results: Sequence[FileResult]) -> str:
    """The summary's clause for files where a codemod failed (AM000): that
    codemod changed nothing there, which must not pass for success."""
    failed = sum(1 for r in results if any(f.code == CODEMOD_FAILED for f in r.findings))
    return f"; a codemod failed on {failed} file(s) ({CODEMOD_FAILED}) and migrated nothing there" if failed else ""


def _run(files: list[str], plan, reporter: Reporter, *, jobs: Optional[int], **kwargs) -> list[FileResult]:
    """Process files, with a progress bar on a terminal when there are many."""
    if not (reporter.err.is_terminal and len(files) > 20):
        return process_files(files, plan, jobs=jobs, **kwargs)
    from rich.progress import Progress

    with Progress(console=reporter.err, transient=True) as progress:
        task = progress.add_task("migrating" if kwargs.get("write") else "checking", total=len(files))
        return process_files(files, plan, jobs=jobs, on_done=lambda _: progress.advance(task), **kwargs)


common_options = [
    click.argument("paths", nargs=-1, required=True, type=click.Path()),
    click.option("--exclude", multiple=True, metavar="GLOB", help="Skip files or folders matching GLOB (repeatable)."),
    click.option("--jobs", "-j", type=click.IntRange(1), default=None, help="Worker processes (default: CPU count)."),
    click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", help="Output format."),
    click.option("--no-cache", is_flag=True, help="Neither read nor write the result cache (.accelmigrate_cache/)."),
]


def with_common_options(function):
    for option in reversed(common_options):
        function = option(function)
    return function


@main.command(epilog=EXIT_CODES_HELP)
@with_common_options
@click.option("--to", "words", metavar="WORDS", help=f"Comma-separated codemods (default: {','.join(DEFAULT_WORDS)}). See `accelmigrate list`.")
@click.option("--diff", "dry_run", is_flag=True, help="Write nothing; print the unified diff. Exit 1 when anything would change.")
def apply(paths, exclude, jobs, output_format, no_cache, words, dry_run) -> None:
    """Rewrite PATHS (files or folders) in place with the chosen codemods."""
    reporter = Reporter()
    config = _config_for(paths)
    plan = _plan(words, config, DEFAULT_WORDS)
    files = _files(paths, exclude, config)
    results = _run(
        files, plan, reporter, jobs=jobs, write=not dry_run, black_config=config.black, cache_folder=_cache_folder(config, no_cache)
    )
    if output_format == "json":
        reporter.json(results)
    elif dry_run:
        for result in results:
            if result.changed:
                reporter.diff(result)
    changed = [r for r in results if r.changed]
    left = sum(1 for r in results for f in r.findings if not f.fixed)
    if output_format == "text":
        reporter.findings(results, unfixed_only=True, fixable_hint=False)
    errors = reporter.errors(results)
    verb = "would change" if dry_run else "changed"
    failures = _codemod_failures(results)
    reporter.note(
        f"{len(changed)} file(s) {verb}, {len(results) - len(changed) - errors} unchanged"
        + (f", {errors} could not be processed" if errors else "")
        + (f"; {left} finding(s) need a manual step" if left else "")
        + failures
    )
    if errors or failures:
        sys.exit(EXIT_ERROR)
    sys.exit(EXIT_PENDING if dry_run and changed else EXIT_OK)


@main.command(epilog=EXIT_CODES_HELP)
@with_common_options
@click.option("--to", "words", metavar="WORDS", help="Only these codemods (default: every codemod that needs no =value).")
def check(paths, exclude, jobs, output_format, no_cache, words) -> None:
    """Report findings in PATHS without writing anything (for CI and pre-commit)."""
    reporter = Reporter()
    config = _config_for(paths)
    plan = _plan(words, config, words_without_values())
    files = _files(paths, exclude, config)
    results = _run(files, plan, reporter, jobs=jobs, check_only=True, cache_folder=_cache_folder(config, no_cache))
    if output_format == "json":
        reporter.json(results)
        count = sum(len(r.findings) for r in results)
    else:
        count = reporter.findings(results, unfixed_only=False, fixable_hint=True)
    errors = reporter.errors(results)
    failures = _codemod_failures(results)
    if output_format == "text":
        fixable = sum(1 for r in results for f in r.findings if f.fixed)
        reporter.note(
            f"{count} finding(s) in {len(results)} file(s)"
            + (f", {fixable} fixable with `accelmigrate apply`" if fixable else "")
            + failures
        )
    sys.exit(EXIT_ERROR if errors or failures else (EXIT_PENDING if count else EXIT_OK))


@main.command("list")
def list_codemods() -> None:
    """List the codemods: word, finding codes, summary."""
    from rich.table import Table

    table = Table(box=None, show_header=True, header_style="bold")
    for column in ("word", "codes", "summary"):
        table.add_column(column)
    for word, cls in all_codemods().items():
        default = " (default)" if word in DEFAULT_WORDS else ""
        table.add_row(word + default, ", ".join(cls.codes), cls.summary)
    Reporter().out.print(table)


@main.command()
@click.argument("name", metavar="CODE|WORD")
def explain(name: str) -> None:
    """Show the documentation of a codemod, by word or finding code."""
    cls = find(name)
    if cls is None:
        raise UsageError(f"no codemod or finding code {name!r}; see `accelmigrate list`")
    import inspect

    doc = inspect.getdoc(sys.modules[cls.__module__]) or cls.summary
    codes = "\n".join(f"  {code}  {title}" for code, title in cls.codes.items())
    Reporter().out.print(f"{doc}\n\nFinding codes\n{codes}", markup=False)


def _register_commands_that_run_scripts() -> None:
    from accelmigrate.profiler import profile_command
    from accelmigrate.runner import run_command

    main.add_command(run_command)
    main.add_command(profile_command)


_register_commands_that_run_scripts()
