"""Who calls: users and passwords, SAS tokens."""
