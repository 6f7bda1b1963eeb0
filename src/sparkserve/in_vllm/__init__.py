"""What runs inside vLLM's processes: the int8 lm-head plugin (lmhead), the speculative
decoding metrics plugin (spec_metrics), and the API server's middleware (access, draining)."""
