"""A running vLLM OpenAI-compatible server, seen from outside: `server` (models, streaming
requests, /metrics over the standard library), `metrics` (Prometheus text and counter deltas)
and `tool` (what the commands that load a server, `stress` and `bench`, share)."""
