from lockdiag.cli import main

main()
