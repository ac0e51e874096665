"""The run-manager's subcommands beyond running a client: `solana` (run administration
over JSON-RPC), each module with a `register(app)` that adds its commands to the CLI.
"""
