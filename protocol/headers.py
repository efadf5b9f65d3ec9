"""HTTP request headers the router reads (clients, Locust and the benches send them)."""

from __future__ import annotations

SESSION = "x-session-id"  # a multi-turn session: its turns see each other's cache
TURN = "x-turn"  # the turn's index within its session
REQUEST_ID = "x-request-id"  # the record's id (default: a fresh uuid)
# Experiments and tests pin what the policy would otherwise decide:
PIPELINE = "x-pdd-pipeline"  # P->MD | P->RLD->MD | RLD-only
HANDOFF_AT = "x-pdd-handoff-at"  # hand off at this many eager tokens
HANDOFF_MODE = "x-pdd-handoff-mode"  # one-shot | catch-up
