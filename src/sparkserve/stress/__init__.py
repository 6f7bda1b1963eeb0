"""`sparkserve stress`: load a running vLLM server until its KV pool fills, watch host memory.

Modules: `server` (the OpenAI endpoint and /metrics over the standard library), `metrics`
(Prometheus text and counter deltas), `sampler` (host and GPU memory at a fixed rate),
`plan` (the concurrency bank and request sizes), `verdict`, `plot` and `cli`.
"""
