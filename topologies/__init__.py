"""Sites, links, link-emulation backends, host processes and teardown.

A topology is a Mininet ``Topo`` (the vocabulary users know); :mod:`topologies.network`
realises it with named network namespaces, veth pairs and Linux bridges, and applies
each link's :class:`~topologies.link.LinkSpec` through a registered emulation backend.
"""
