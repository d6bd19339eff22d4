"""Run a training script in this process as `python SCRIPT ARGS` would, for
the probes of `accelmigrate profile` and `accelmigrate verify`.

A probe ends the run early by raising `StopScript` from inside the script (an
optimizer hook): a BaseException, so the script's own `except Exception`
does not swallow it, while its `finally` blocks still run.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from typing import Optional


class StopScript(BaseException):
    """Raised by a probe once it has seen enough of the script."""


def run_script(path: str, script_args: list[str]) -> tuple[str, int, Optional[str]]:
    """Run the script; (status, exit code, traceback text).

    status: "stopped" (a probe ended it), "finished", "exited" (sys.exit with
    a non-zero code), "interrupted" or "failed" (an exception, whose traceback
    from the script's own frame on goes to stderr and is returned)."""
    sys.argv = [path, *script_args]
    sys.path[0] = os.path.dirname(os.path.abspath(path))  # the script's folder, as for `python SCRIPT`
    try:
        runpy.run_path(path, run_name="__main__")
    except StopScript:
        return "stopped", 0, None
    except SystemExit as exit:
        code = exit.code
        if code is None or code == 0:
            return "finished", 0, None
        if not isinstance(code, int):
            print(code, file=sys.stderr)  # what the interpreter does with sys.exit("message")
            return "exited", 1, None
        return "exited", code, None
    except KeyboardInterrupt:
        return "interrupted", 130, None
    except Exception as error:
        error.__traceback__ = _from_frame_of(os.path.abspath(path), error.__traceback__)
        text = "".join(traceback.format_exception(error))
        sys.stderr.write(text)
        return "failed", 1, text
    return "finished", 0, None


def _from_frame_of(path: str, tb):
    """Drop this module's and runpy's frames from a traceback."""
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != path:
        tb = tb.tb_next
    return tb
