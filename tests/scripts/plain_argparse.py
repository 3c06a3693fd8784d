"""A plain argparse script that knows nothing of --local_rank (as most torchrun scripts)."""
import argparse

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
print(parser.parse_args())
