"""Run an unmodified PyTorch script on this engine.

    python -m tinygrad_attn.compat [--memory-report] [--memory-html PATH] SCRIPT [ARGS...]

runs SCRIPT as `__main__` (sys.argv is [SCRIPT, *ARGS], sys.path[0] the script's folder)
with `torch` and every `torch.X` resolved to this engine for the whole process: `torch` is
tinygrad_attn, `torch.nn` the top-level `nn` package, `torch.optim` nn.optim, and so on
(TORCH_MODULES below is the one table). The real PyTorch is never imported, even where it is
installed: a finder placed first on `sys.meta_path` answers every `torch` name, so a leftover
`from torch.nn.parallel import X` cannot load the real one behind the user's back. A name the
engine lacks fails at its import with one line naming it (docs/differences.md lists the gaps).

Launched by `mpiexec -n N python -m tinygrad_attn.compat SCRIPT`, each process gets the
variables torchrun would have set (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), read from
the MPI launcher's own (MPICH's PMI_RANK / PMI_SIZE / MPI_LOCALRANKID, Open MPI's
OMPI_COMM_WORLD_*), so that a script written for torchrun finds itself data-parallel and
its `init_process_group` runs on ta.distributed's MPI backend.

`--memory-report` runs the script inside `ta.memory.profile(source_lines=True)` and prints
the ledger's report when the script ends (also when it raises or calls sys.exit);
`--memory-html PATH` writes the ledger's interactive viewer of the run to PATH. The script's
exit status is the runner's.

The same mapping is available in-process: `with compat.torch_aliased(): import torch`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import os
import re
import runpy
import sys
import traceback
import types

PROG = "tinygrad_attn.compat"
GAPS_DOC = "docs/differences.md"

# torch's module name -> the engine module that stands for it. A `torch.X.Y` not listed is
# found from its nearest listed parent: the attribute Y of the module standing for torch.X if
# that is a module, else its submodule Y (torch.nn.modules.linear -> nn.modules.linear).
TORCH_MODULES = {
    "torch": "tinygrad_attn",
    "torch.nn": "nn",
    "torch.nn.functional": "nn.functional",
    "torch.nn.init": "nn.init",
    "torch.nn.utils": "nn.utils",
    "torch.optim": "nn.optim",
    "torch.autograd": "tinygrad_attn.autograd",
    "torch.cuda": "tinygrad_attn.cuda",
    "torch.utils": "tinygrad_attn.utils",
    "torch.utils.data": "tinygrad_attn.utils.data",
    "torch.backends": "tinygrad_attn.backends",
    "torch.amp": "tinygrad_attn.amp",
    "torch.distributed": "tinygrad_attn.distributed",
}


class MissingTorchName(ModuleNotFoundError):
    """A `torch.X` this engine does not provide."""


def missing_line(torch_name: str) -> str:
    return f"{torch_name} is not provided by tinygrad_attn (what is missing and why: {GAPS_DOC})"


def _import_engine_module(engine_name: str, torch_name: str) -> types.ModuleType:
    try:
        return importlib.import_module(engine_name)
    except ModuleNotFoundError as e:
        # only the module itself (or a parent of it) missing is a gap; an import error
        # inside an existing engine module is a bug and keeps its traceback
        if e.name and (engine_name == e.name or engine_name.startswith(e.name + ".")):
            raise MissingTorchName(missing_line(torch_name), name=torch_name) from None
        raise


def resolve(torch_name: str) -> types.ModuleType:
    """The engine module that stands for `torch_name` ("torch.nn.functional"), or
    MissingTorchName."""
    if torch_name in TORCH_MODULES:
        return _import_engine_module(TORCH_MODULES[torch_name], torch_name)
    parent_name, _, leaf = torch_name.rpartition(".")
    if not parent_name:
        raise MissingTorchName(missing_line(torch_name), name=torch_name)
    parent = resolve(parent_name)  # never sys.modules: it may hold the real torch's modules
    attr = getattr(parent, leaf, None)
    if isinstance(attr, types.ModuleType):
        return attr
    if hasattr(parent, "__path__"):  # a package: its submodule of that name
        return _import_engine_module(f"{parent.__name__}.{leaf}", torch_name)
    raise MissingTorchName(missing_line(torch_name), name=torch_name)


class _AliasLoader(importlib.abc.Loader):
    """Hands the import system an engine module that already exists, under a torch name."""

    def __init__(self, module: types.ModuleType):
        self.module = module
        self.own_spec = getattr(module, "__spec__", None)

    def create_module(self, spec):
        return self.module

    def exec_module(self, module) -> None:
        # the import machinery has just set module.__spec__ to the alias's spec; the module
        # keeps its own (its name, file and loader stay the engine's)
        module.__spec__ = self.own_spec


class TorchFinder(importlib.abc.MetaPathFinder):
    """Answers every `torch` and `torch.*` import with the engine module standing for it."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch" and not fullname.startswith("torch."):
            return None
        module = resolve(fullname)
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(module),
                                              is_package=hasattr(module, "__path__"))


def _torch_entries() -> list[str]:
    return [n for n in sys.modules if n == "torch" or n.startswith("torch.")]


def install() -> TorchFinder:
    """Put the finder first on sys.meta_path (forgetting any torch already imported)."""
    for name in _torch_entries():
        del sys.modules[name]
    finder = TorchFinder()
    sys.meta_path.insert(0, finder)
    return finder


def uninstall(finder: TorchFinder) -> None:
    if finder in sys.meta_path:
        sys.meta_path.remove(finder)
    for name in _torch_entries():
        del sys.modules[name]


@contextlib.contextmanager
def torch_aliased():
    """Inside the block, `import torch` (and every torch.X) gives this engine."""
    saved = {n: sys.modules[n] for n in _torch_entries()}
    finder = install()
    try:
        yield finder
    finally:
        uninstall(finder)
        sys.modules.update(saved)


# ------------------------------------------------------------------------------ the runner
_THIS_FILE = os.path.abspath(__file__)
_CANNOT_IMPORT = re.compile(r"cannot import name '([^']+)' from '([^']+)'")


def _torch_name_of(engine_name: str) -> str | None:
    """The torch module name an engine module was imported under (tinygrad_attn -> torch)."""
    for torch_name in sorted(_torch_entries(), key=len):
        if getattr(sys.modules[torch_name], "__name__", None) == engine_name:
            return torch_name
    return None


def gap_line(exc: ImportError) -> str | None:
    """The one line for an ImportError that is a torch name the engine lacks, else None."""
    if isinstance(exc, MissingTorchName):
        return str(exc)
    m = _CANNOT_IMPORT.search(str(exc))
    if m:
        torch_module = _torch_name_of(m.group(2))
        if torch_module is not None:
            return missing_line(f"{torch_module}.{m.group(1)}")
    return None


def _script_frames(tb, script: str):
    """The traceback from the script's first frame on (the runner's own frames dropped)."""
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != script:
        tb = tb.tb_next
    return tb


def _where(tb) -> str:
    """'script.py:12': the deepest frame of the traceback outside the import machinery and
    this runner (the user's import line)."""
    last = None
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not filename.startswith("<frozen") and os.path.abspath(filename) != _THIS_FILE:
            last = tb
        tb = tb.tb_next
    if last is None:
        return PROG
    return f"{os.path.basename(last.tb_frame.f_code.co_filename)}:{last.tb_lineno}"


def run_script(script: str, args: list[str], keep: list | None = None) -> int:
    """Run `script` as __main__ with torch mapped onto the engine; its exit status. `keep`
    receives the script's globals (or its exception), so that its model and optimizer stay
    alive while a profile of the run is read."""
    keep = [] if keep is None else keep
    script = os.path.abspath(script)
    import nn  # noqa: F401 - imported before sys.path[0] changes to the script's folder

    saved_argv, saved_path0 = sys.argv, sys.path[0]
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(script)
    try:
        with torch_aliased():
            return _run_main(script, keep)
    finally:
        sys.stdout.flush()
        sys.argv, sys.path[0] = saved_argv, saved_path0


def _run_main(script: str, keep: list) -> int:
    try:
        keep.append(runpy.run_path(script, run_name="__main__"))
        return 0
    except SystemExit as e:
        keep.append(e)
        if e.code is None:
            return 0
        if isinstance(e.code, int):
            return e.code
        print(e.code, file=sys.stderr)
        return 1
    except ImportError as e:
        keep.append(e)
        line = gap_line(e)
        tb = _script_frames(e.__traceback__, script)
        if line is None:
            traceback.print_exception(type(e), e, tb)
        else:
            print(f"{_where(tb)}: {line}", file=sys.stderr)
        return 1
    except BaseException as e:  # noqa: BLE001 - the script's own error, as Python prints it
        keep.append(e)
        traceback.print_exception(type(e), e, _script_frames(e.__traceback__, script))
        return 130 if isinstance(e, KeyboardInterrupt) else 1


# torchrun's variable -> the MPI launchers' names for the same number, in order of preference
_MPI_LAUNCHER_ENV = {
    "RANK": ("PMI_RANK", "OMPI_COMM_WORLD_RANK"),
    "WORLD_SIZE": ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"),
    "LOCAL_RANK": ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK"),
    "LOCAL_WORLD_SIZE": ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"),
}


def torchrun_env_from_mpi(environ=None) -> dict:
    """The torchrun variables an MPI launcher implies and `environ` lacks (set by main()).
    Under no launcher, or when torchrun's own are there, nothing."""
    environ = os.environ if environ is None else environ
    if "RANK" in environ or "WORLD_SIZE" in environ:
        return {}
    found = {}
    for name, sources in _MPI_LAUNCHER_ENV.items():
        for src in sources:
            if src in environ:
                found[name] = environ[src]
                break
    if "RANK" not in found or "WORLD_SIZE" not in found:
        return {}
    found.setdefault("LOCAL_RANK", found["RANK"])  # a launcher that names no local rank
    found.setdefault("LOCAL_WORLD_SIZE", found["WORLD_SIZE"])
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog=f"python -m {PROG}",
        description="Run an unmodified PyTorch script with `torch` resolved to tinygrad_attn.")
    p.add_argument("--memory-report", action="store_true",
                   help="print the memory ledger's report of the whole run at exit")
    p.add_argument("--memory-html", metavar="PATH",
                   help="write the ledger's interactive viewer of the run to PATH")
    p.add_argument("script", help="the PyTorch script to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    opts = p.parse_args(argv)
    if not os.path.isfile(opts.script):
        p.error(f"no such script: {opts.script}")
    if opts.memory_html and os.path.dirname(opts.memory_html):
        os.makedirs(os.path.dirname(opts.memory_html), exist_ok=True)
    os.environ.update(torchrun_env_from_mpi())
    if not (opts.memory_report or opts.memory_html):
        return run_script(opts.script, opts.args)

    import tinygrad_attn as ta

    alive = []  # the script's objects, until the ledger has been read
    with ta.memory.profile(source_lines=True) as prof:
        code = run_script(opts.script, opts.args, keep=alive)
    name = os.path.basename(opts.script)
    if opts.memory_report:
        print(f"\n=== memory ledger of {name} ({PROG}) ===")
        print(prof.report())
    if opts.memory_html:
        path = prof.plot_html(opts.memory_html, title=f"{name} under {PROG}")
        print(f"{PROG}: wrote {os.path.abspath(path)}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
