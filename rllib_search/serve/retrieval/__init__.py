"""Retrieval: encoders, index building (faiss Flat / HNSW / IVF-PQ, BM25) and loading, the Serve deployment
speaking Search-R1's ``POST /retrieve``, its client, and the ``rllib-search index`` command."""
