"""The machinery of nn.modules: each submodule names torch's classes of that file and reads
them from the `nn` namespace on first use (PEP 562), so a class added to nn anywhere appears
under its torch path (`nn.modules.linear.Linear`) with no edit here."""

from __future__ import annotations


def lazy_names(module_name: str, names: tuple[str, ...]):
    """The (__getattr__, __dir__) pair of a submodule whose torch names are `names`."""
    short = module_name.rsplit(".", 1)[-1]

    def __getattr__(name: str):
        if name not in names:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        import nn

        try:
            return getattr(nn, name)
        except AttributeError:
            raise AttributeError(
                f"nn.modules.{short}.{name}: the engine has no nn.{name} yet "
                "(docs/torch-coverage.md lists what nn provides)") from None

    def __dir__():
        import nn

        return sorted(n for n in names if hasattr(nn, n))

    return __getattr__, __dir__
