"""Starting vLLM: every knob's value resolved once (settings), the launchers' plan of a start
(launcher_exports), vLLM's whole command (vllm_command) with the known bugs' workarounds, and
what shell reads from Python (shell)."""
