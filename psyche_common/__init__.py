"""What several programs share (layer 2: imports only `coordinator/` and libraries).

    identity        Identity (Ed25519 node key: load, sign, verify)
    wallet          Solana wallet key files, balances (run-manager and client)
    telemetry/      OpenTelemetry providers, exporters, options, metric names
    metrics_schema  ClientMetrics: the JSON a client serves, the run-manager reads
    metrics_source  HttpClientMetricsSource: read that JSON from a client
    run_view        RunSnapshot and build_snapshot(CoordinatorState): the run as shown
    token_files     token-file readers: the sequence index, seeded shuffle, local files
    tcp/            framing, the signed challenge/join handshake, Connection,
                    keep_connected (reconnect with backoff)
    ui/             RunView and the panels both TUIs show
    exit_codes      the client's exit codes the run-manager acts on (refused, new version)
    hub_history     ask_main_history: is a commit on a Hub repository's main branch (the
                    TCP coordinator before applying a report, the client before loading)
    stopping        StopSignals (SIGINT, SIGTERM, SIGHUP -> a clean stop), say, exit_on_signals
                    and exit_after (a stop's deadline): every program stops this way

Nothing is imported here: each program loads only the modules it uses.
"""
