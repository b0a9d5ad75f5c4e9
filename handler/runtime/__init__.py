"""One function instance: init, invocation, control replies, workers, snapshot hooks, prefetch."""
