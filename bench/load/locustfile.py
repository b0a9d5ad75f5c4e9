"""Locust user for bench/load/run.py: back-to-back POST /invocations of one short sentence (a query
embedding, the common serverless request). 503 is counted apart from every other failure. With
BENCH_RETRY_AFTER=honor a user that got 503 waits the answer's Retry-After before its next request (what
a well-behaved client does); with `ignore` it sends the next one at once (the worst case)."""

from __future__ import annotations

import itertools
import json
import os

from locust import FastHttpUser, task

SENTENCES = [
    "how do I reset my password",
    "the quick brown fox jumps over the lazy dog",
    "serverless inference with a cold start at the floor of the stack",
    "what is the refund policy for annual plans",
]
_bodies = itertools.cycle([json.dumps({"inputs": [s]}).encode() for s in SENTENCES])


HONOR = os.environ.get("BENCH_RETRY_AFTER", "honor") == "honor"


class Embedder(FastHttpUser):  # type: ignore[misc]
    pause_s = 0.0

    def wait_time(self) -> float:
        pause, self.pause_s = self.pause_s, 0.0
        return pause

    @task
    def embed(self) -> None:
        with self.client.post(
            "/invocations", data=next(_bodies), headers={"content-type": "application/json"}, catch_response=True
        ) as r:
            if r.status_code == 200:
                r.success()
            elif r.status_code == 503:
                r.failure("busy-503")
                if HONOR:
                    self.pause_s = float(r.headers.get("retry-after") or 1)
            else:
                r.failure(f"other-{r.status_code}")
