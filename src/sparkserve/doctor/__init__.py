"""`sparkserve doctor` (cli): is this machine ready for a first `docker compose up`, and with
CLUSTER_NODES=2, its end of the pair's link. Its table's row (Check) is cluster.check_row, where
the pair's own checks build it too."""
