"""pdd-testbed orchestration: scenarios, servers per role, the router and the CLI."""
