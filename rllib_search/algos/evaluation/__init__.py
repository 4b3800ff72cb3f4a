"""Evaluating a policy: answer scores with bootstrap intervals (``scores.py``), greedy evaluation on a QA set
(``evaluate.py``) and the ``rllib-search eval`` command (``cli.py``)."""
