"""Checkpoints: periodic atomic saves a killed driver resumes from (``periodic.py``), checking a checkpoint
directory before loading it (``check.py``), and export to a Hugging Face directory (``export.py``)."""
