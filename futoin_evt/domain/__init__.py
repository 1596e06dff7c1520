"""The domain's values and rules, shared by every layer; nothing of ours below them but ftn3."""
