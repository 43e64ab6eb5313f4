"""``python -m autoport_cst`` runs the command line interface."""

from autoport_cst.cli import main

if __name__ == "__main__":
    main()
