"""Coordinator backends of the client: TCP (client_image/runtime/tcp_backend.py) and
Solana (solana.py). Both offer `run(on_state, on_error, stop)` and `send(message)`."""
