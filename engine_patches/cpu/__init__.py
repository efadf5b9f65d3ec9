"""CPU support for SGLang: a stand-in ``sgl_kernel`` and the torchvision op-schema fix.

Neither is active on a host with a real GPU build (a real ``sgl_kernel`` installed,
a torchvision built for the installed torch).
"""
