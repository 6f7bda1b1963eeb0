"""`sparkserve stress`: load a running vLLM server until its KV pool fills, watch host memory.

Modules: `sampler` (host and GPU memory at a fixed rate), `bank` (the concurrency bank and
request sizes), `run`, `verdict`, `plot` and `cli`. The server itself is reached through
sparkserve.client.
"""
