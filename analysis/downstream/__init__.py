"""Downstream accuracy of kept models (``loopscale evaluate --tasks``) in the analysis: the numbers a trial run
carries (``columns``), accuracies and their intervals over items (``accuracy``), the long table of a runs table
(``table``), the gap to r = 1 at matched compute (``compute``), the shift a recurrence buys at matched loss
(``matched_loss``), what ``loopscale analyze`` reports of them (``report``), and two designs compared at matched
loss (``designs``, for ``loopscale compare``)."""
