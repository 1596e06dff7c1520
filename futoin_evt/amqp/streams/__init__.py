"""The event log node's parts (:mod:`futoin_evt.amqp.node` routes attaches to them): what an
address names, the consumer groups, durable recovery, and the links that serve producers and
consumers."""
