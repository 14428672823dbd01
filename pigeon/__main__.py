from pigeon.cli.main import main

main()
