"""The client's runtime: the client process (`client.PsycheClient`), the round runner that
owns one round's state, and the ports it drives (`ports`). It speaks the domain messages
of `coordinator.messages` to its backend's typed port, never a backend's wire (an
import-linter contract in pyproject.toml keeps it so). Import the modules themselves:
this package re-exports nothing, so importing one part does not load torch for all."""
