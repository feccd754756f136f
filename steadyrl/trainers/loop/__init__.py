"""The on-policy loop every algorithm shares, and its parts."""
