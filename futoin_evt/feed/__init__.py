"""The HTTP feed's protocols (FeedAPI v2, ZeroEventHub v1), with no wire in them."""
