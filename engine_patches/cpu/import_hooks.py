"""Import hooks that make SGLang importable on a CPU-only host.

Two finders, both stdlib-only until they fire:

* ``sgl_kernel`` — appended at the *end* of ``sys.meta_path``, so it is reached only
  when no real ``sgl_kernel`` is installed. It then serves
  :mod:`engine_patches.cpu.sgl_kernel_standin`. Submodules (``sgl_kernel.scalar_type``
  ...) stay unimportable: SGLang guards those imports with ``except ImportError``
  fallbacks, which must keep working.
* ``torchvision`` — placed first, it only looks: when the installed torchvision is a
  CUDA build beside a CPU torch, it defines the op schemas that torchvision's
  meta registrations expect (see :mod:`engine_patches.cpu.torchvision_fix`) before
  torchvision runs. Otherwise it does nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

STANDIN_ROOT = "sgl_kernel"


class _SglKernelStandinFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``sgl_kernel`` when nothing else can."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != STANDIN_ROOT:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        from engine_patches.cpu import sgl_kernel_standin

        return sgl_kernel_standin.make_module()

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _TorchvisionFixFinder(importlib.abc.MetaPathFinder):
    """Defines missing torchvision op schemas just before torchvision is executed."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torchvision":
            return None
        from engine_patches.cpu import torchvision_fix

        torchvision_fix.apply_if_needed()
        return None  # let the normal finders load torchvision


def _installed(kind: type) -> bool:
    return any(isinstance(f, kind) for f in sys.meta_path)


def install() -> None:
    """Install both finders once per interpreter (idempotent)."""
    if not _installed(_TorchvisionFixFinder):
        sys.meta_path.insert(0, _TorchvisionFixFinder())
    if not _installed(_SglKernelStandinFinder):
        sys.meta_path.append(_SglKernelStandinFinder())


def real_sgl_kernel_installed() -> bool:
    """True when a real ``sgl_kernel`` (not this stand-in) can be imported."""
    for finder in sys.meta_path:
        if isinstance(finder, _SglKernelStandinFinder):
            continue
        find = getattr(finder, "find_spec", None)
        if find is not None and find(STANDIN_ROOT, None) is not None:
            return True
    return False
