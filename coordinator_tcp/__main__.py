"""`python -m coordinator_tcp ...` = `psyche-coordinator ...` (used by the testnet)."""

from coordinator_tcp.cli import main

main()
