"""The SQL both backends share, written once: a :class:`~.dialect.Dialect` says how a backend
spells what differs, and the calls here run over a few primitives each store gives (fetch,
write, run a sequence of steps)."""
