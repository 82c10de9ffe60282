"""The framework's ceiling for :mod:`benchmarks.serving`: a bare FastAPI app on uvicorn
that parses the same request body as ``POST /v1/act`` (an observation of numbers, through
a pydantic model) and answers a constant, with no policy, key, shield or audit.

    python -m benchmarks.serving_ceiling --port 8001 --http h11
"""

from __future__ import annotations

import argparse
import sys

from fastapi import FastAPI
from pydantic import BaseModel

app = FastAPI()


class _Act(BaseModel):
    observation: list[float]
    prev_action: list[float] | None = None
    request_id: str | None = None


@app.post("/v1/act")
async def act(body: _Act) -> dict[str, list[float]]:
    return {"action": [0.0]}


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m benchmarks.serving_ceiling")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--http", default="auto", choices=("auto", "h11", "httptools"),
        help="uvicorn's HTTP parser (auto: httptools when installed, as uvicorn picks)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    uvicorn.run(app, host="127.0.0.1", port=args.port, http=args.http, log_level="warning",
                access_log=False)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
