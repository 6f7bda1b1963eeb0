"""`sparkserve fetch`: the launchers' download of the target and the drafter before vLLM starts
(cli), what the Hugging Face cache already holds (cache), and the progress it prints (progress)."""
