"""`sparkserve tune`: the largest memory setting that passes the stress bank on this machine,
and the draft length that serves a workload fastest, each found by restarting the server with
every candidate (docs/TUNING.md)."""
