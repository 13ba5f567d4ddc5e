"""A stand-in for concurrent.futures.ProcessPoolExecutor that maps in the calling process: for
the benches' small runs end to end, whose monkeypatched traces would not cross into a worker."""

from __future__ import annotations


class InProcessPool:
    """ProcessPoolExecutor's context manager and map, run here, in order."""

    def __init__(self, max_workers: int) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def map(self, fn, jobs):
        return map(fn, jobs)
