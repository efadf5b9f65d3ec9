"""The SGLang plugin of pdd-testbed.

Imported only inside SGLang processes (and by tests of the plugin). SGLang loads it
through the ``sglang.srt.plugins`` entry point (``engine_patches.plugin:load``) in
every process it starts. Import hooks that must act before SGLang's own imports
(the ``sgl_kernel`` stand-in, the torchvision fix) are installed earlier, from a
``.pth`` file that ``make setup`` writes into the venv (``engine_patches.bootstrap``).

Keep this file free of imports: the ``.pth`` runs it at every interpreter start.
"""
