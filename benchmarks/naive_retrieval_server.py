"""The baseline of retriever_bench.py: Search-R1's retrieval server design, for side-by-side measurement.

One uvicorn worker; a synchronous FastAPI endpoint that encodes and searches each request on its own
(no batching across requests). Same index, same query encoder dtype, same schema as the Serve deployment.

    python benchmarks/naive_retrieval_server.py INDEX_DIR PORT [DTYPE]
"""

from __future__ import annotations

import sys

import uvicorn
from fastapi import FastAPI

from rllib_search.serve.retrieval.deployment import RetrieveRequest, passage_to_json
from rllib_search.serve.retrieval.load import load_index


def make_app(index_dir: str, dtype: str | None = None) -> FastAPI:
    index = load_index(index_dir, dtype=dtype)
    app = FastAPI()

    @app.post("/retrieve")
    def retrieve(request: RetrieveRequest) -> dict:
        results = index.search(request.queries, request.topk)
        return {"result": [[passage_to_json(p, request.return_scores) for p in ps] for ps in results]}

    return app


if __name__ == "__main__":
    uvicorn.run(
        make_app(sys.argv[1], sys.argv[3] if len(sys.argv) > 3 else None),
        host="127.0.0.1",
        port=int(sys.argv[2]),
        workers=1,
        log_level="warning",
    )
