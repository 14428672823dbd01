from pigeon.cli.entry import main

main()
