"""Entry point SGLang calls in each of its processes (group ``sglang.srt.plugins``).

Everything SGLang must do differently for pdd-testbed is registered from here,
with ``HookRegistry`` where a hook is needed; each hook is tested. Only in servers
the testbed launches (``PDD_TESTBED_PLUGIN=1``): installed into another SGLang
environment, the project patches nothing there.
"""

import os

from engine_patches.cpu.import_hooks import install as install_import_hooks
from protocol.env import Env


def load() -> None:
    """Called by ``sglang.srt.plugins.load_plugins`` once per process."""
    if os.environ.get(Env.PLUGIN) != "1":
        return
    # Already installed by the .pth in a venv set up by make setup; idempotent, and
    # keeps a plain ``pip install`` (without the .pth) working for late imports.
    install_import_hooks()
    from engine_patches import drc_align, idle
    from engine_patches.cpu import decode_attention, extend_attention, fork_start
    from engine_patches.handoff.register import register as register_handoff
    from engine_patches.kv_transfer import prefix_wait
    from engine_patches.kv_transfer.register import register as register_tcp_backend
    from engine_patches.pacing import hook as pacing

    register_tcp_backend()
    prefix_wait.register()  # decode servers with servers.decode_prefix_wait
    idle.register()
    register_handoff()
    drc_align.register()
    extend_attention.register()
    decode_attention.register()
    fork_start.register()  # CPU servers only
    pacing.register()  # only where PDD_PACING is set
