"""Coordinator backends of the client: the interface the runtime needs (base.py), TCP
(tcp.py) and Solana (solana.py). Both offer `run(on_state, on_error, stop)` and the typed
port of `coordinator.messages` domain messages (`send_witness`, `send_warmup_witness`,
`send_health_check`, `report_checkpoint`, `report_verification`, `withdraw`); each
encodes its own wire."""
