"""The services training calls, on Ray Serve: the retriever (``retrieval/``) and the evidence judge
(``judge/``), what their HTTP faces and clients share (``http/``), joining a cluster (``cluster.py``) and the
``rllib-search serve`` command (``cli.py``)."""
