"""A running vLLM OpenAI-compatible server, seen from outside: `server` (models, streaming
requests, /metrics over the standard library), `metrics` (Prometheus text and counter deltas),
`checks` (the API, tool-call, reasoning, prefix and speculation checks selftest and verify
judge a server by), `prompts` and `bank` (the workloads bench, tune and stress send) and
`tool` (what the commands that load a server share)."""
