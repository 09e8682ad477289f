"""Runs table -> per-cell optima, Pareto frontier, joint-law fit, allocation tables, plots, exports.

Reads only the runs table (DESIGN.md); never imports Ray.
"""
