"""The `accelmigrate` command.

Exit codes (every command):
  0  done, or nothing to do (notes never fail a check)
  1  changes pending (`apply --diff`) or findings (`check`)
  2  usage error, a folder without Python files or that cannot be listed, an
     input that could not be processed, or a codemod that failed on a file
     (AM000)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional, Sequence

import click

from accelmigrate import __version__, lint
from accelmigrate.cache import cache_folder
from accelmigrate.codemods import DEFAULT_WORDS, all_codemods
from accelmigrate.config import Config
from accelmigrate.engine import CODEMOD_FAILED, FileResult, process_files
from accelmigrate.explain import all_entries, code_entry, codemod_entry, entry_text, page, presets, resolve_name
from accelmigrate.path_arguments import PathsCommand
from accelmigrate.selection import EXIT_ERROR, UsageError, config_for, plan_for
from accelmigrate.report import Reporter
from accelmigrate.sources import iter_python_files

EXIT_OK, EXIT_PENDING = 0, 1

EXIT_CODES_HELP = """\b
Exit codes:
  0  done, or nothing to do (notes never fail a check)
  1  changes pending (apply --diff) or findings (check)
  2  usage error, a folder without Python files or that
     cannot be listed, an input that could not be
     processed, or a codemod that failed on a file (AM000)"""


@click.group(epilog=EXIT_CODES_HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="accelmigrate")
def main() -> None:
    """Migrate PyTorch training scripts to fast, idiomatic PyTorch, as a reviewable diff."""


def _files(paths: Sequence[str], exclude: Sequence[str], config: Config, reporter: Reporter) -> tuple[list[str], int]:
    """The files to process, and how many folders could not be listed or
    held no Python file (each an error, like a missing path: the other paths
    and folders are still processed)."""
    files: list[str] = []
    problems: list[tuple[str, str]] = []  # (folder, message)
    for path in paths:
        before = len(problems)
        found = [str(p) for p in iter_python_files([path], [*config.exclude, *exclude], on_error=lambda *e: problems.append(e))]
        if not found and len(problems) == before and os.path.isdir(path):
            problems.append((path, f"no Python files found in {path}"))
        files += found
    for folder, message in problems:
        reporter.error(message, path=folder)
    return files, len(problems)


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


def _report(reporter: Reporter, output_format: str, results, shown, plan, *, check: bool) -> None:
    """The findings (and, for json, each file's outcome) in the chosen format."""
    if output_format == "json":
        reporter.results_json(results, shown)
    elif output_format == "github":
        reporter.github(results, shown, plan)
    elif output_format == "sarif":
        reporter.sarif(results, shown, plan)
    else:
        reporter.findings(shown, check=check, plan=plan)


def _could_not_process(errors: int, verb: str) -> str:
    return f"{errors} file{'s' if errors != 1 else ''} could not be {verb}" if errors else ""


FORMAT_HELP = {
    "text": "text",
    "json": "json (every file's outcome, findings and diff)",
    "github": "github (workflow annotations)",
    "sarif": "sarif (SARIF 2.1.0, for code scanning)",
}


def format_option(*formats: str):
    return click.option(
        "--format", "output_format", type=click.Choice(formats), default="text",
        help="; ".join(FORMAT_HELP[f] for f in formats if f != "text") + ".",
    )


common_options = [
    click.argument("paths", nargs=-1, required=True, type=click.Path(readable=False)),  # reading says why not
    click.option("--exclude", multiple=True, metavar="GLOB", help="Skip files or folders matching GLOB (repeatable)."),
    click.option("--jobs", "-j", type=click.IntRange(1), default=None, help="Worker processes (default: CPU count)."),
    format_option("text", "json", "github", "sarif"),
    click.option("--no-cache", is_flag=True, help="Neither read nor write the result cache (.accelmigrate_cache/)."),
    click.option("--show-notes", is_flag=True, help="Also show notes: findings that need no action (they never fail)."),
]


def with_common_options(function):
    for option in reversed(common_options):
        function = option(function)
    return function


@main.command(cls=PathsCommand, epilog=EXIT_CODES_HELP)
@with_common_options
@click.option("--to", "words", metavar="WORDS", help=f"Comma-separated codemods (default: {','.join(DEFAULT_WORDS)}). See `accelmigrate list`.")
@click.option("--diff", "dry_run", is_flag=True, help="Write nothing; print the unified diff. Exit 1 when anything would change.")
@click.option("--show-fixes", is_flag=True, help="Also list each change made, at its line.")
def apply(paths, exclude, jobs, output_format, no_cache, show_notes, words, dry_run, show_fixes) -> None:
    """Rewrite PATHS (files or folders) in place with the chosen codemods."""
    reporter = Reporter()
    config = config_for(paths)
    plan = plan_for(words, config, DEFAULT_WORDS)
    files, folder_errors = _files(paths, exclude, config, reporter)
    results = _run(
        files, plan, reporter, jobs=jobs, write=not dry_run, black_config=config.black, line_length=config.line_length, cache_folder=_cache_folder(config, no_cache)
    )
    left = {r.path: lint.visible(r.findings, show_notes=show_notes, unfixed_only=True) for r in results}
    changed = [r for r in results if r.changed]
    verb = "would change" if dry_run else "changed"
    if output_format == "text":
        if dry_run:
            for result in changed:
                reporter.diff(result)
        if show_fixes:
            reporter.findings({r.path: [f for f in r.findings if f.fixed] for r in changed}, check=False)
        reporter.changed_files(results, verb=verb)
    if output_format == "json":  # a record of what was done too
        reporter.results_json(results, {r.path: lint.visible(r.findings, show_notes=show_notes) for r in results})
    else:
        _report(reporter, output_format, results, left, plan, check=False)
    unreadable = reporter.errors(results)
    manual = sum(len(lint.failing(found)) for found in left.values())
    failures = _codemod_failures(results)
    reporter.note(
        f"{len(changed)} file(s) {verb}, {len(results) - len(changed) - unreadable} unchanged"
        + (f", {_could_not_process(unreadable, 'processed')}" if unreadable else "")
        + (f"; {manual} finding(s) need a manual step" if manual else "")
        + failures
    )
    if unreadable or folder_errors or failures:
        sys.exit(EXIT_ERROR)
    sys.exit(EXIT_PENDING if dry_run and changed else EXIT_OK)


@main.command(cls=PathsCommand, epilog=EXIT_CODES_HELP)
@with_common_options
@click.option("--to", "words", metavar="WORDS", help=f"Only these codemods (default: {','.join(DEFAULT_WORDS)}, as apply).")
def check(paths, exclude, jobs, output_format, no_cache, show_notes, words) -> None:
    """Report what to act on in PATHS, writing nothing (for CI and pre-commit).
    A fixable finding is marked [*], with the command that fixes it."""
    reporter = Reporter()
    config = config_for(paths)
    plan = plan_for(words, config, DEFAULT_WORDS)
    files, folder_errors = _files(paths, exclude, config, reporter)
    results = _run(files, plan, reporter, jobs=jobs, check_only=True, cache_folder=_cache_folder(config, no_cache))
    shown = {r.path: lint.visible(r.findings, show_notes=show_notes) for r in results}
    _report(reporter, output_format, results, shown, plan, check=True)
    unreadable = reporter.errors(results)
    failures = _codemod_failures(results)
    failing = [f for found in shown.values() for f in lint.failing(found)]
    if output_format == "text":
        reporter.note(_check_summary(results, failing, plan, unreadable, show_notes) + failures)
    sys.exit(EXIT_ERROR if unreadable or folder_errors or failures else (EXIT_PENDING if failing else EXIT_OK))


def _check_summary(results, failing, plan, errors: int, show_notes: bool) -> str:
    """`3 finding(s) in 2 of 5 file(s) checked ([*] 2 fixable with `accelmigrate
    apply --to workers`)`, and what could not be checked: a file that was not
    read never counts as one without findings."""
    checked = sum(1 for r in results if not r.error)
    parts = []
    if failing:
        with_findings = sum(1 for r in results if lint.failing(r.findings))
        parts.append(f"{len(failing)} finding(s) in {with_findings} of {checked} file(s) checked")
        fixable = [f for f in failing if f.fixed]
        if fixable:
            fixing = {f.word for f in fixable}
            words = ",".join(lint.word_spec(word, plan) for word in all_codemods() if word in fixing)
            parts[-1] += f" ([*] {len(fixable)} fixable with `accelmigrate apply --to {words}`)"
    elif checked or not errors:
        parts.append(f"no findings in {checked} file(s) checked")
    if errors:
        parts.append(_could_not_process(errors, "checked"))
    notes = lint.hidden_notes(results)
    if notes and not show_notes:
        parts.append(f"{notes} note(s) hidden (--show-notes)")
    return "; ".join(parts)


@main.command("list")
@format_option("text", "json")
def list_codemods(output_format: str) -> None:
    """List the codemods (word, finding codes, summary) and the presets."""
    reporter = Reporter()
    if output_format == "json":
        reporter.json({"default": list(DEFAULT_WORDS), "presets": {k: list(v) for k, v in presets().items()}, "codemods": all_entries()})
        return
    from rich.table import Table

    table = Table(box=None, show_header=True, header_style="bold")
    for column in ("word", "codes", "summary"):
        table.add_column(column)
    for word, cls in all_codemods().items():
        default = " (default)" if word in DEFAULT_WORDS else ""
        codes = ", ".join(code + (" (note)" if code in cls.notes else "") for code in cls.codes)
        table.add_row(word + default, codes, cls.summary)
    reporter.out.print(table)
    if presets():
        reporter.out.print("\npresets (--to NAME):", markup=False)
        for name, words in presets().items():
            reporter.out.print(f"  {name}: {','.join(words)}", markup=False)


@main.command()
@click.argument("name", metavar="CODE|WORD")
@format_option("text", "json")
def explain(name: str, output_format: str) -> None:
    """Show one finding code's entry (AM101), or a codemod's page (workers, accumulate=4)."""
    cls, code = resolve_name(name)
    if cls is None and code is None:
        raise UsageError(f"no codemod or finding code {name!r}; see `accelmigrate list`")
    reporter = Reporter()
    if code is not None:
        entry = code_entry(cls, code)
        if output_format == "json":
            reporter.json(entry)
        else:
            reporter.out.print(entry_text(entry), markup=False)
        return
    if output_format == "json":
        reporter.json({**codemod_entry(cls), "page": page(cls)})
        return
    codes = "\n".join(f"  {c}  {title}" + ("  (note)" if c in cls.notes else "") for c, title in cls.codes.items())
    reporter.out.print(f"{page(cls)}\n\nFinding codes\n{codes}", markup=False)


def _register_commands_that_run_scripts() -> None:
    from accelmigrate.profiler import profile_command
    from accelmigrate.runner import run_command
    from accelmigrate.verify import verify_command

    main.add_command(run_command)
    main.add_command(profile_command)
    main.add_command(verify_command)


_register_commands_that_run_scripts()
