"""The FTN18 door: the generator, poll and push services, operations."""
