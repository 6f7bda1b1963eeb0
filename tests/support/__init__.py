"""Helpers for end-to-end tests against a real vLLM CPU server."""
