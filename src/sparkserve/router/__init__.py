"""N replicas behind vLLM's router (vllm-router): the replica list, the key gate in front of
the router and `sparkserve router` (docs/CLUSTER.md)."""
