"""Shared pytest configuration."""
from hypothesis import HealthCheck, settings

# CI runs on 2 shared cores: keep property tests bounded and free of wall-clock deadlines.
settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci")
