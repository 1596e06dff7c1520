"""What the tests share: waiting, servers and their doors seen from outside, SQL."""
