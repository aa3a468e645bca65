from torchfl.cli.main import main

main()
