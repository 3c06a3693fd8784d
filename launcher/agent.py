"""``python -m launcher.agent``: the per-node agent's old path, on command lines in the wild."""
from launcher.node.agent import main

if __name__ == "__main__":
    raise SystemExit(main())
