"""The findings study: the papers' claims re-checked at CPU scale (``study.py``) and re-checked on another
seed and machine (``check.py``)."""
