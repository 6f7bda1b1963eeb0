"""`sparkserve llama-benchy`: the community's benchmark (llama-benchy, pinned in the image) run
against the server, joined with what the server's /metrics counted over each of its tests."""
