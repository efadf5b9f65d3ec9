"""Benchmarks behind the ``make bench*`` targets. Every number they print is measured."""
