"""The Kafka door: Kafka's own clients produce and consume the log."""
