"""Coordinator backends of the client: the interface the runtime needs (base.py), TCP
(tcp.py) and Solana (solana.py). Both offer `run(on_state, on_error, stop)` and
`send(message)`."""
