"""Locust user for bench/bench_load.py: back-to-back POST /invocations of one short sentence (a query
embedding, the common serverless request). 503 is counted apart from every other failure."""

from __future__ import annotations

import itertools
import json

from locust import FastHttpUser, constant, task

SENTENCES = [
    "how do I reset my password",
    "the quick brown fox jumps over the lazy dog",
    "serverless inference with a cold start at the floor of the stack",
    "what is the refund policy for annual plans",
]
_bodies = itertools.cycle([json.dumps({"inputs": [s]}).encode() for s in SENTENCES])


class Embedder(FastHttpUser):  # type: ignore[misc]
    wait_time = constant(0)

    @task
    def embed(self) -> None:
        with self.client.post(
            "/invocations", data=next(_bodies), headers={"content-type": "application/json"}, catch_response=True
        ) as r:
            if r.status_code == 200:
                r.success()
            elif r.status_code == 503:
                r.failure("busy-503")
            else:
                r.failure(f"other-{r.status_code}")
