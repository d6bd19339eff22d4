"""The calls and names `main-guard` knows: what starts processes, what only
computes a value, what sets up the process, what DataLoader workers run."""

from __future__ import annotations

import libcst as cst

# Calls that start processes which import the main file again.
PROCESS_STARTERS = frozenset(
    {
        "torch.multiprocessing.spawn",
        "torch.multiprocessing.start_processes",
        "torch.multiprocessing.spawn.spawn",
        "torch.multiprocessing.spawn.start_processes",
        "torch.multiprocessing.Process",
        "torch.multiprocessing.Pool",
        "torch.multiprocessing.get_context",
        "multiprocessing.Process",
        "multiprocessing.Pool",
        "multiprocessing.get_context",
        "multiprocessing.pool.Pool",
        "multiprocessing.context.Process",
        "concurrent.futures.ProcessPoolExecutor",
        "concurrent.futures.process.ProcessPoolExecutor",
    }
)

# Calls that only compute a value from their arguments, cheaply: a constant
# made with them may stay at module level.
PURE_CALLS = frozenset(
    {
        "torch.device",
        "torch.cuda.is_available",
        "torch.cuda.device_count",
        "torch.backends.mps.is_available",
        "torch.Size",
        "os.getenv",
        "os.environ.get",
        "os.getcwd",
        "os.cpu_count",
        "pathlib.Path",
        "pathlib.PurePath",
        "functools.partial",
        "collections.namedtuple",
        "typing.NamedTuple",
        "typing.TypeVar",
        "logging.getLogger",
        "re.compile",
        "dataclasses.field",
    }
    | {
        f"builtins.{name}"
        for name in (
            "int", "float", "str", "bool", "bytes", "complex", "tuple", "list", "dict", "set", "frozenset", "len",
            "range", "min", "max", "abs", "round", "sorted", "reversed", "zip", "enumerate", "sum", "any", "all",
            "isinstance", "issubclass", "slice", "divmod", "pow", "chr", "ord", "repr", "format", "object",
        )
    }
)  # fmt: skip
# Those of them whose result cannot be changed in place.
IMMUTABLE_RESULTS = frozenset(
    {
        "torch.device", "torch.cuda.is_available", "torch.cuda.device_count", "torch.backends.mps.is_available",
        "torch.Size", "os.getenv", "os.environ.get", "os.getcwd", "os.cpu_count", "pathlib.Path", "pathlib.PurePath",
    }
    | {
        f"builtins.{name}"
        for name in ("int", "float", "str", "bool", "bytes", "complex", "tuple", "frozenset", "len", "range", "abs",
                     "round", "sum", "chr", "ord", "repr", "format", "isinstance", "issubclass", "any", "all")
    }
)  # fmt: skip
PURE_CALL_PREFIXES = ("torchvision.transforms.", "os.path.", "math.")
# Methods that only compute a value from a constant (`Path(__file__).resolve()`, `"{}".format(n)`).
PURE_METHODS = frozenset(
    {
        "resolve", "absolute", "expanduser", "joinpath", "with_suffix", "with_name", "format", "join", "upper",
        "lower", "strip", "split", "replace", "startswith", "endswith", "get", "keys", "values", "items", "copy",
    }
)  # fmt: skip
# Process set-up that later imports (and spawned workers, which import the file) depend on.
SETUP_CALLS = frozenset(
    {
        "sys.path.append",
        "sys.path.insert",
        "sys.path.extend",
        "os.environ.setdefault",
        "os.environ.update",
        "os.putenv",
        "warnings.filterwarnings",
        "warnings.simplefilter",
        "matplotlib.use",
    }
)
# Process state that imports read, or that set-up changes: an import is not
# moved across code that touches it, nor code that reads it across set-up.
PROCESS_STATE = ("sys.path", "sys.modules", "sys.meta_path", "os.environ", "os.chdir", "os.getenv", "os.putenv",
                 "os.getcwd", "importlib", "site.", "warnings.", "matplotlib.use", "matplotlib.rcParams")  # fmt: skip
# Classes whose instances DataLoader workers use (datasets, samplers).
DATA_PREFIXES = ("torch.utils.data.", "torchvision.datasets.", "torchtext.datasets.", "torchaudio.datasets.")
# Calls whose arguments may end up running in the workers (a transform, a collate_fn).
SENT_TO_WORKERS_PREFIXES = (*DATA_PREFIXES, "torchvision.transforms.")
MODULE_DUNDERS = frozenset({"__file__", "__name__", "__doc__", "__spec__", "__package__", "__builtins__"})
LITERALS = (cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString, cst.Ellipsis)
