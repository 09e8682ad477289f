"""``loopscale plan SPEC``: what a sweep will run and roughly how long, without training anything.

Per cell, every feasible width with N_once, N_rec, D and tokens per parameter (the first guess marked) and,
when the sweep trains, the peak learning rates that width's trial will use (``render``); the total FLOPs
(``flops``: each trial spends at most its budget, D = C / F in whole optimizer steps); and a wall-time estimate
of the whole command (``walltime``) from step times measured here in a few seconds (``probe``).
"""
