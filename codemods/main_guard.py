"""main-guard: the code a flat script runs moves under `if __name__ == "__main__":`.

What it does
    In a script that starts processes or goes through a DataLoader while the
    file is being imported (flat module-level code, or a bare `main()` call
    at the bottom), every module-level statement that runs the script moves
    under `if __name__ == "__main__":`. A script that trains with neither
    keeps its layout: no process it starts imports it again. What a process that
    imports the file needs stays at module level:

    - imports, functions, classes, the docstring, `try: import ...` blocks;
    - constants: names bound to a value that is cheap to compute and changes
      nothing (literals and their containers, arithmetic and conditions over
      constants, names of imports, functions, classes and other constants,
      `lambda`, and calls of a short list of functions that only compute a
      value: `torch.device`, `torch.cuda.is_available`, torchvision
      transforms, `os.path.*`, `os.environ.get`, `pathlib.Path`,
      `functools.partial`, `logging.getLogger`, builtins such as `int`,
      `range`, `dict`), and `if`/`try` blocks of such definitions.
      `device = torch.device("cuda" if torch.cuda.is_available() else
      "cpu")` is a constant; so is a value read from `sys.argv` or the
      environment, which spawned processes inherit. A model, a dataset, an
      optimizer, a file or a writer, `args = parser.parse_args()`, a random
      draw, and anything computed from them are not;
    - process set-up that later imports (and spawned processes) depend on:
      `sys.path` changes, `os.environ` writes, `warnings` filters,
      `matplotlib.use(...)`.

    The guard is a module-level `if`, not a `main()` function, so the names
    it binds stay module globals that the script's functions keep reading.

Order
    `python script.py` runs the same statements in the same order as before.
    A definition that comes after moved code goes above it when neither
    depends on the other (it reads, at import, nothing the moved code sets;
    the moved code neither reads nor sets the name it binds; an import is
    not moved across code that changes `sys.path`, `os.environ`, the working
    folder or warning filters); the usual script then reads: imports and
    definitions, then one guard at the bottom. Where a definition must stay
    after the code above it, that code gets a guard of its own where it
    stands, and the code after the definition another. Set-up statements
    never move. Comments move with the statement below them; moved lines are
    only re-indented (with tabs in a file indented with tabs).

Why
    DataLoader worker processes that are spawned rather than forked (macOS,
    Windows, and Linux from Python 3.14, whose default is forkserver), the
    processes of `mp.spawn` and multiprocessing pools import the main file
    again. Without the guard each of them re-runs the training, or fails
    starting processes of its own while it is still starting. The `workers`
    codemod adds worker processes only to a file with a guard (else AM104).

Example
    Before::

        import torch
        from torch.utils.data import DataLoader

        loader = DataLoader(dataset, batch_size=32, shuffle=True)
        model = Net()

        def train(epoch):
            for x, y in loader:
                ...

        for epoch in range(10):
            train(epoch)

    After::

        import torch
        from torch.utils.data import DataLoader

        def train(epoch):
            for x, y in loader:
                ...

        if __name__ == "__main__":
            loader = DataLoader(dataset, batch_size=32, shuffle=True)
            model = Net()

            for epoch in range(10):
                train(epoch)

Left alone
    - A file whose import only defines things, or only builds loaders
      without going through them (a data module others import with
      `from data import train_loader`: moving the loader would break them).
    - A file that has a guard already. When module-level code outside it
      still starts processes or goes through a loader: AM123, move
      that code into the guard by hand.
    - AM121: a definition that reads, while the file is imported (a default
      argument, a decorator, a base class, a class body, an annotation), a
      name that only the moved code sets: importing the file would fail.
      The file stays unchanged; make the definition read it at call time
      (e.g. a default of None resolved in the function) and migrate again.
    - AM122: a dataset class, or a function handed to a DataLoader or a
      dataset (`collate_fn`, a transform), that reads a module variable only
      the moved code sets, or that is defined inside such code: worker
      processes would not find it. Pass the value in (e.g. to the dataset's
      constructor), then migrate again.
    `# accelmigrate: skip[AM120]` on the first statement to move keeps the
    file as it is.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ._base import Codemod
from ._main_guard.flat_script import FlatScript
from ._main_guard.statements import RUNS


class MainGuard(Codemod):
    word = "main-guard"
    needs_torch = (0, 0)  # plain Python
    plans_in_visit_module = True  # see Codemod: its walk is skipped where it fixes nothing
    summary = 'flat scripts: the code that runs at import goes under `if __name__ == "__main__":` (spawned workers re-import the file)'
    codes = {
        "AM120": 'code that runs at import, outside an `if __name__ == "__main__":` guard',
        "AM121": "a definition reads, while the file is imported, a name that only the script's code sets",
        "AM122": "code that DataLoader workers run reads a module variable that only the script's code sets",
        "AM123": 'code outside the `if __name__ == "__main__":` block starts processes or goes through a loader',
    }
    triggers = ("DataLoader", "backward", "spawn", "Process", "Pool", "start_processes")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._body: Optional[list[cst.BaseStatement]] = None

    def visit_Module(self, node: cst.Module) -> bool:
        self._body = self._migrated_body(FlatScript(node, self.script))
        return False  # nothing below the module is rewritten on its own

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return updated_node if self._body is None else updated_node.with_changes(body=self._body)

    def _migrated_body(self, script: FlatScript) -> Optional[list[cst.BaseStatement]]:
        work = [(s, script.work_of(s)) for s in script.statements if s.kind == RUNS]
        work = [(s, what) for s, what in work if what]
        if not work:
            return None
        if script.guards:
            first, what = work[0]
            self.report(first.node, "AM123", (
                f"this module-level code runs outside the `if __name__ == \"__main__\":` block ({what}): processes "
                "that import the file (spawned DataLoader workers, mp.spawn) would run it again; move it into the "
                "block by hand"
            ))
            return None
        problems = [*script.import_time_problems(), *script.worker_problems()]
        for node, code, message in problems:
            self.report(node, code, message)
        first = next(s for s in script.statements if s.kind == RUNS)
        if problems or not self.fix(first.node, "AM120", _fix_message(work[0][1])):
            return None
        return script.guarded_body()


def _fix_message(what: str) -> str:
    return (
        f"the code that runs the script now runs under `if __name__ == \"__main__\":` ({what}); imports, "
        "functions, classes and constants stay at module level, so processes that import the file (spawned "
        "DataLoader workers, mp.spawn) no longer run it"
    )
