"""`python -m launcher` does what `dslaunch` does."""
from launcher.cli import main

if __name__ == "__main__":
    main()
