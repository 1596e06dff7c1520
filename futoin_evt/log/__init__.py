"""The one way down for every door: each partition's events and consumers, the streams, and
who may do what (every call made on a user's behalf takes that user); retention, the
archive and the copying into aggregated streams beside them."""
