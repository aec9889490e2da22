"""A rank that dies as if killed while torch wrote its error file: the file is empty, exit 1."""

import os
import sys

if __name__ == "__main__":
    if os.environ.get("LOCAL_RANK") == "0":
        open(os.environ["TORCHELASTIC_ERROR_FILE"], "w").close()
        sys.exit(1)
