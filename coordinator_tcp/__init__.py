"""coordinator_tcp package."""
