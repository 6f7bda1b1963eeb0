"""The router's replica list (ROUTER_WORKERS): the one parser, shared with the knob registry
(which cannot import this package: the router reads the registry), so that `sparkserve router`,
its drain and `doctor --fleet` normalise a replica URL alike."""

from sparkserve.knobs.worker_urls import ALLOWED, normalise_worker, parse_workers

__all__ = ["ALLOWED", "normalise_worker", "parse_workers"]
