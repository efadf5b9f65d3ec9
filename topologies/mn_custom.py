"""The testbed's topologies for Mininet's own CLI.

Run mn with the venv's interpreter (the topologies need pydantic)::

    sudo .venv/bin/python $(which mn) --custom topologies/mn_custom.py \\
        --topo two_site --switch lxbr --controller none --test pingall

``--topo two_site,hosts=...`` is not supported by mn's argument parser for dicts; use
the defaults (one host per role, an unshaped WAN) or build from Python. A shaped link
is a ``TCLink`` of its own (no ``--link tc`` needed). Mininet's TCLink *ignores*
delay/jitter/loss on kernels without netem and rates above 1000 Mbit (it prints a
warning and goes on); ``testbed net up`` refuses instead (see topologies.emulation).
"""

import inspect
import os
import sys

# mn exec()s this file without __file__; the code object still knows its path.
_here = os.path.abspath(inspect.currentframe().f_code.co_filename)
sys.path.insert(0, os.path.dirname(os.path.dirname(_here)))

from topologies.topo import TOPOLOGIES  # noqa: E402

topos = dict(TOPOLOGIES)
