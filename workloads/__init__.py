"""Traces, generators, token synthesis, hit-ratio analysis and the Locust replay.

Talks to the router (or a server) over HTTP only; never imports ``testbed``.
"""
