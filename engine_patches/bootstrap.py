"""Installed at interpreter start by ``pdd_testbed.pth`` (written by ``make setup``).

Only adds lazy import hooks (stdlib only, nothing imported eagerly), so an
interpreter that never imports ``sgl_kernel`` or ``torchvision`` pays nothing.
"""

from engine_patches.cpu.import_hooks import install

install()
