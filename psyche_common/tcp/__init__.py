"""The run's TCP connections: length-prefixed frames, the signed challenge/join handshake
(client side `Connection`, server side `accept_join`), and reconnecting with backoff.

    framing      read_frame, write_frame, encode_frame, FrameError, *_MAX_FRAME
    messages     Message, Challenge, Join, Welcome, Heartbeat, ErrorReply, ProtocolError,
                 VersionMismatch, encode, validate_frame, signed_join, join_signing_bytes
    connection   Connection.connect(...), JoinRefused, Backoff, keep_connected,
                 parse_host_port, CONNECTION_ERRORS
    handshake    accept_join, send_fatal, JoinRejected (servers)
    admission    AcceptGate (who may handshake: per-address caps, shedding when full),
                 raise_fd_limit, handshake_pool (servers)
    listener     Listener (a listening socket and its connections)
"""
