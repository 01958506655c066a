"""Sweeps and capacity search (``stepplan sweep``, ``stepplan capacity``).

A sweep runs a trace, or several, under many settings: a grid or a list of points read
from a sweep file (``spec.py``), each point keyed by a digest of its trace and
settings and recorded as it finishes (``records.py``), so that a re-run skips the
points done. Points run in this process, in worker processes (``runner.py``) or on Ray
(``ray_runner.py``), all through one pure function of the point, so every runner gives
the same table. ``tradeoff.py`` picks among the points (SLOs, the Pareto front, the best
point per SLO); ``search.py`` finds the largest request-rate scale that meets the SLOs.
The command line (``cli/sweep.py``, ``cli/sweep_run.py``, ``cli/capacity_cmd.py``)
reads the traces and draws the figures.
"""
