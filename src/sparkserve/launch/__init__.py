"""Starting vLLM: every knob's value resolved once (settings), the parts of a start (start_parts:
the checks against this machine, the guard's and the pair watch's commands), vLLM's whole command
(vllm_command) with the known bugs' workarounds, and what shell reads from Python (shell). The
launchers' one step that puts a start together is sparkserve.start."""
