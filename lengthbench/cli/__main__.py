from lengthbench.cli import main

main()
