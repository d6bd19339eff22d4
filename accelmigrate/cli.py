"""The `accelmigrate` command.

Exit codes (every command):
  0  done, or nothing to do (notes never fail a check)
  1  changes pending (`apply --diff`) or findings (`check`)
  2  usage error, a folder without Python files or that cannot be listed, an
     input that could not be processed, or a codemod that failed on a file
     (AM000)

Start-up costs what the command uses: the commands that run scripts (`run`,
`profile`, `verify`, `slurm`) and the language server are imported only when
invoked (or their help is asked for), and `check` or `apply` of files that no
codemod can touch imports neither LibCST, black nor rich.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

import click

from accelmigrate import __version__

from accelmigrate.codemods import DEFAULT_WORDS, PRESETS, infos
from accelmigrate.engine.config import Config, close_match
from accelmigrate.engine.migrate import CODEMOD_FAILED, UNKNOWN_CODE_IN_CONFIG, FileResult, known_codes, process_files, process_text
from accelmigrate.engine.selection import EXIT_ERROR, UsageError, config_for, plan_for, with_codes
from accelmigrate.files.path_arguments import PathsCommand
from accelmigrate.files.sources import InputError, decode_source, iter_python_files
from accelmigrate.output import lint
from accelmigrate.output.report import Reporter

EXIT_OK, EXIT_PENDING = 0, 1
STDIN = "-"

EXIT_CODES_HELP = """\b
Exit codes:
  0  done, or nothing to do (notes never fail a check)
  1  changes pending (apply --diff) or findings (check)
  2  usage error, a folder without Python files or that
     cannot be listed, an input that could not be
     processed, or a codemod that failed on a file (AM000)"""


class LazyGroup(click.Group):
    """A group whose heavier commands are imported when invoked or when their
    help is asked for: `lazy` maps a name to `module:attribute` and the short
    help the group's own help lists."""

    lazy = {
        "run": ("accelmigrate.launch.runner:run_command", "Run a training script on this machine's GPUs (torchrun when several)."),
        "profile": ("accelmigrate.launch.profiler:profile_command", "Profile a few training steps of a script: where its time goes."),
        "verify": ("accelmigrate.launch.verify:verify_command", "Check that the migrated script trains as the original does."),
        "server": ("accelmigrate.server.serve:server_command", "Language server over stdio: findings and fixes in an editor."),
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *(name for name in self.lazy if self._known(name))})

    def _known(self, name: str) -> bool:
        """Whether a lazy command's module exists (found, not imported)."""
        module = self.lazy[name][0].partition(":")[0]
        try:
            return importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            return False

    def get_command(self, ctx: click.Context, name: str) -> Optional[click.Command]:
        command = super().get_command(ctx, name)
        if command is not None or name not in self.lazy:
            return command
        target = self.lazy[name][0]
        module, _, attribute = target.partition(":")
        try:
            command = getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError) as error:
            raise click.ClickException(f"the `{name}` command is not available here ({target}: {error})") from None
        self.add_command(command, name)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands' list, the lazy ones by their stored help (nothing imported)."""
        rows = []
        for name in self.list_commands(ctx):
            if name in self.lazy and name not in self.commands:
                rows.append((name, self.lazy[name][1]))
                continue
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(formatter.width - 6 - max(len(n) for n in self.list_commands(ctx)))))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


import importlib.util  # noqa: E402 (LazyGroup's find_spec)


@click.group(cls=LazyGroup, epilog=EXIT_CODES_HELP, context_settings={"help_option_names": ["-h", "--help"]})
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
        walked = iter_python_files(
            [path], [*config.exclude, *exclude], on_error=lambda *e: problems.append(e), on_skip=reporter.note,
            respect_gitignore=config.respect_gitignore,
        )
        found = [str(p) for p in walked]
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
    from accelmigrate.engine.cache import cache_folder

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
        reporter.results_json(results, shown, plan if check else None)
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


def paths_argument(*, required: bool):
    return click.argument("paths", nargs=-1, required=required, type=click.Path(readable=False))  # reading says why not


common_options = [
    click.option(
        "--stdin-filename", metavar="PATH",
        help="With PATH `-`: the name of the text read from stdin (for the configuration, the messages, notebooks).",
    ),
    click.option(
        "--select", multiple=True, metavar="CODES",
        help="Only these finding codes, or prefixes (AM1, AM501), comma-separated; replaces the config's `select`.",
    ),
    click.option(
        "--ignore", multiple=True, metavar="CODES",
        help="Never these codes or prefixes (added to the config's `ignore`); the longer prefix wins over --select. "
        "apply leaves what they would fix alone.",
    ),
    click.option("--exclude", multiple=True, metavar="GLOB", help="Skip files or folders matching GLOB (repeatable)."),
    click.option(
        "--config", "config_file", metavar="FILE",
        help="Read [tool.accelmigrate] from FILE instead of the nearest pyproject.toml.",
    ),
    click.option("--jobs", "-j", type=click.IntRange(1), default=None, help="Worker processes (default: CPU count)."),
    format_option("text", "json", "github", "sarif"),
    click.option("--no-cache", is_flag=True, help="Neither read nor write the result cache (.accelmigrate_cache/)."),
    click.option("--show-notes", is_flag=True, help="Also show notes: findings that need no action (they never fail)."),
    click.option(
        "--no-follow-imports", "only_named", is_flag=True,
        help="Only the files named: not the modules of the project that they import (by default migrated with them).",
    ),
]

SKIP_HELP = """\b
Skip marks (comments in the file):
  # accelmigrate: skip               this line: every code
  # accelmigrate: skip[AM101,AM201]  this line: these codes
  # accelmigrate: skip-file          the whole file, no codemod runs
  # accelmigrate: skip-file[AM101]   these codes anywhere in the file
  # noqa: AM101                      as skip[AM101] (its AM codes only)
A mark naming an unknown code is reported (AM002), and a code of a mark
that silenced nothing (AM004); an unknown code in select, ignore or
per-file-ignores of [tool.accelmigrate] too (AM003)."""


def _config_findings(config: Config) -> dict[str, list]:
    """Codes in [tool.accelmigrate] that name no code (AM003), as findings of pyproject.toml."""
    if config.path is None:
        return {}
    known = known_codes()
    unknown = [(code, key) for code, key in config.codes().prefixes() if not code or not any(k.startswith(code.upper()) for k in known)]
    if not unknown:
        return {}
    from accelmigrate.codemods import Finding

    try:
        lines = config.path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        lines = []
    found = []
    for code, key in unknown:
        line, column = next(
            ((n, text.index(f'"{code}"') + 1) for n, text in enumerate(lines, 1) if f'"{code}"' in text), (1, 1)
        )
        found.append(Finding(line, column, UNKNOWN_CODE_IN_CONFIG, f"[tool.accelmigrate] {key}: unknown code {code!r}{close_match(code.upper(), known)}; see `accelmigrate list`", False, ""))
    return {str(config.path): sorted(found)}


def _from_stdin(name: str, plan, config: Config, *, check_only: bool) -> FileResult:
    """The text on stdin, processed as a file named `name` (never read or written)."""
    data = sys.stdin.buffer.read()
    try:
        source = decode_source(Path(name), data)
    except InputError as error:
        return FileResult(name, error=str(error))
    silenced = config.codes().silenced(name, known_codes())
    result = process_text(
        name, source.text, plan, check_only=check_only, black_config=config.black, line_length=config.line_length, silenced=silenced,
        runtime=config.runtime,
    )
    result.encoding = source.encoding  # what the migrated text is written back in (its coding line's, a BOM kept)
    return result


def _stdin_paths(paths: Sequence[str], stdin_filename: Optional[str]) -> Optional[str]:
    """The name of stdin's text when PATHS is `-`; None for files."""
    if STDIN not in paths:
        if stdin_filename is not None:
            raise UsageError("--stdin-filename goes with the path `-` (the text read from stdin)")
        return None
    if len(paths) != 1:
        raise UsageError("`-` (read stdin) cannot be given with other paths")
    return stdin_filename or STDIN


def with_common_options(*, paths_required: bool = True):
    """The options of apply and check, after their PATHS argument: required
    by apply (a rewrite of the whole folder is asked for by naming it), not by
    check, which checks the current folder as ruff does."""

    def decorate(function):
        for option in reversed([paths_argument(required=paths_required), *common_options]):
            function = option(function)
        return function

    return decorate


@main.command(cls=PathsCommand, epilog=EXIT_CODES_HELP + "\n\n" + SKIP_HELP)
@with_common_options()
@click.option("--to", "words", metavar="WORDS", help=f"Comma-separated codemods (default: {','.join(DEFAULT_WORDS)}). See `accelmigrate list`.")
@click.option("--diff", "dry_run", is_flag=True, help="Write nothing; print the unified diff. Exit 1 when anything would change.")
@click.option("--show-fixes", is_flag=True, help="Also list each change made, at its line.")
@click.option(
    "--runtime", is_flag=True,
    help="Import the small helpers from accelmigrate.runtime instead of writing their plain definitions into the file (the script then needs accelmigrate; `runtime = true` in [tool.accelmigrate] sets it).",
)
def apply(paths, stdin_filename, select, ignore, exclude, config_file, jobs, output_format, no_cache, show_notes, only_named, words, dry_run, show_fixes, runtime) -> None:
    """Rewrite PATHS (files or folders) in place with the chosen codemods.
    With PATH `-`, read stdin and print the migrated text to stdout (the
    findings and the summary go to stderr)."""
    reporter = Reporter()
    stdin_name = _stdin_paths(paths, stdin_filename)
    config = with_codes(config_for([stdin_name] if stdin_name not in (None, STDIN) else ([] if stdin_name else paths), config_file), select, ignore)
    config.runtime = config.runtime or runtime
    plan = plan_for(words, config, DEFAULT_WORDS)
    if stdin_name is not None:
        _apply_stdin(stdin_name, plan, config, reporter, dry_run=dry_run, show_notes=show_notes, output_format=output_format)
    files, folder_errors = _files(paths, exclude, config, reporter)
    results = _run(
        files, plan, reporter, jobs=jobs, write=not dry_run, black_config=config.black, line_length=config.line_length,
        cache_folder=_cache_folder(config, no_cache), codes=config.codes(),
        follow_imports=not only_named, exclude=[*config.exclude, *exclude], runtime=config.runtime,
    )
    left = {r.path: lint.reported(r.findings, path=r.path, config=config, show_notes=show_notes, unfixed_only=True) for r in results}
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
        reporter.results_json(results, {r.path: lint.reported(r.findings, path=r.path, config=config, show_notes=show_notes) for r in results})
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


def _apply_stdin(name: str, plan, config: Config, reporter: Reporter, *, dry_run: bool, show_notes: bool, output_format: str) -> None:
    """`apply -`: the migrated text on stdout (or, with --diff, the diff), the
    findings left and the summary on stderr; on an error nothing on stdout."""
    result = _from_stdin(name, plan, config, check_only=False)
    left = lint.reported(result.findings, path=name, config=config, show_notes=show_notes, unfixed_only=True)
    if output_format == "json":
        reporter.results_json([result], {name: lint.reported(result.findings, path=name, config=config, show_notes=show_notes)})
    elif result.error is None:
        if dry_run:
            if result.changed:
                reporter.diff(result)
        else:
            reporter.write_bytes(result.migrated.encode(result.encoding))
    from accelmigrate.output.report import finding_line

    for finding in left:
        reporter.note(finding_line(name, finding, check=False, plan=plan))
    if reporter.errors([result]) or _codemod_failures([result]):
        sys.exit(EXIT_ERROR)
    reporter.note(f"{1 if result.changed else 0} file(s) {'would change' if dry_run else 'changed'} (stdin)")
    sys.exit(EXIT_PENDING if dry_run and result.changed else EXIT_OK)


@main.command(cls=PathsCommand, epilog=EXIT_CODES_HELP + "\n\n" + SKIP_HELP)
@with_common_options(paths_required=False)
@click.option("--to", "words", metavar="WORDS", help=f"Only these codemods (default: {','.join(DEFAULT_WORDS)}, as apply).")
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when there are findings (errors still exit 2).")
def check(paths, stdin_filename, select, ignore, exclude, config_file, jobs, output_format, no_cache, show_notes, only_named, words, exit_zero) -> None:
    """Report what to act on in PATHS (default: the current folder), writing
    nothing (for CI and pre-commit). A fixable finding is marked [*], with the
    command that fixes it. PATH `-` reads the file's text from stdin (name it
    with --stdin-filename)."""
    paths = paths or (".",)
    reporter = Reporter()
    stdin_name = _stdin_paths(paths, stdin_filename)
    config = with_codes(config_for([stdin_name] if stdin_name not in (None, STDIN) else ([] if stdin_name else paths), config_file), select, ignore)
    plan = plan_for(words, config, DEFAULT_WORDS)
    if stdin_name is not None:
        files, folder_errors = [], 0
        results = [_from_stdin(stdin_name, plan, config, check_only=True)]
    else:
        files, folder_errors = _files(paths, exclude, config, reporter)
        results = _run(
            files, plan, reporter, jobs=jobs, check_only=True, cache_folder=_cache_folder(config, no_cache), codes=config.codes(),
            follow_imports=not only_named, exclude=[*config.exclude, *exclude],
        )
    shown = {r.path: lint.reported(r.findings, path=r.path, config=config, show_notes=show_notes) for r in results}
    extra = {path: lint.reported(found, path=path, config=config) for path, found in _config_findings(config).items()}
    shown.update({path: found for path, found in extra.items() if found})
    _report(reporter, output_format, results, shown, plan, check=True)
    unreadable = reporter.errors(results)
    failures = _codemod_failures(results)
    failing = [f for found in shown.values() for f in lint.failing(found)]
    if output_format == "text":
        reporter.note(_check_summary(results, failing, plan, unreadable, show_notes, shown) + failures)
    pending = EXIT_PENDING if failing and not exit_zero else EXIT_OK
    sys.exit(EXIT_ERROR if unreadable or folder_errors or failures else pending)


def _check_summary(results, failing, plan, errors: int, show_notes: bool, shown=None) -> str:
    """`3 finding(s) in 2 of 5 file(s) checked ([*] 2 fixable with `accelmigrate
    apply --to workers`)`, and what could not be checked: a file that was not
    read never counts as one without findings."""
    checked = sum(1 for r in results if not r.error)
    parts = []
    if failing:
        with_findings = sum(1 for r in results if lint.failing(shown[r.path] if shown is not None else r.findings))
        parts.append(f"{len(failing)} finding(s) in {with_findings} of {checked} file(s) checked")
        fixable = [f for f in failing if f.fixed]
        if fixable:
            fixing = {f.word for f in fixable}
            words = ",".join(lint.word_spec(word, plan) for word in infos() if word in fixing)
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
    from accelmigrate.codemods import all_codemods
    from accelmigrate.output.explain import all_entries, presets
    from accelmigrate.output.report import rich_console

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
    reporter.out = rich_console()  # a table, on a terminal or not
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
    from accelmigrate.output.explain import code_entry, codemod_entry, entry_text, page, resolve_name

    cls, code = resolve_name(name)
    if cls is None and code is None:
        raise UsageError(f"no codemod or finding code {name!r}{close_match(name.strip(), [*infos(), *PRESETS]) or close_match(name.strip().upper(), known_codes())}; see `accelmigrate list`")
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
