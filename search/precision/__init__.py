"""``loopscale plan SPEC --precision``: how precisely a spec's design will measure phi (and Delta-phi against a
baseline), what it costs, and the cheapest design that reaches a target.

``design`` (the runs the spec's sampler would make, and simulated loss tables at them), ``screen`` (a linearised
ranking of designs), ``candidates`` (the designs the search tries), ``forecast`` (the Monte Carlo forecast and the
search), ``inputs`` (the law, noise and baseline from the command's inputs), ``render`` (the text), ``command``
(the option's checks and run). The statistics of a copy's fit are ``analysis.precision``'s.
"""
