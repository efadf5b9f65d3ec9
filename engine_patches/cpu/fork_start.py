"""Start a CPU server's scheduler and detokenizer by fork, not spawn.

SGLang sets the ``spawn`` start method for its subprocesses (``_set_envs_and_config``):
on a GPU a forked child cannot use a CUDA context its parent made. A spawned child
imports SGLang and torch again, though: about 15 s of CPU per process, twice per
server (scheduler and detokenizer). On the 2-core hosts this project runs on, with two
or three servers starting at once, that was most of a deployment's start time.

A CPU server (``SGLANG_USE_CPU_ENGINE=1``) has no CUDA context, and its launcher has
run no torch computation by the time SGLang starts its subprocesses, so a forked child
is safe and inherits the imports: the launcher's start method is switched to ``fork``
just after SGLang set ``spawn``. SGLang's code is unchanged; its children load the
plugins again (idempotent, as in a spawned child). Anything but a CPU server keeps
``spawn``.
"""

from __future__ import annotations

import logging
import multiprocessing
import os

TARGET = "sglang.srt.entrypoints.engine._set_envs_and_config"
LOG_LINE = "CPU server: SGLang's subprocesses start by fork (engine_patches.cpu.fork_start)"


def fork_after_config(result, *args, **kwargs):
    multiprocessing.set_start_method("fork", force=True)
    logging.getLogger(__name__).info(LOG_LINE)
    return result


def register() -> None:
    if os.environ.get("SGLANG_USE_CPU_ENGINE") != "1":
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, fork_after_config, HookType.AFTER)
