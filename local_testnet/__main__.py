from local_testnet.cli import main

main()
