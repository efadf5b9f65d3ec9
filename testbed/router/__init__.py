"""The request router: an async HTTP proxy that chooses servers per request, relays the
stream, and writes one :class:`reports.records.RequestRecord` per request."""
