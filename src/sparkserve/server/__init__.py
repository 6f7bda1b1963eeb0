"""The server a tool restarts with other settings, then puts back as it was: `driver` (a
launcher on this host, or a Compose service), `restarts` (each restart, interruptible, and the
way back), `driver_options` (the command-line options that choose and reach it). What `tune`
and `verify` share; neither imports the other."""
