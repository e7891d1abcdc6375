from fedalign.cli import main

main()
