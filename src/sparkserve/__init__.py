"""sparkserve: run large hybrid models with vLLM on an NVIDIA DGX Spark."""

__version__ = "0.1.0"
