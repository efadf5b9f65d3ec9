"""Let a CUDA-built torchvision import beside a CPU-only torch.

PyPI's torchvision wheels are CUDA builds; beside a CPU torch its compiled ops fail
to load silently, and ``torchvision/_meta_registrations.py`` then raises
``RuntimeError: operator torchvision::nms does not exist``. Defining the schemas it
registers meta kernels for lets the import succeed; calling those ops still fails
(SGLang never calls them for text models).
"""

from __future__ import annotations

import re
from importlib import metadata

# Schemas as torchvision defines them (torchvision/csrc/ops/nms.cpp).
SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}

_library = None  # keeps the fragment alive for the life of the process


def torchvision_is_cuda_build() -> bool:
    """Read torchvision's build tag (``0.28.0+cu130``) without importing it."""
    try:
        dist = metadata.distribution("torchvision")
    except metadata.PackageNotFoundError:
        return False
    version_file = dist.locate_file("torchvision/version.py")
    try:
        text = version_file.read_text()
    except OSError:
        return False
    match = re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", text)
    return bool(match and "+cu" in match.group(1))


def needed() -> bool:
    """A CUDA torchvision beside a CPU torch: the mismatch this fix is for."""
    if not torchvision_is_cuda_build():
        return False
    import torch

    return torch.version.cuda is None


def apply_if_needed() -> bool:
    """Define the missing schemas once; return True when this process needed them."""
    global _library
    if _library is not None:
        return True
    if not needed():
        return False
    import torch

    _library = torch.library.Library("torchvision", "FRAGMENT")
    for schema in SCHEMAS.values():
        _library.define(schema)
    return True
