"""`sparkserve verify`: the server's int8 head, speculation and prefix caching checked against
the plain model on this machine, by restarting it with each setting (docs/VERIFY.md)."""
