"""Metrics, per-request records, goodput/BCR arithmetic, plots and the HTML report.

Reads run directories only; never imports ``testbed``.
"""
