"""The memory guard: the monitor that stops vLLM before the machine runs out of memory, its
keeper that restarts it while vLLM runs, its Prometheus textfile, and the emergency stop of a
vLLM tree (stopping) that the guard and the pair watch share."""
