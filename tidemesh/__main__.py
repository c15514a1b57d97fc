from tidemesh.cli.main import main

main()
