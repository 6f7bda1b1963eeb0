"""`sparkserve bench`: TTFT cold against warm on a shared prefix, decode speed per stream and in
aggregate at each concurrency for prose, code and agent-style prompts, and the speculative
decoding and prefix-cache figures from the server's own /metrics counters."""
