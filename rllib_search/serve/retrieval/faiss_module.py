"""The installed ``faiss`` module, or an error that names the extra which installs it.

faiss comes from one of two extras, never both: ``rllib-search[cpu]`` (faiss-cpu) or, on GPU nodes,
``rllib-search[gpu]`` (faiss-gpu-cu12). Both distributions install the same ``faiss`` module, so the one
pip installs last overwrites the other's files; the retriever's replicas check at start that a replica
given GPUs got the GPU build (``deployment.faiss_gpu_problem``).
"""

from __future__ import annotations

try:
    import faiss
except ModuleNotFoundError as error:  # neither extra installed
    raise ModuleNotFoundError(
        "faiss is not installed: pip install 'rllib-search[cpu]' (faiss-cpu), or on GPU nodes "
        "'rllib-search[gpu]' (faiss-gpu-cu12) in its place (README, Install)"
    ) from error

__all__ = ["faiss"]
