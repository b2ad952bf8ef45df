from restorepoint._cli import main

main()
