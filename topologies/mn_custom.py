"""The testbed's topologies for Mininet's own CLI.

    sudo mn --custom topologies/mn_custom.py --topo two_site \\
        --switch lxbr --controller none --link tc

``--topo two_site,hosts=...`` is not supported by mn's argument parser for dicts; use
the defaults (one host per role) or build from Python. Note that Mininet's TCLink
*ignores* delay/jitter/loss on kernels without netem and rates above 1000 Mbit;
``testbed net up`` refuses instead (see topologies.emulation).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from topologies.topo import TOPOLOGIES  # noqa: E402

topos = dict(TOPOLOGIES)
