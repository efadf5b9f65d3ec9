"""The ground floor: every shape that crosses a process.

Both sides import this package — the SGLang plugin (``engine_patches``, inside the
server processes) and the harness (``testbed``, ``workloads``, ``reports``) — and it
imports neither. What lives here:

=================  ===========================================================
``frames``         the PDKV frame: header, message types, sync and asyncio codecs
``kv``             bodies of the KV transfer frames (request, chunk, done)
``handoff``        bodies of the token-ID handoff frames (handoff, ready, extended)
``rooms``          bootstrap rooms (dual-path bit) and the rid prefixes PDD uses
``headers``        HTTP headers the router and its clients share
``stream``         the one parser of SGLang's streamed responses (native and OpenAI)
``env``            environment variables the testbed sets on servers
``names``          roles, pipelines and handoff modes
``records``        the JSON-lines records (requests, transfers, handoffs, passes)
``metrics``        metric names, labels and percentiles
=================  ===========================================================
"""
