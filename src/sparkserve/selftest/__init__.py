"""`sparkserve selftest`: the launchers, the int8 head, speculation, prefix caching, the API
and the drain checked on this machine with models of the recipe's geometry and no weights
(run.py: the command; models.py: the geometry; cases.py: the starts; the checks are
sparkserve.client.checks, shared with verify)."""
