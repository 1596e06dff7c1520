"""What every door shares: the event stream as plain calls, retention, the archive."""
