"""The one-command local run (layer 5): a coordinator and N clients as processes.

    testnet   Testnet, TestnetOptions, run_headless, client_key, checkpoints_identical
    cli       `psyche-testnet` (python -m local_testnet)
    tui       TestnetApp: the server's and each client's metrics, live
"""
