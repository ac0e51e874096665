"""run_manager package."""
