"""Memory helpers shared by `sparkserve plan`, `guard`, `doctor` and `stress`: the host's
memory (host.py), the GPU_MEM budget rule (budget.py), a checkpoint's config and size
(checkpoint.py), and the KV cache geometry vLLM will build (kv.py)."""
