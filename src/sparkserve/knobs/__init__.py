"""The knobs: the registry of every setting a user can change (registry), and where it is
written out for people (docs: compose, .env.example, the docs tables)."""
